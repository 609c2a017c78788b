"""Styled rollouts (``training.styled_rollouts``): some of a round's fresh replies are asked for
in a given style, so the rating model can show the policy ways of answering it seldom picks.

A round's rollouts come from the policy as it is. Where it almost never writes what the
person wants (a list, an example, one short sentence), its replies to one prompt do not
differ in that, and however well the rating model has learnt the person's taste, RLOO has
nothing to push towards (docs/training.md, "Styled rollouts"). So, for each rollout prompt,
``styled_rollouts`` of its ``rollouts_per_prompt`` replies are sampled with a style
instruction from a list appended to the person's message ("Use a bulleted list."). The
rating model scores every reply against the prompt *without* the instruction, and PPO
trains on it without the instruction too: a styled reply the rating model likes better
than the plain ones becomes more likely as a plain answer to that prompt, one it likes less
becomes less likely. Nothing styled is shown to anyone or stored.

The instruction goes at the end of the last user message, in token space: the prompt's ids
up to the chat template's closing tokens (``template_tail``), the instruction's ids, then
the tail. A prompt that does not end with the tail (a template this cannot read) is sampled
plainly. The built-in list covers common axes of reply style and is not tuned on any rater;
a person can give their own (``training.styles_file``, one instruction a line).

**Exploring styles** (``generation.explore_styles``, ``Explorer``): the same splice for a
share of the *served* replies, so the person's ratings see the styles at all. The chat
service stores such a reply under the plain prompt, with the instruction in its
``gen_params``; PPO reads it with the round-start pass as its behaviour policy
(``Sample.styled``).
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Callable, Collection, Sequence

from reinf.errors import BadInput
from reinf.records import StyleRatings

#: The built-in instructions: length, structure, register, examples, directness, tone,
#: questions back, reasoning. One of them is drawn (without repeats within a prompt) for
#: each styled reply.
BUILTIN_STYLES = (
    "Answer in one or two sentences.",
    "Give a thorough, detailed answer.",
    "Use a bulleted list.",
    "Use numbered steps.",
    "Include a concrete example.",
    "Write in a formal, professional tone.",
    "Write in a casual, friendly tone.",
    "Start with the direct answer, then explain.",
    "Use simple, everyday words.",
    "Keep every sentence short.",
    "Explain your reasoning step by step.",
    "Be warm and encouraging.",
    "Include numbers or figures where they help.",
    "End by asking a follow-up question.",
    "Answer in a single paragraph.",
    "Do not ask any questions.",
)

#: Longest instruction accepted from a styles file, in characters.
MAX_STYLE_CHARS = 500


def load_styles(path: str | None) -> list[str]:
    """The instructions of ``training.styles_file`` (one a line; blank lines and lines
    starting with ``#`` skipped), or the built-in list when it is null."""
    if not path:
        return list(BUILTIN_STYLES)
    file = Path(path).expanduser()
    fix = ("point training.styles_file at a UTF-8 text file with one style instruction a "
           "line, or set it to null for the built-in list")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"training.styles_file {str(file)!r} cannot be read: {exc}", fix=fix) \
            from exc
    styles = [line.strip() for line in text.splitlines()
              if line.strip() and not line.strip().startswith("#")]
    if not styles:
        raise BadInput(f"training.styles_file {str(file)!r} has no instructions", fix=fix)
    long = next((s for s in styles if len(s) > MAX_STYLE_CHARS), None)
    if long is not None:
        raise BadInput(f"training.styles_file {str(file)!r}: an instruction is longer than "
                       f"{MAX_STYLE_CHARS} characters ({long[:40]!r}...)", fix=fix)
    return styles


def template_tail(tokenizer) -> list[int]:
    """The ids the chat template puts after the text of the last user message (the end of
    the user turn and the assistant header): the common suffix of two rendered messages."""
    from reinf.model.modeling import render_chat

    a = render_chat(tokenizer, [], "Hello there.")
    b = render_chat(tokenizer, [], "What is the time")
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return a[len(a) - n:]


def with_instruction(prompt_ids: Sequence[int], instruction_ids: Sequence[int],
                     tail: Sequence[int]) -> list[int] | None:
    """``prompt_ids`` with ``instruction_ids`` at the end of its last user message, or None
    when the prompt does not end with the template's ``tail``."""
    n = len(tail)
    if n == 0 or len(prompt_ids) <= n or list(prompt_ids[-n:]) != list(tail):
        return None
    return list(prompt_ids[:-n]) + list(instruction_ids) + list(tail)


def instruction_ids(tokenizer, style: str) -> list[int]:
    """The ids an instruction adds to the end of a user message: a blank line, then it."""
    return tokenizer.encode("\n\n" + style, add_special_tokens=False)


#: How much a style nobody has rated yet counts in ``pick_style``, in ratings: as this many
#: at the person's mean rating (plus half a rating at either end of the scale).
PRIOR_RATINGS = 2.0


#: Ratings a style needs before ``styled_contexts`` asks for it in every prompt's first
#: styled rollout, and before ``style_lifts`` counts its ratings: with one, a single lucky
#: rating filled them all (docs/benchmarks.md).
EXPLOIT_RATINGS = 2


def pick_style(styles: Sequence[str], rated: StyleRatings, rng: random.Random) -> str:
    """One of ``styles`` by Thompson sampling over the person's ratings of the replies that
    were asked for in each (``explore_pick: ratings``).

    A rating r counts as (r - 1) / 4 of a success. Each style's share of successes has a
    beta posterior whose prior is ``PRIOR_RATINGS`` ratings at the mean of all the person's
    ratings (``rated.scores``), plain replies included, plus half a rating at 1 and half at
    5; a draw from each posterior, and the highest wins. So a style nobody rated yet is as
    likely as the person's usual reply to be liked, with wide doubt, and is still tried; a
    style rated above the usual is asked for more often with every such rating, one rated
    below it less. Against a person who rates most replies 1, two 5s for lists make lists
    the likeliest pick of sixteen."""
    a0, b0 = _prior(rated)
    best, top = styles[0], -1.0
    for style in styles:
        wins = [_success(score) for score in rated.by_style.get(style, ())]
        draw = rng.betavariate(a0 + sum(wins), b0 + len(wins) - sum(wins))
        if draw > top:
            best, top = style, draw
    return best


def favoured_by_ratings(rated: StyleRatings, n: int = 3,
                        among: Collection[str] | None = None) -> list[dict]:
    """The styles ``pick_style`` now asks for more often than one nobody rated, best first
    (by their posterior mean), at most ``n``, only those ``among`` the current list when
    given (a style dropped from the styles file stays in old ratings): ``{style, ratings,
    mean}`` with ``mean`` the average of their ratings (what ``reinf status`` shows)."""
    a0, b0 = _prior(rated)
    rows = []
    for style, scores in rated.by_style.items():
        if among is not None and style not in among:
            continue
        mean = _posterior_mean(scores, a0, b0)
        if mean > a0 / (a0 + b0):
            rows.append((mean, {"style": style, "ratings": len(scores),
                                "mean": round(sum(scores) / len(scores), 2)}))
    return [row for _, row in sorted(rows, key=lambda r: -r[0])[:n]]


def style_lifts(rated: StyleRatings) -> dict[str, float]:
    """By style, how many rating points above (or below) the person's usual a reply asked
    for in it is rated, as the ratings show it: its replies' mean rating minus the mean of
    all the person's ratings (``rated.scores``), shrunk towards none as ``PRIOR_RATINGS``
    ratings at the usual would shrink it (n / (n + 2) of it, for n ratings). Only styles
    rated at least ``EXPLOIT_RATINGS`` times. Two 5s against a person who rates nearly
    everything else 1 lift a style by about 2 points; one 5 is not counted; a style rated as
    the usual is not lifted, whatever the usual. (It used to be the beta posterior
    ``pick_style`` draws from, less its prior mean; that prior's half rating at either end
    pulls towards the middle of the scale, so for a person who rates nearly everything 5
    every style rated 5 four times showed a lift of about +0.5, and a style rated exactly
    as the usual +0.3: no-question-back's rounds imitated such styles, docs/benchmarks.md.)"""
    usual = usual_rating(rated)
    return {style: len(scores) / (len(scores) + PRIOR_RATINGS) * (_mean(scores) - usual)
            for style, scores in rated.by_style.items() if len(scores) >= EXPLOIT_RATINGS}


def usual_rating(rated: StyleRatings) -> float:
    """The person's usual rating: the mean of their recent ratings (``rated.scores``, the
    last 1,000 by ``Store.style_ratings``), each held to the scale; 3 before any. The lifts
    are measured from it, and ``training.imitate_explored``'s margin too."""
    return _mean(rated.scores) if rated.scores else 3.0


def top_lifted(lifts: dict[str, float], margin: float) -> str | None:
    """The style with the highest lift, where that lift reaches ``margin``; else None: the
    style a rated round imitates (``training.imitate_styled``, reinf.training.plan)."""
    style = max(lifts, key=lifts.get, default=None)
    return style if style is not None and lifts[style] >= margin else None


def _mean(scores) -> float:
    """The mean of ratings, each held to the scale (1-5) as ``_success`` holds it."""
    return 1 + 4 * sum(map(_success, scores)) / len(scores)


def _posterior_mean(scores, a0: float, b0: float) -> float:
    """The mean of a style's beta posterior over its ratings ``scores`` (prior a0, b0)."""
    return (a0 + sum(map(_success, scores))) / (a0 + b0 + len(scores))


def _success(score: int) -> float:
    return (min(max(score, 1), 5) - 1) / 4


def _prior(rated: StyleRatings) -> tuple[float, float]:
    """The beta prior of a style nobody rated: ``PRIOR_RATINGS`` at the person's mean."""
    scores = rated.scores
    usual = sum(map(_success, scores)) / len(scores) if scores else 0.5
    return 0.5 + PRIOR_RATINGS * usual, 0.5 + PRIOR_RATINGS * (1 - usual)


class Explorer:
    """``generation.explore_styles``: which served replies are asked for in a style.

    ``draw`` decides for one reply: with probability ``share`` the prompt's ids get an
    instruction from ``styles`` at the end of the last user message (as a styled rollout's
    do); otherwise, or where the template cannot be read or the styled prompt would not
    fit in ``limit`` tokens, the prompt is sampled as it is. A ``seed`` makes the draw
    repeatable (``key`` tells apart the replies of one seeded call); without one it comes
    from the explorer's own random stream. The chat service stores the reply under the
    plain prompt, with the instruction in its ``gen_params``, so the person's rating of it
    is a rating of an answer to what they wrote.

    Which instruction: ``pick`` "uniform" draws each equally often; "ratings" draws by the
    person's ratings of the replies asked for in each so far (``rated``; ``pick_style``),
    and is uniform until there are ratings to read."""

    def __init__(self, tokenizer, styles: Sequence[str], share: float, pick: str = "uniform"):
        self.tokenizer = tokenizer
        self.styles = list(styles)
        self.share = float(share)
        self.pick = pick
        self._tail: list[int] | None = None
        self._ids: dict[str, list[int]] = {}  # each instruction's ids, encoded once
        self._rng = random.Random()

    def draw(self, prompt_ids: Sequence[int], *, limit: int | None = None,
             seed: int | None = None, key: str = "",
             rated: StyleRatings | Callable[[], StyleRatings | None] | None = None
             ) -> tuple[list[int], str | None]:
        """(the ids to sample from, the instruction or None). ``rated`` may be a function
        that reads the ratings: it is called only for a reply drawn to be styled."""
        plain = list(prompt_ids)
        rng = self._rng if seed is None else random.Random(f"{seed}-explore-{key}")
        if not self.styles or rng.random() >= self.share:
            return plain, None
        if self.pick == "ratings" and callable(rated):
            rated = rated()
        if self.pick == "ratings" and rated is not None and rated.scores:
            style = pick_style(self.styles, rated, rng)
        else:
            style = rng.choice(self.styles)
        if self._tail is None:
            self._tail = template_tail(self.tokenizer)
        if style not in self._ids:
            self._ids[style] = instruction_ids(self.tokenizer, style)
        styled = with_instruction(plain, self._ids[style], self._tail)
        if styled is None or (limit is not None and len(styled) > limit):
            return plain, None
        return styled, style


def styled_contexts(tokenizer, prompts: Sequence[Sequence[int]], k: int, styled: int,
                    styles: Sequence[str], *, seed: int, limit: int,
                    rated: StyleRatings | None = None
                    ) -> tuple[list[list[int]], list[int], list[str | None]]:
    """What to sample, one reply each, for ``k`` replies to each of ``prompts`` of which
    ``styled`` carry an instruction: (contexts, the prompt each belongs to, its instruction
    or None). Instructions are drawn with ``seed``, without repeats within a prompt while
    the list lasts: uniformly, or by the person's ratings when ``rated`` holds any
    (``training.styled_pick: ratings``). Then each prompt's first styled reply is asked for
    in the style the ratings favour most (``favoured_by_ratings``) among those rated at
    least ``EXPLOIT_RATINGS`` times, where one is rated above the person's usual, and the
    others are drawn by Thompson sampling (``pick_style``):
    the served replies explore for the person to rate, the rollouts, which nobody rates,
    exploit what the ratings already show. A prompt the template cannot be read in, or whose
    styled context is longer than ``limit`` tokens (the room left for a reply), is sampled
    plainly."""
    rng = random.Random(f"{seed}-styles")
    tail = template_tail(tokenizer)
    encoded = {s: instruction_ids(tokenizer, s) for s in styles}
    by_ratings = rated is not None and bool(rated.scores)
    top = next((row["style"] for row in favoured_by_ratings(rated, n=len(styles), among=styles)
                if row["ratings"] >= EXPLOIT_RATINGS), None) if by_ratings else None
    contexts, owners, used = [], [], []
    for g, prompt in enumerate(prompts):
        if by_ratings:
            drawn, left = [], list(styles)
            for _ in range(min(styled, len(styles))):
                drawn.append(top if top is not None and not drawn else
                             pick_style(left, rated, rng))
                left.remove(drawn[-1])
            drawn += [pick_style(styles, rated, rng) for _ in range(styled - len(drawn))]
        else:
            drawn = rng.sample(list(styles), min(styled, len(styles)))
            drawn += [rng.choice(list(styles)) for _ in range(styled - len(drawn))]
        for i in range(k):
            style = drawn[i - (k - styled)] if i >= k - styled else None
            context = None if style is None else with_instruction(prompt, encoded[style], tail)
            if context is not None and len(context) > limit:
                context = None
            contexts.append(list(prompt) if context is None else context)
            owners.append(g)
            used.append(None if context is None else style)
    return contexts, owners, used
