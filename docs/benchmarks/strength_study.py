"""Would a stronger or weaker ridge put more of a round's push where the rater cares?
(docs/benchmarks.md, "Where a round pushes".)

The rating model chooses its ridge strength by leave-one-out error on the ratings
(``rating_model.ridge_choice``): the best fit *across* prompts. The push share (of a round's
push on every pair of replies to one prompt, the share that goes the rater's way) depends on
the fitted direction only, so a strength chosen for another purpose could change it. This
scales the chosen strength by each factor in STUDY_FACTORS and reports, with
``agreement_study.py``'s draws, the weighted accuracy and the push share:

    python docs/benchmarks/strength_study.py DIR RATER[,RATER...]

DIR holds ``pooling_study.py sample``'s replies and ``centring_study.py features``'s
features. Settings by environment: STUDY_DRAWS (10), STUDY_FACTORS (0.1,0.3,1,3,10).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

FACTORS = [float(f) for f in os.environ.get("STUDY_FACTORS", "0.1,0.3,1,3,10").split(",")]


def main(where: Path, raters: list[str]) -> None:
    import agreement_study as study  # beside this file: the same draws and tallies
    from centring_study import load_study

    from reinf.bench.raters import load_rater
    from reinf.training import rating_model

    rows, x, groups = load_study(where)
    chosen = rating_model.ridge_choice
    result: dict = {}
    for name in raters:
        rater = load_rater(name, seed=study.SEED)
        scores = [float(rater(r["prompt"], r["text"])) for r in rows]
        for factor in FACTORS:
            def scaled(x_, y_, factor=factor):
                strength, loo_error = chosen(x_, y_)
                return strength * factor, loo_error
            rating_model.ridge_choice = scaled
            try:
                for n in study.COUNTS:
                    tally = study.tally_draws(x, scores, groups, n, 5)
                    cell = {key: tally[key][1] / tally[key][0] if tally[key][0] else None
                            for key in ("pessimistic", "push")}
                    result.setdefault(name, {}).setdefault(str(factor), {})[str(n)] = cell
            finally:
                rating_model.ridge_choice = chosen
            cells = result[name][str(factor)]
            print(f"{name:<44} x{factor:<5} " + "  ".join(
                f"{n}: weighted {study.fmt(cells[str(n)]['pessimistic'])} push "
                f"{study.fmt(cells[str(n)]['push'])}" for n in study.COUNTS), flush=True)
    (where / f"strength-{len(raters)}.json").write_text(json.dumps(result, indent=1))
    print("\nmeans over the raters (weighted / push), after", " / ".join(map(str, study.COUNTS)))
    for factor in FACTORS:
        line = []
        for key in ("pessimistic", "push"):
            values = [[result[r][str(factor)][str(n)][key] for r in raters] for n in study.COUNTS]
            line.append(" / ".join(f"{sum(v for v in col if v is not None) / len(col):.3f}"
                                   for col in values))
        print(f"  x{factor:<5} weighted {line[0]}   push {line[1]}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(Path(sys.argv[1]), sys.argv[2].split(","))
