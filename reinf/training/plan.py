"""What a round trains on: its mode, as the rating model decides, and its batch in rollout mode.

Stages 1 to 3 of a round (``reinf.training.trainer`` runs them in order; docs/training.md):

- ``plan_round`` (stage 1) fits the person's **rating model** on every rating that is not
  forgotten and on their picks (``reinf.training.rating_model``, ``reinf.training.pairs``);
  its cross-validated Spearman decides the mode: ``rollouts`` once it is trustworthy, else
  ``rated`` (the cold start, and ``training.method: rated``), PPO on the rated replies alone;
- ``collect_rollouts`` (stages 2 and 3, rollout mode only) samples fresh replies from the
  current adapter (``reinf.training.rollouts``), scores them with the rating model and the
  person's reward mapper, and keeps the person's rated replies to the same prompts beside
  them: one group per prompt;
- ``styled_demonstrations`` (rated mode, ``training.imitate_styled``) samples replies in the
  style the person's ratings lift most, for the imitation term.

``usable`` is the one rule for the rated turns the models can read; the gate's measures
(``reinf.training.promotion``) use it too. torch loads inside the functions only.
"""
from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from reinf.training.pairs import PairRows


# --- stage 1: the rating model ----------------------------------------------------------

@dataclass
class RoundPlan:
    mode: str                       # "rollouts" | "rated"
    reason: str                     # why, in words, for `reinf status`
    rating_model: Any               # RatingModel | None
    metrics: dict[str, Any]
    pairs: PairRows = field(default_factory=PairRows)  # the picks the rating model read


def plan_round(config, store, rated, session, report, *, read_at=None,
               rewrites=None) -> RoundPlan:
    """Fit the rating model on the ``rated`` samples (every rating that is not forgotten,
    newest first), the person's rewrites (reinf.training.rewrites: each a rating of 5 and a
    pick over the turn's reply) and their picks (reinf.training.pairs), and decide the mode:
    fresh rollouts once it is trustworthy, else the rated replies alone (the cold start)."""
    from reinf.training.pairs import collect_pairs
    from reinf.training.rewrites import rewrite_pairs
    from reinf.training.rating_model import (PairSet, cross_validated_pair_accuracy,
                                             fit_rating_model, reply_features, spearman_ceiling)
    from reinf.training.session import unreadable

    t = config.training
    if t.method == "rated":
        return RoundPlan("rated", "training.method is rated", None, {})
    report({"stage": "rating_model"})
    started = time.perf_counter()
    written = list(rewrites.samples) if rewrites is not None else []
    rated = [s for s in rated[:t.rating_model_max] if usable(session, s)]
    metrics: dict[str, Any] = {"rating_model_ratings": len(rated),
                               "rating_model_rewrites": len(written)}
    if len(rated) + len(written) < t.min_ratings:
        return RoundPlan("rated", f"cold start: {len(rated) + len(written)} of the "
                         f"{t.min_ratings} ratings the rating model needs "
                         "(training.min_ratings; a rewrite counts as one)", None, metrics)
    # The rewrites are rated rows too (a 5 each), after the ratings. The person's picks join
    # them: their sides are rated rows, or rows of their own; then each rewrite's pick over
    # the turn's reply.
    labelled = rated + written
    picked = collect_pairs(store, labelled, limit=t.rating_model_max, until=read_at,
                           unreadable=lambda p, r: unreadable(session, p, r)) \
        if t.pair_weight > 0 else PairRows()
    rows = [(s.prompt_ids, s.reply_ids) for s in labelled] + picked.sides
    if written and t.pair_weight > 0:
        picked.rows += rewrite_pairs(rewrites, len(rated), rows)
        picked.sides = rows[len(labelled):]
        picked.turn_ids |= rewrites.turn_ids
    features = reply_features(session.policy.model, rows,
                              batch_size=config.ppo.batch_size * 2)
    scores = [s.score for s in labelled]
    seed = config.ppo.seed + session.counters["round"]
    pairs = PairSet.of(picked.rows) if picked.rows else None
    model = fit_rating_model(features, scores, heads=t.rating_heads, seed=seed, pairs=pairs,
                             pair_weight=t.pair_weight)
    accuracy, alone, held = cross_validated_pair_accuracy(
        features, scores, pairs, pair_weight=t.pair_weight, seed=seed) if pairs else \
        (None, None, 0)
    metrics.update(rating_model_consistency=model.consistency,
                   rating_model_consistency_ceiling=spearman_ceiling(scores),
                   rating_model_strength=model.strength,
                   rating_model_pairs=len(picked.rows),
                   rating_model_pair_accuracy=accuracy,
                   rating_model_pair_accuracy_ratings_only=alone,
                   rating_model_pairs_held_out=held,
                   rating_model_pair_scale=model.pair_scale,
                   rating_model_seconds=time.perf_counter() - started)
    if picked.skipped:
        metrics["rating_model_pairs_skipped"] = picked.skipped
    if model.consistency is None:
        return RoundPlan("rated", "cold start: the ratings so far are all the same, so the "
                         "rating model cannot be checked", model, metrics, picked)
    if model.consistency < t.min_consistency:
        return RoundPlan("rated", f"cold start: the rating model's cross-validated Spearman "
                         f"{model.consistency:.2f} is below training.min_consistency "
                         f"{t.min_consistency}", model, metrics, picked)
    return RoundPlan("rollouts", f"the rating model predicts held-out ratings with Spearman "
                     f"{model.consistency:.2f} (>= {t.min_consistency}, {len(rated)} ratings"
                     + (f", {len(written)} rewrites" if written else "")
                     + (f", {len(picked.rows)} picks" if picked.rows else "") + ")",
                     model, metrics, picked)


def usable(session, sample) -> bool:
    """A rated turn the models can read (a reply, and nothing ``unreadable`` about it)."""
    from reinf.training.session import unreadable

    return bool(sample.reply_ids) and unreadable(session, sample.prompt_ids,
                                                 sample.reply_ids) is None


# --- stage 2 and 3: rollouts and their rewards --------------------------------------------

def collect_rollouts(config, session, rating_model, samples, episodes, *, now, seed: int,
                     report, rated=None, imitate_ids: set[int] = frozenset()
                     ) -> tuple[list[tuple], list[int], set[int], dict[str, Any]]:
    """The round's episodes in rollout mode, with their group ids (one group per prompt),
    the ``id`` of those the imitation term reads (``training.imitate_styled``) and the
    stage's metrics.

    Fresh replies are sampled from the current adapter for ``rollout_prompts`` prompts,
    ``rollouts_per_prompt`` each, scored pessimistically by the rating model, and passed
    through the person's reward mapper and critics with their own metadata. The person's
    rated replies to the same prompts stay in the batch with their real score, and so do
    the episodes the imitation term reads (``imitate_ids``: rewrites, the replies
    ``imitate_rated`` / ``imitate_explored`` pick) whose prompts no rollout drew, in groups
    of their own by prompt (``imitated_joined``). ``rated`` (StyleRatings: the person's
    ratings by style) draws the styled replies' styles under ``training.styled_pick:
    ratings`` and gives each style's lift to ``training.imitate_styled``.
    """
    from reinf.rewards.mapper import compute_rewards
    from reinf.training.rating_model import reply_features
    from reinf.training.rollouts import sample_rollouts
    from reinf.training.styles import load_styles, style_lifts, styled_contexts

    t, g = config.training, config.generation
    started = time.perf_counter()
    prompts, text_of, max_new = _rollout_prompts(config, session, samples, seed)
    total = len(prompts) * t.rollouts_per_prompt
    report({"stage": "rollouts", "done": 0, "total": total})
    tokenizer = session.loaded.tokenizer
    styled = min(t.styled_rollouts, t.rollouts_per_prompt)
    if styled:
        # some replies asked for in a style (reinf.training.styles), then put back under
        # their plain prompt: scored and trained as answers to what the person wrote
        contexts, owners, styles = styled_contexts(
            tokenizer, prompts, t.rollouts_per_prompt, styled, load_styles(t.styles_file),
            seed=seed, limit=session.context_limit - max_new,
            rated=rated if t.styled_pick == "ratings" else None)
    else:
        contexts, owners, styles = prompts, [], []
    rollouts = sample_rollouts(
        session.policy.model, tokenizer, contexts, 1 if styled else t.rollouts_per_prompt,
        temperature=g.temperature, top_p=g.top_p, max_new_tokens=max_new, seed=seed,
        batch_size=t.rollout_batch_size,
        progress=lambda done, n: report({"stage": "rollouts", "done": done, "total": n}))
    for r in rollouts if styled else ():  # each styled reply back under its plain prompt
        r.group = owners[r.group]
        r.prompt_ids = list(prompts[r.group])
    sampled = time.perf_counter()
    features = reply_features(session.policy.model, [(r.prompt_ids, r.reply_ids) for r in rollouts],
                              batch_size=config.ppo.batch_size * 2)
    predicted = rating_model.score(features, t.pessimism).tolist()
    fresh = [_fresh_sample(r, score, text_of, session, now, g.temperature)
             for r, score in zip(rollouts, predicted)]
    rows = compute_rewards(config, fresh, now=now,
                           labels=[f"a fresh reply to prompt {r.group + 1} (predicted score "
                                   f"{s:.2f})" for r, s in zip(rollouts, predicted)])
    group_of = {tuple(p): i for i, p in enumerate(prompts)}
    drawn = set(styles) - {None}
    lifts = {s: x for s, x in style_lifts(rated).items() if s in drawn} \
        if rated is not None else {}
    chosen = styled_to_imitate(rollouts, predicted, styles, t.imitate_styled, lifts)
    out, groups, imitate = [], [], set()
    for i, (r, row) in enumerate(zip(rollouts, rows)):
        if row.kept:
            # None: sampled by the round's own adapter, whose round-start pass is the
            # behaviour policy (reinf.training.ppo.build_rollout)
            out.append((r.prompt_ids, r.reply_ids, None, g.temperature, row.reward, 1.0))
            groups.append(r.group)
            if i in chosen:
                imitate.add(id(out[-1]))
    human = [e for e in episodes if tuple(e[0]) in group_of]
    for e in human:  # a human label beats a prediction: the real score, in its prompt's group
        out.append(e)
        groups.append(group_of[tuple(e[0])])
    joined = [e for e in episodes if id(e) in imitate_ids and tuple(e[0]) not in group_of]
    for e in joined:  # imitated all the same; alone in its group, against the batch (RLOO)
        out.append(e)
        groups.append(group_of.setdefault(tuple(e[0]), len(group_of)))
    return out, groups, imitate, {
        "rollouts": len(rollouts), "rollout_prompts": len(prompts), "rated_in_batch": len(human),
        "imitated_joined": len(joined),
        **({"styled_imitated": len(imitate),
            "style_lifts": {s: round(x, 3) for s, x in lifts.items()}}
           if t.imitate_styled and styled else {}),
        "rollout_tokens": sum(len(r.reply_ids) for r in rollouts),
        "predicted_score_mean": sum(predicted) / max(len(predicted), 1),
        **styled_figures(rollouts, predicted, styles),
        "rollout_seconds": sampled - started, "scoring_seconds": time.perf_counter() - sampled}


def _rollout_prompts(config, session, samples, seed: int
                     ) -> tuple[list[list[int]], dict[tuple, str], int]:
    """A round's rollout prompts (``rollout_prompts`` of the rated ones, half the newest),
    their text by ids, and the most tokens a reply may take. A prompt that leaves no room
    for a full reply is drawn only when every prompt is that long."""
    from reinf.training.rollouts import choose_prompts

    t = config.training
    fits = [s for s in samples if usable(session, s)]
    max_new = t.rollout_max_new_tokens or config.generation.max_new_tokens
    fits = [s for s in fits if len(s.prompt_ids) + max_new <= session.context_limit] or fits
    prompts = choose_prompts(fits, t.rollout_prompts, newest=math.ceil(t.rollout_prompts / 2),
                             seed=seed)
    return prompts, {tuple(s.prompt_ids): s.prompt for s in fits}, max_new


def styled_demonstrations(config, session, samples, rated, *, now, seed: int, report
                          ) -> tuple[list[tuple], dict[str, Any]]:
    """``training.imitate_styled`` in a round whose rating model is not trusted yet (rated
    mode): the style the person's ratings lift most, where that lift is at least the
    margin, still reaches the policy. For each of ``rollout_prompts`` rated prompts one
    reply is sampled from the current adapter asked for in that style, put back under its
    plain prompt, and returned as an episode to imitate, with the reward of the person's
    usual rating plus the lift (through their reward mapper), and the round's metrics
    (``styled_imitated``, ``style_lifts``, ``styled_style``). None where no style is lifted
    that far, with ``training.method: rated`` or without ``styled_rollouts``.

    It exists because a rating model fitted on a few dozen ratings, most of them of plain
    replies, can fail its consistency check for rounds after the ratings of the explored
    replies already show a style is liked (docs/training.md, "Styled rollouts")."""
    from reinf.rewards.mapper import compute_rewards
    from reinf.training.rollouts import sample_rollouts
    from reinf.training.styles import (instruction_ids, load_styles, style_lifts,
                                       template_tail, top_lifted, with_instruction)

    t, g = config.training, config.generation
    if (t.method != "rollouts" or not t.imitate_styled or not t.styled_rollouts
            or rated is None or not rated.scores):
        return [], {}
    styles = set(load_styles(t.styles_file))
    lifts = {s: x for s, x in style_lifts(rated).items() if s in styles}
    shown = {"style_lifts": {s: round(x, 3) for s, x in lifts.items()}} if lifts else {}
    style = top_lifted(lifts, t.imitate_styled)
    if style is None:
        return [], shown
    prompts, text_of, max_new = _rollout_prompts(config, session, samples, seed)
    tokenizer = session.loaded.tokenizer
    extra, tail = instruction_ids(tokenizer, style), template_tail(tokenizer)
    limit = session.context_limit - max_new
    pairs = [(p, c) for p in prompts
             if (c := with_instruction(p, extra, tail)) is not None and len(c) <= limit]
    if not pairs:
        return [], shown
    report({"stage": "rollouts", "done": 0, "total": len(pairs)})
    rollouts = sample_rollouts(
        session.policy.model, tokenizer, [c for _, c in pairs], 1, temperature=g.temperature,
        top_p=g.top_p, max_new_tokens=max_new, seed=seed, batch_size=t.rollout_batch_size,
        progress=lambda done, n: report({"stage": "rollouts", "done": done, "total": n}))
    score = min(5.0, sum(rated.scores) / len(rated.scores) + lifts[style])
    for r in rollouts:  # back under its plain prompt
        r.prompt_ids = list(pairs[r.group][0])
    fresh = [_fresh_sample(r, score, text_of, session, now, g.temperature) for r in rollouts]
    rows = compute_rewards(config, fresh, now=now,
                           labels=[f"a reply asked for in the style {style!r} (score "
                                   f"{score:.2f}: your usual plus its lift)"] * len(fresh))
    # None: sampled by the round's own adapter (reinf.training.ppo.build_rollout)
    out = [(r.prompt_ids, r.reply_ids, None, g.temperature, row.reward, 1.0)
           for r, row in zip(rollouts, rows) if row.kept]
    return out, {"styled_imitated": len(out), "styled_style": style, **shown}


def _fresh_sample(r, score: float, text_of: dict[tuple, str], session, now, temperature):
    """A round's fresh reply ``r`` as a Sample its reward mapper reads: ``score`` is the
    rating it stands for (a prediction, in 1..5), and no turn stores it."""
    from reinf.records import Sample

    return Sample(turn_id=0, conversation_id=0, turn_index=0, user_id="local",
                  prompt=text_of.get(tuple(r.prompt_ids), ""), response=r.text,
                  prompt_ids=r.prompt_ids, reply_ids=r.reply_ids, logprobs=r.logprobs,
                  checkpoint_id=session.parent_id, score=score, tags=[], comment="",
                  critical=False, rated_at=now, created_at=now, temperature=temperature,
                  predicted=True)


def styled_to_imitate(rollouts, predicted: list[float], styles: list[str | None],
                      margin: float, lifts: dict[str, float] | None = None) -> set[int]:
    """``training.imitate_styled``: the indices of the styled rollouts to imitate as plain
    answers. For each prompt, its best styled reply, where its score is at least ``margin``
    above the mean of the plain replies to the prompt; none for a prompt without plain
    replies, and none at all when ``margin`` is 0 (off). A reply's score is the rating
    model's pessimistic prediction, plus for a styled one the lift the person's ratings of
    replies asked for in its style show (``lifts``, reinf.training.styles.style_lifts): a
    few dozen ratings teach the rating model little about a style the policy seldom
    writes, while ratings of the explored replies say it outright. The rating model reads
    the prompt, so a person who wants a list for a how-to and one sentence for a fact gets
    each where it was scored higher."""
    if margin <= 0 or not any(styles):
        return set()
    lifts = lifts or {}
    plain = plain_means(rollouts, predicted, styles)
    best: dict[int, tuple[float, int]] = {}
    for i, (r, score, style) in enumerate(zip(rollouts, predicted, styles)):
        if style is not None and r.group in plain:
            score += lifts.get(style, 0.0)
            if r.group not in best or score > best[r.group][0]:
                best[r.group] = (score, i)
    return {i for group, (score, i) in best.items() if score >= plain[group] + margin}


def plain_means(rollouts, predicted: list[float], styles: list[str | None]
                ) -> dict[int, float]:
    """The mean predicted score of the plain (unstyled) replies to each prompt, by group:
    what a styled reply to the same prompt is measured against."""
    plain: dict[int, list[float]] = {}
    for r, score, style in zip(rollouts, predicted, styles):
        if style is None:
            plain.setdefault(r.group, []).append(score)
    return {group: sum(scores) / len(scores) for group, scores in plain.items()}


def styled_figures(rollouts, predicted: list[float], styles: list[str | None]
                   ) -> dict[str, Any]:
    """How the rating model scored the styled replies against the plain ones to the same
    prompts: ``styled_rollouts`` (how many), ``styled_score_gain`` (the mean, over the styled
    replies, of each one's predicted score minus the mean of the plain replies to its
    prompt; above 0, the round pushes towards the styles), ``style_gains`` (the same per
    instruction, best first) and ``style_counts`` (how many replies were asked for in each,
    most first: with ``training.styled_pick: ratings``, the styles the person rated well
    lead). Empty when no reply was styled (``styles``: one instruction or None per rollout;
    empty when the round styled nothing)."""
    if not any(styles):
        return {}
    plain = plain_means(rollouts, predicted, styles)
    gains: dict[str, list[float]] = {}
    for r, score, style in zip(rollouts, predicted, styles):
        if style is not None and r.group in plain:
            gains.setdefault(style, []).append(score - plain[r.group])
    every = [x for xs in gains.values() for x in xs]
    per_style = {s: round(sum(xs) / len(xs), 3) for s, xs in gains.items()}
    return {"styled_rollouts": sum(s is not None for s in styles),
            "styled_score_gain": sum(every) / len(every) if every else None,
            "style_gains": dict(sorted(per_style.items(), key=lambda kv: -kv[1])),
            "style_counts": dict(Counter(s for s in styles if s is not None).most_common())}
