"""When the rating model's bootstrap heads agree on which of two replies to one prompt is
better, are they right more often? (docs/benchmarks.md, "Where a round
pushes".)

A rollout round's advantage is the ensemble's mean score against the other replies to the
prompt (RLOO), so a pair of replies pushes the policy in proportion to the difference of
their mean scores. A step that shrinks where the rating model is unsure would weigh each
difference by how much the heads agree on it. That helps only if agreement tells right
orders from wrong ones. This measures it without training, on the replies and features of
``pooling_study.py sample`` and ``centring_study.py features`` (the trainer's features), with
the draws of ``reinf bench rating-model``'s judge: the trainer's rating model fitted on one
reply of n prompts, then every held-out pair of replies to one prompt that the rater scores
differently, by bins of the heads' signal-to-noise on the pair, ``z = |mean d| / std d``
(``d``: the pair's score difference under each head). Also the pairs' accuracy weighted by
``|mean d|`` (how RLOO weighs them, the ensemble's mean), by the difference of the scores a
round really gives (``pessimistic``: mean - 0.5 std, ``RatingModel.score``) and by ``|mean
d| * z^2 / (1 + z^2)`` (``shrunk``: a step that shrinks where the heads disagree). And
``push``: of a round's whole push over every held-out pair, the pairs the rater scores alike
included (``|difference of scores a round gives|`` summed), the share that goes the rater's
way; the rest moves replies the rater does not tell apart, or the wrong way; ``push
shrunk``, the same with each pair's push shrunk as in ``shrunk``; ``push z>1``, a round that
pushes only the pairs whose heads agree (z above 1).

    python docs/benchmarks/agreement_study.py DIR RATER[,RATER...]

Settings by environment: STUDY_DRAWS (10), STUDY_HEADS (5, the product's; a comma list runs
each).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

DRAWS = int(os.environ.get("STUDY_DRAWS", 10))
HEADS = [int(h) for h in os.environ.get("STUDY_HEADS", "5").split(",")]
COUNTS = (16, 32, 48)
SEED = 0
PESSIMISM = 0.5
KEYS = ("plain", "pessimistic", "magnitude", "shrunk", "push", "push shrunk", "push z>1")
BINS = ((0.0, 1.0), (1.0, 2.0), (2.0, float("inf")))


def head_scores(model, x: torch.Tensor) -> torch.Tensor:
    """(N, heads): each bootstrap head's score, clamped to 1..5 as ``RatingModel.predict``."""
    xs = (x.double() - model.mu.double()) / model.sd.double()
    return (xs @ model.weights.double().T + model.biases.double()).clamp(1.0, 5.0)


def draw(x, scores, groups, n: int, heads: int, *, seed: int, tally: dict) -> None:
    """One draw (``rating_study.judge``'s prompts and rated replies), its pairs into ``tally``."""
    from reinf.bench.rating_study import draw_prompts, prompt_pairs
    from reinf.training.rating_model import fit_rating_model

    fitted, held, rows = draw_prompts(groups, n, seed=seed)
    y = [scores[i] for i in rows]
    if len(set(y)) < 2:
        return
    model = fit_rating_model(x[rows], y, heads=heads, seed=seed, cross_validate=False)
    test = [i for g in held for i in groups[g]]
    heads_of = head_scores(model, x[test])
    per_head = dict(zip(test, heads_of))
    # the trainer's own reward-ready score (RatingModel.score at training.pessimism's default)
    pessimistic = dict(zip(test, (heads_of.mean(1) - PESSIMISM * heads_of.std(1, unbiased=False))
                           .clamp(1.0, 5.0).tolist()))
    for i, j in prompt_pairs(groups, held):
        gap = pessimistic[i] - pessimistic[j]
        d = per_head[i] - per_head[j]
        mean, spread = float(d.mean()), float(d.std(unbiased=False))
        z = abs(mean) / spread if spread > 0 else float("inf")
        shrink = 1.0 if z == float("inf") else z * z / (1 + z * z)
        tally["push"][0] += abs(gap)  # a round pushes tied pairs apart too
        tally["push shrunk"][0] += abs(mean) * shrink
        tally["push z>1"][0] += abs(gap) * (z > 1)
        if scores[i] == scores[j]:
            continue
        pushed_right = gap * (scores[i] - scores[j]) > 0  # the way a round pushes them
        right = mean * (scores[i] - scores[j]) > 0        # the ensemble's mean order
        tally["push"][1] += abs(gap) * pushed_right
        tally["push shrunk"][1] += abs(mean) * shrink * right
        tally["push z>1"][1] += abs(gap) * (z > 1) * pushed_right
        for k, (lo, hi) in enumerate(BINS):
            if lo <= z < hi:
                tally["bins"][k][0] += 1
                tally["bins"][k][1] += right
        for key, w in (("plain", 1.0), ("magnitude", abs(mean)),
                       ("shrunk", abs(mean) * shrink)):
            tally[key][0] += w
            tally[key][1] += w * right
        tally["pessimistic"][0] += abs(gap)
        tally["pessimistic"][1] += abs(gap) * pushed_right


def tally_draws(x, scores, groups, n: int, heads: int) -> dict:
    """DRAWS draws at ``n`` ratings, their pairs tallied: {key: [weight, weight right]} for
    each of KEYS, and "bins": [[pairs, right], ...] by BINS."""
    tally = {"bins": [[0, 0] for _ in BINS], **{key: [0.0, 0.0] for key in KEYS}}
    for d in range(DRAWS):
        draw(x, scores, groups, n, heads, seed=SEED * 1000 + d, tally=tally)
    return tally


def main(where: Path, raters: list[str]) -> None:
    from centring_study import load_study  # beside this file

    from reinf.bench.raters import load_rater

    rows, x, groups = load_study(where)
    result: dict = {}
    for name in raters:
        rater = load_rater(name, seed=SEED)
        scores = [float(rater(r["prompt"], r["text"])) for r in rows]
        for heads in HEADS:
            for n in COUNTS:
                tally = tally_draws(x, scores, groups, n, heads)
                cell = {key: (tally[key][1] / tally[key][0] if tally[key][0] else None)
                        for key in KEYS}
                total = sum(b[0] for b in tally["bins"])
                cell["pairs"] = total / DRAWS  # held-out pairs the rater tells apart
                cell["bins"] = [{"z": f"{lo}-{hi}", "share": b[0] / total if total else None,
                                 "accuracy": b[1] / b[0] if b[0] else None}
                                for (lo, hi), b in zip(BINS, tally["bins"])]
                result.setdefault(name, {}).setdefault(str(heads), {})[str(n)] = cell
                print(f"{name:<44} heads {heads:>2} n {n:>2}  "
                      + " ".join(f"{key} {fmt(cell[key])}" for key in KEYS)
                      + f" pairs {cell['pairs']:.0f}  z bins "
                      + "  ".join(f"[{b['z']}] {fmt(b['share'])} at {fmt(b['accuracy'])}"
                                  for b in cell["bins"]), flush=True)
    (where / f"agreement-{len(raters)}.json").write_text(json.dumps(result, indent=1))
    print("\nmeans over the raters, after", " / ".join(map(str, COUNTS)))
    for heads in HEADS:
        for key in KEYS:
            columns = []
            for n in COUNTS:
                values = [result[r][str(heads)][str(n)][key] for r in raters]
                values = [v for v in values if v is not None]
                columns.append(sum(values) / len(values))
            print(f"  heads {heads:>2} {key:<10} " + " / ".join(f"{c:.3f}" for c in columns))


def fmt(value: float | None) -> str:
    return "  -  " if value is None else f"{value:.3f}"


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(Path(sys.argv[1]), sys.argv[2].split(","))
