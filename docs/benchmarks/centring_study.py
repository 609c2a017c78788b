"""Does the rating model order replies to one prompt better when it is fitted on how each
rated reply differs from other replies to the same prompt? (docs/benchmarks.md, "Where a
round pushes".)

RLOO compares replies to one prompt, so only the rating model's within-prompt order counts.
But it is fitted on one rated reply per prompt, across prompts, where most of what varies in
the features is the prompt (its topic, the length it calls for), not the reply. A linear
model scores a within-prompt difference through ``w . (x_a - x_b)``; fitting on ``x_i -
m(prompt_i)``, where ``m`` is the mean features of other replies to that prompt, leaves only
the within-prompt part to fit (a fixed-effects fit). The cost, were it adopted: a few more
replies sampled for each rated prompt. Variants judged here, on the same draws as the
product (the same prompts and rated replies; ``reinf bench rating-model``'s judge, whose
draws this copies):

- ``product``: the trainer's rating model on the rated replies' features;
- ``centred, 3 others``: fitted on ``x_i`` minus the mean of the prompt's 3 other replies;
- ``centred, 1 other``: minus one other reply (what one extra sample a rated prompt buys);
- ``prompt mean as a block``: fitted on ``[m, x_i - m]`` (3 others), so the prompt's level
  gets its own weights, and a within-prompt difference is scored by the second block alone.

Held-out replies are scored on their raw features (``[m, x - m]`` with the group's mean for
the last), so within a prompt every variant is a linear model's order of ``x_a - x_b``.

    REINF_HOME=... python docs/benchmarks/pooling_study.py sample DIR  # replies (23 min, 1 core)
    REINF_HOME=... python docs/benchmarks/centring_study.py features DIR  # minutes
    python docs/benchmarks/centring_study.py judge DIR RATER[,RATER...]

Settings by environment: STUDY_DRAWS (10).
"""
from __future__ import annotations

import json
import os
import random
import statistics
import sys
from pathlib import Path

import torch

DRAWS = int(os.environ.get("STUDY_DRAWS", 10))
COUNTS = (16, 32, 48)
SEED = 0
VARIANTS = ("product", "centred, 3 others", "centred, 1 other", "prompt mean as a block")


def features(out: Path) -> None:
    """The trainer's own features of every reply (``reply_features``)."""
    from pooling_study import load  # beside this file: the same model and settings

    from reinf.training.rating_model import reply_features

    _, loaded = load()
    rows = json.loads((out / "replies.json").read_text())
    x = reply_features(loaded.model, [(r["prompt_ids"], r["reply_ids"]) for r in rows])
    torch.save({"product": x}, out / "centring-features.pt")
    print(f"{tuple(x.shape)} features")


def judge(x: torch.Tensor, scores: list[float], groups: dict[int, list[int]], n: int, *,
          seed: int) -> dict[str, dict]:
    """One draw, every variant: n prompts' rated replies (drawn as ``rating_study.judge``
    draws them), each variant fitted on its own form of them and judged on the other
    prompts' replies (within-prompt accuracy), with its own cross-validated Spearman."""
    from reinf.bench.rating_study import draw_prompts, prompt_pairs
    from reinf.training.rating_model import fit_rating_model

    fitted, held, rows = draw_prompts(groups, n, seed=seed)
    y = [scores[i] for i in rows]
    if len(set(y)) < 2:
        return {v: {"within_prompt_accuracy": None, "cross_validated": None} for v in VARIANTS}
    picker = random.Random(f"{seed}-other")
    others = [[j for j in groups[g] if j != i] for g, i in zip(fitted, rows)]
    mean3 = torch.stack([x[o].mean(0) for o in others])
    one = torch.stack([x[picker.choice(o)] for o in others])
    fit_x = {"product": x[rows], "centred, 3 others": x[rows] - mean3,
             "centred, 1 other": x[rows] - one,
             "prompt mean as a block": torch.cat([mean3, x[rows] - mean3], 1)}
    test = [i for g in held for i in groups[g]]
    group_mean = {g: x[groups[g]].mean(0) for g in held}
    means = torch.stack([group_mean[g] for g in held for _ in groups[g]])
    test_x = {"prompt mean as a block": torch.cat([means, x[test] - means], 1)}
    out = {}
    for variant in VARIANTS:
        model = fit_rating_model(fit_x[variant], y, seed=seed)
        predicted, _ = model.predict(test_x.get(variant, x[test]))
        by_row = dict(zip(test, predicted.tolist()))
        agree = total = 0
        for i, j in prompt_pairs(groups, held):
            if scores[i] != scores[j]:
                total += 1
                agree += (by_row[i] - by_row[j]) * (scores[i] - scores[j]) > 0
        out[variant] = {"within_prompt_accuracy": agree / total if total else None,
                        "cross_validated": model.consistency}
    return out


def load_study(where: Path) -> tuple[list[dict], torch.Tensor, dict[int, list[int]]]:
    """What the studies beside this file read from ``where``: the replies (``pooling_study.py
    sample``), their features (``features`` above) and the rows of each prompt's replies."""
    rows = json.loads((where / "replies.json").read_text())
    x = torch.load(where / "centring-features.pt")["product"]
    groups: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(r["group"], []).append(i)
    return rows, x, groups


def judge_all(where: Path, raters: list[str]) -> None:
    from reinf.bench.raters import load_rater

    rows, x, groups = load_study(where)
    groups = {g: m for g, m in groups.items() if len(m) >= 2}  # a lone reply has no "other"
    result: dict = {}
    for name in raters:
        rater = load_rater(name, seed=SEED)
        scores = [float(rater(r["prompt"], r["text"])) for r in rows]
        for n in COUNTS:
            draws = [judge(x, scores, groups, n, seed=SEED * 1000 + d) for d in range(DRAWS)]
            for variant in VARIANTS:
                cell = {}
                for key in ("within_prompt_accuracy", "cross_validated"):
                    values = [d[variant][key] for d in draws if d[variant][key] is not None]
                    cell[key] = round(statistics.fmean(values), 4) if values else None
                result.setdefault(name, {}).setdefault(variant, {})[str(n)] = cell
        print(f"{name}")
        for variant in VARIANTS:
            cells = result[name][variant]
            print(f"  {variant:<24} " + "  ".join(
                f"{n}: {fmt(cells[str(n)]['within_prompt_accuracy'])} "
                f"(cv {fmt(cells[str(n)]['cross_validated'])})" for n in COUNTS), flush=True)
    (where / f"centring-judged-{len(raters)}.json").write_text(json.dumps(result, indent=1))
    print("\nmean within-prompt accuracy over the raters, after", " / ".join(map(str, COUNTS)))
    for variant in VARIANTS:
        columns = []
        for n in COUNTS:
            values = [result[r][variant][str(n)]["within_prompt_accuracy"] for r in raters]
            values = [v for v in values if v is not None]
            columns.append(sum(values) / len(values))
        worse = [r for r in raters
                 if (result[r][variant]["48"]["within_prompt_accuracy"] or 0)
                 < (result[r]["product"]["48"]["within_prompt_accuracy"] or 0) - 0.02]
        print(f"  {variant:<24} " + " / ".join(f"{c:.3f}" for c in columns)
              + (f"   worse by > 0.02 at 48: {', '.join(worse)}" if worse else ""))


def fmt(value: float | None) -> str:
    return "  -  " if value is None else f"{value:.3f}"


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("STUDY_THREADS", 1)))
    stage, where = sys.argv[1], Path(sys.argv[2])
    if stage == "features":
        features(where)
    elif stage == "judge":
        judge_all(where, sys.argv[3].split(","))
    else:
        sys.exit(f"unknown stage {stage!r}: features or judge (replies: pooling_study.py sample)")
