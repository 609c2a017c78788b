"""The person's rewrites in a round: the replies they wrote, the ones they would have wanted.

A 1-5 score says how good a reply was, not what a better one looks like. When the model never
writes what the person wants (a list, say, from a model that seldom writes one), every rating
is low, the ratings have nothing to contrast, and neither the rating model nor PPO can find
the way. A rewrite shows it. A round reads each one three times:

- as a **rating** of ``REWRITE_SCORE`` (5) for the rewrite's text, a row of the rating model
  (it is the reply the person wanted, so it is what a 5 looks like to them);
- as a **pick** of the rewrite over the turn's own reply, a Bradley-Terry pair of the rating
  model (``reinf.training.pairs``);
- as a **demonstration** in PPO: an episode of the rewrite's tokens, in the group of its
  prompt, rewarded through the person's reward mapper as a 5 (the mapper's metadata has
  ``"rewrite": true``, so a mapper can give it a reward of its own).
  Its behaviour log-probs are the round-start pass's, as a fresh rollout's are
  (``reinf.training.ppo.build_rollout``), so the PPO ratio starts at 1. The episode was not
  sampled from the policy: the clipped update raises its likelihood by at most the clip
  range a step, where its advantage (its reward against the other replies to its prompt) is
  positive, and the KL penalty and the gate hold the adapter near the base as for any
  episode.

The text is encoded with the tokenizer of the model the round trains, at the round, with
the end-of-reply token after it; the store keeps only text, so a rewrite outlives a change of
model. A rewrite whose turn lost its context (an earlier turn was forgotten) is not read, as
such a turn's rating is not.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Sequence

from reinf.records import RewriteSample, Sample

REWRITE_SCORE = 5   # the rating a rewrite stands for: it is the reply the person wanted


@dataclass
class Rewrites:
    """The round's usable rewrites: as samples (score REWRITE_SCORE, the rewrite's tokens) and,
    beside each, the turn's own prompt and reply ids (the other side of its pick)."""
    samples: list[Sample] = field(default_factory=list)
    originals: list[tuple[list[int], list[int]]] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def turn_ids(self) -> set[int]:
        return {s.turn_id for s in self.samples}


def read_rewrites(store, session, *, limit: int, until: datetime | None = None) -> Rewrites:
    """The newest ``limit`` rewrites written by ``until``, encoded for ``session``'s model;
    those it cannot read (no prompt, too long, ...) are counted in ``skipped``."""
    from reinf.model.sampling import eos_token_ids
    from reinf.training.session import unreadable

    out = Rewrites()
    rows: Sequence[RewriteSample] = store.training_rewrites(limit, until=until)
    if not rows:
        return out
    tokenizer = session.loaded.tokenizer
    eos = eos_token_ids(session.policy.model, tokenizer)
    end = [tokenizer.eos_token_id if tokenizer.eos_token_id in eos else min(eos)] if eos else []
    for row in rows:
        ids = list(tokenizer.encode(row.text, add_special_tokens=False)) + end
        why = unreadable(session, row.prompt_ids, ids) or (None if ids else "empty_reply")
        if why:
            out.skipped[why] = out.skipped.get(why, 0) + 1
            continue
        out.samples.append(Sample(
            turn_id=row.turn_id, conversation_id=row.conversation_id,
            turn_index=row.turn_index, user_id=row.user_id,
            prompt=row.prompt, response=row.text, prompt_ids=list(row.prompt_ids),
            reply_ids=ids, logprobs=[], checkpoint_id=None, score=REWRITE_SCORE, tags=[],
            comment="", critical=False, rated_at=row.written_at, created_at=row.written_at,
            temperature=row.temperature if row.temperature > 0 else 1.0, rewrite=True))
        out.originals.append((list(row.prompt_ids), list(row.reply_ids)))
    return out


@dataclass
class Demonstrations:
    """The rewrites as PPO episodes, and those of them the imitation term reads."""
    episodes: list[tuple] = field(default_factory=list)
    imitated: list[tuple] = field(default_factory=list)   # the same tuples, a subset


def demonstrations(config, rewrites: Rewrites, *, now,
                   imitated_before: datetime | None = None) -> Demonstrations:
    """The rewrites as PPO episodes (prompt_ids, reply_ids, None, temperature, reward,
    weight), rewarded through the person's reward mapper and critics as REWRITE_SCORE; one
    the critics' consensus drops is left out, as a rating would be. A broken hook raises
    HookError, as for ratings.

    ``imitated`` is every kept rewrite when ``imitated_before`` is None (the until-likely
    rule, or nothing imitated yet). Under the ``once`` rule the imitation term reads a rewrite
    in the rounds until an adapter that imitated it is the one a round starts from:
    ``imitated_before`` (:func:`imitated_before`) is when the
    round that made that adapter read its data; a rewrite written (or changed) before then is
    in it already, and it stays in the batch as a demonstration, a rating and a pick, but its
    likelihood is not pushed up again (unclipped, round after round, a handful of short
    rewrites is learnt by heart and the model's other text suffers; docs/training.md)."""
    from reinf.rewards.mapper import compute_rewards

    out = Demonstrations()
    if not rewrites.samples:
        return out
    rows = compute_rewards(config, rewrites.samples, now=now,
                           labels=[f"your rewrite of turn {s.turn_id}" for s in rewrites.samples])
    for s, row in zip(rewrites.samples, rows):
        if not row.kept:
            continue
        episode = (s.prompt_ids, s.reply_ids, None, s.temperature, row.reward, row.weight)
        out.episodes.append(episode)
        if imitated_before is None or s.rated_at >= imitated_before:  # rated_at: written at
            out.imitated.append(episode)
    return out


def imitated_before(store, checkpoint_id: str | None) -> datetime | None:
    """When the round that made ``checkpoint_id`` (the adapter a round starts from) began: it
    read every rewrite written before then. None for the base model, or a checkpoint whose
    run is not known (none, or lost in a `reinf db recover`): every rewrite is new to it."""
    from reinf.errors import NotFound

    if checkpoint_id is None:
        return None
    try:
        run_id = store.get_checkpoint(checkpoint_id).run_id
        return store.get_run(run_id).started_at if run_id is not None else None
    except NotFound:
        return None


#: How far above the person's mean rating a reply served in a style must be rated for
#: ``training.imitate_explored`` to imitate it: a 5 from someone whose ratings average 4.7
#: says little about the style it was asked for (docs/training.md, "Exploring styles").
EXPLORED_MARGIN = 0.5


def best_rated_episodes(threshold: int, episodes: list[tuple], samples: list[Sample], *,
                        imitated_before: datetime | None, explored: int = 0,
                        usual: float | None = None) -> list[tuple]:
    """The rated replies the imitation term reads beside the rewrites
    (``training.imitate_rated``): the episodes whose sample (``samples[i]`` is
    ``episodes[i]``'s) the person scored ``threshold`` or higher, none when it is 0; and
    (``training.imitate_explored``) those served in a style (``Sample.styled``) scored
    ``explored`` or higher and, with ``usual`` (the person's mean rating) given, at least
    ``EXPLORED_MARGIN`` above it. With ``imitated_before`` set (the ``once`` rule), only
    those rated since the round that made the adapter began, as for rewrites; the trainer
    asks for the ones served in a style without it, since it imitates those until likely in
    every round whatever the rule.

    Why: a 5 on a reply the model seldom writes (a list, from a model that writes one in one
    reply of fourteen) is the person's strongest signal, and the clipped PPO update raises
    that reply's tokens by at most the clip range a round (+20% for a style it samples at
    7%); imitated, a token the model found unlikely is pushed until it is as likely as the
    model's own tokens (until likely), as a rewrite's is. Off by default: on SmolLM2 one round
    on the two tuning raters moved less the rater's way with it (docs/benchmarks.md). A reply
    served in a style is the case it is for by construction: the instruction made the model
    write what it seldom writes unasked, so as a plain answer it is as far off the model's
    own replies as a rewrite. The margin: from a person who rates nearly everything 5, every
    style collects 5s, and imitating them all pushed the model towards every style at once
    (no-question-back: 18 replies in the sixth round, final KL 0.10 against 0.006 without)."""
    def chosen(s: Sample) -> bool:
        if 0 < threshold <= s.score:
            return True
        return (s.styled and 0 < explored <= s.score
                and (usual is None or s.score >= usual + EXPLORED_MARGIN))

    if threshold <= 0 and explored <= 0:
        return []
    return [e for e, s in zip(episodes, samples, strict=True)
            if chosen(s) and (imitated_before is None or s.rated_at >= imitated_before)]


def rewrite_pairs(rewrites: Rewrites, first_row: int,
                  rows: list[tuple[list[int], list[int]]]) -> list[tuple[int, int, float]]:
    """The rating model's pairs "rewrite over the turn's reply". ``rows``: the (prompt ids,
    reply ids) of every row of the features so far, the rewrite ``i`` being row
    ``first_row + i``; the turn's reply is its row when it has one (it was rated, or picked),
    else a new row appended to ``rows``."""
    index = {(tuple(p), tuple(r)): i for i, (p, r) in enumerate(rows)}
    out = []
    for i, (prompt_ids, reply_ids) in enumerate(rewrites.originals):
        key = (tuple(prompt_ids), tuple(reply_ids))
        if not reply_ids or key == (tuple(rows[first_row + i][0]), tuple(rows[first_row + i][1])):
            continue  # no reply to prefer it to, or the rewrite is the reply as it was
        if key not in index:
            index[key] = len(rows)
            rows.append((list(prompt_ids), list(reply_ids)))
        out.append((first_row + i, index[key], 1.0))
    return out
