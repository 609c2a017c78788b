"""``reinf bench styles``: how often would ``training.imitate_styled`` imitate the style a person
likes, and how often one they do not, after a few dozen ratings?

Trains and samples nothing. A simulated person rates 48 replies one by one. A share
(``explore_styles``) of them is asked for in a style, picked by the product's own Thompson
sampler over the ratings so far (``reinf.training.styles.pick_style``). The person rates a
reply 5 with probability ``base``, else 1 (four times in five) or 2 or 3. A reply in the
``liked`` style is rated 5 with probability ``liked`` instead, where the model followed the
instruction (probability ``follow``; SmolLM2 often writes no example when asked for one).
At each of ``ratings`` the product's ``style_lifts`` reads the ratings, and a rated round
would imitate the top style where its lift reaches the margin (``styled_demonstrations``).
Each margin gets the share of draws whose top style passes and is the liked one ("right")
or another ("wrong"), beside the same person with no liked style, where every pass is
chance.

Beside the margins, ``posteriors`` reads the same ratings with the rule that knows the
person (``knowing_pick``): the probability that each style is the liked one, given its
ratings, the person's true P(5)s, and that half of people like one of the styles (each
equally likely). No rule that reads only the ratings can tell the liked style apart
better than that one, so where its right / wrong shares at some threshold are no better
than a margin's at the same number of passes, the margin is not what to improve: the
ratings hold too little.

Why: on smollm2-135m the runs that learnt a style and those that imitated a wrong one
differed mostly in what a handful of ratings of each style said (docs/benchmarks.md,
"How often the imitated style is the liked one"). With 16 styles and half of 48 replies
explored, each style has been rated one to five times when the rounds read them, and the
best-looking of sixteen noisy means is biased upwards.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

from reinf.records import StyleRatings
from reinf.training.styles import pick_style, style_lifts, top_lifted


@dataclass(frozen=True)
class StylePlan:
    """One simulated person and what to read off them."""
    liked: str | None              # the style the person likes, None for no preference
    base: float = 0.15             # P(5) for a plain reply or another style
    liked_p: float = 0.45          # P(5) for a reply that followed the liked style
    follow: float = 1.0            # P(the model followed the instruction)
    share: float = 0.5             # explore_styles: the share of replies asked for a style
    ratings: tuple[int, ...] = (24, 32, 40)
    margins: tuple[float, ...] = (0.5, 0.75, 1.0)
    posteriors: tuple[float, ...] = (0.1, 0.2, 0.5)  # knowing_pick's thresholds
    draws: int = 300
    seed: int = 0
    total: int = 48                # ratings a person gives


def rate(p5: float, rng: random.Random) -> int:
    """One rating: 5 with probability ``p5``, else mostly 1, sometimes 2 or 3."""
    if rng.random() < p5:
        return 5
    return 1 if rng.random() < 0.8 else rng.choice((2, 3))


def simulate(plan: StylePlan, styles: list[str], liked: str | None, rng: random.Random
             ) -> dict[int, StyleRatings]:
    """One person's ``plan.total`` ratings; the ratings as the rounds at ``plan.ratings``
    would read them."""
    scores: list[int] = []
    by_style: dict[str, list[int]] = {}
    seen: dict[int, StyleRatings] = {}
    def now() -> StyleRatings:
        return StyleRatings(tuple(scores), {k: tuple(v) for k, v in by_style.items()})

    for i in range(1, plan.total + 1):
        if rng.random() < plan.share:
            style = pick_style(styles, now(), rng)
            followed = style == liked and rng.random() < plan.follow
            score = rate(plan.liked_p if followed else plan.base, rng)
            by_style.setdefault(style, []).append(score)
        else:
            score = rate(plan.base, rng)
        scores.append(score)
        if i in plan.ratings:
            seen[i] = now()
    return seen


def imitated(rated: StyleRatings, margin: float) -> str | None:
    """The style a rated round would imitate at ``margin`` (the top lift, if it reaches
    it), as ``reinf.training.plan.styled_demonstrations`` picks it."""
    return top_lifted(style_lifts(rated), margin)


def knowing_pick(rated: StyleRatings, plan: StylePlan, styles: list[str], at_least: float
                 ) -> str | None:
    """The style most likely to be the liked one, where that probability reaches
    ``at_least``: the Bayes rule that knows the person of ``plan``.

    Half of people like one of ``styles`` (each equally likely), the other half none. A
    liked style's reply is rated 5 with probability ``follow * liked_p + (1 - follow) *
    base``, every other reply with ``base``; the ratings below 5 fall alike either way, so
    only a style's count of 5s and of the rest tells."""
    def held(p: float) -> float:
        return min(max(p, 1e-6), 1 - 1e-6)
    liked_p = held(plan.follow * plan.liked_p + (1 - plan.follow) * plan.base)
    base = held(plan.base)
    five, rest = math.log(liked_p / base), math.log((1 - liked_p) / (1 - base))
    weight = {}
    for style in styles:
        scores = rated.by_style.get(style, ())
        fives = sum(1 for s in scores if s == 5)
        weight[style] = 0.5 / len(styles) * math.exp(fives * five + (len(scores) - fives) * rest)
    best = max(weight, key=weight.get)
    return best if weight[best] / (0.5 + sum(weight.values())) >= at_least else None


def run_style_study(plan: StylePlan, styles: list[str]) -> dict:
    """The share of draws whose rated round imitates the liked style or another one, by
    margin (and ``knowing_pick``'s threshold) and number of ratings, for the person of
    ``plan`` and the same person with no liked style."""
    people = ({"liked": plan.liked} if plan.liked else {}) | {"no preference": None}
    out: dict = {"plan": {**plan.__dict__, "styles": len(styles)}, "people": {}}
    rules = {("by_margin", m): lambda r, m=m: imitated(r, m) for m in plan.margins} | {
        ("by_posterior", q): lambda r, q=q: knowing_pick(r, plan, styles, q)
        for q in plan.posteriors}
    for label, liked in people.items():
        counts = {rule: {n: [0, 0] for n in plan.ratings} for rule in rules}
        for draw in range(plan.draws):
            rng = random.Random(plan.seed * 1_000_003 + draw)
            for n, rated in simulate(plan, styles, liked, rng).items():
                for rule, pick in rules.items():
                    style = pick(rated)
                    if style is not None:
                        counts[rule][n][0 if style == liked else 1] += 1
        person: dict = {"liked": liked, "by_margin": {}, "by_posterior": {}}
        for (kind, cut), by_n in counts.items():
            person[kind][str(cut)] = {str(n): {"right": r / plan.draws, "wrong": w / plan.draws}
                                      for n, (r, w) in by_n.items()}
        out["people"][label] = person
    return out


def format_style_study(report: dict) -> str:
    """The report as a table a person reads: right / wrong at each number of ratings."""
    p = report["plan"]
    lines = [f"{p['draws']} simulated people each, {p['styles']} styles, explore_styles "
             f"{p['share']}, P(5): plain {p['base']}, liked style {p['liked_p']} where "
             f"followed ({p['follow']})",
             "share of rated rounds imitating the liked style / another style:"]
    for label, person in report["people"].items():
        name = f"likes {person['liked']!r}" if person["liked"] else "likes no style"
        lines.append(f"  {name}")
        lines.append("    rule      " + "  ".join(f"{n:>11} ratings" for n in p["ratings"]))
        rows = [(f"lift>={float(m):.2f}", by_n) for m, by_n in person["by_margin"].items()]
        rows += [(f"P>={float(q):.2f}", by_n) for q, by_n in person["by_posterior"].items()]
        for name, by_n in rows:
            cells = "  ".join(f"{c['right']:>9.2f} / {c['wrong']:.2f}" for c in by_n.values())
            lines.append(f"    {name:>10}{cells}")
    lines.append("lift>=x: the margin (training.imitate_styled x) on the top style's lift")
    if p["posteriors"]:
        lines.append("P>=x: the rule that knows the person's P(5)s imitates the likeliest "
                     "liked style where that probability reaches x; no rule reading only "
                     "these ratings gets more right for as few wrong")
    return "\n".join(lines)
