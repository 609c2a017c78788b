"""How much should the bag of tokens weigh beside the hidden states? (docs/benchmarks.md,
"Where a round pushes".)

The rating model standardises every column, so a block's say in the fit grows with how
many of its columns vary: among 48 rated replies the bag has about 3,500 varying buckets
against the hidden states' 2,881 columns, among 16 about 1,500. Feature set 2 took that
balance as it came. This repeats one block's columns k times (which multiplies its share of
the ridge kernel by k) and judges each balance with ``agreement_study.py``'s draws: the
within-prompt accuracy, the weighted accuracy and the push share.

    python docs/benchmarks/balance_study.py DIR RATER[,RATER...]

DIR holds ``pooling_study.py sample``'s replies and ``centring_study.py features``'s
features. Settings by environment: STUDY_DRAWS (10).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def balances(x: torch.Tensor) -> dict[str, torch.Tensor]:
    from reinf.training.rating_model import BAG_BUCKETS

    dense, bag = x[:, :-BAG_BUCKETS], x[:, -BAG_BUCKETS:]  # hidden states, length, max; bag
    return {"the product's": x,
            "bag x2": torch.cat([dense, bag, bag], 1),
            "hidden x2": torch.cat([dense, dense, bag], 1),
            "hidden x4": torch.cat([dense, dense, dense, dense, bag], 1),
            "no bag": dense}


def main(where: Path, raters: list[str]) -> None:
    import agreement_study as study  # beside this file: the same draws and tallies
    from centring_study import load_study

    from reinf.bench.raters import load_rater

    rows, x, groups = load_study(where)
    sets = balances(x)
    keys = ("plain", "pessimistic", "push")
    result: dict = {}
    for name in raters:
        rater = load_rater(name, seed=study.SEED)
        scores = [float(rater(r["prompt"], r["text"])) for r in rows]
        for label, x in sets.items():
            for n in study.COUNTS:
                tally = study.tally_draws(x, scores, groups, n, 5)
                result.setdefault(name, {}).setdefault(label, {})[str(n)] = {
                    key: tally[key][1] / tally[key][0] if tally[key][0] else None for key in keys}
            cells = result[name][label]
            print(f"{name:<44} {label:<14} " + "  ".join(
                f"{n}: " + " ".join(study.fmt(cells[str(n)][k]) for k in keys)
                for n in study.COUNTS), flush=True)
    (where / f"balance-{len(raters)}.json").write_text(json.dumps(result, indent=1))
    print("\nmeans over the raters: within-prompt / weighted / push share, after",
          " / ".join(map(str, study.COUNTS)))
    for label in sets:
        parts = []
        for key in keys:
            cols = [[result[r][label][str(n)][key] for r in raters] for n in study.COUNTS]
            parts.append(" / ".join(f"{sum(v for v in c if v is not None) / len(c):.3f}"
                                    for c in cols))
        worse = [r.split(":")[-1] for r in raters
                 if (result[r][label]["48"]["plain"] or 0)
                 < (result[r]["the product's"]["48"]["plain"] or 0) - 0.02]
        print(f"  {label:<14} " + "   ".join(parts)
              + (f"   worse by > 0.02 at 48: {', '.join(worse)}" if worse else ""))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(Path(sys.argv[1]), sys.argv[2].split(","))
