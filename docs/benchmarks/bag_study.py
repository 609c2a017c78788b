"""Does the rating model order replies better with the largest input embedding over the reply
and a bag of its tokens and token pairs beside the hidden states? (docs/benchmarks.md, "A bag
of tokens and the embeddings' max: feature set 2".)

It reuses ``pooling_study.py``'s replies and features (the same 512 replies, 128
training-side prompts x 4, seed 0): ``product`` there is the trainer's ``reply_features``,
which now computes feature set 2, and set 1 (the hidden states and length alone) is its
first 4 x hidden + 1 columns. The bag is the trainer's own (``rating_model._bag``), from
the replies' token ids. Judged with ``reinf bench rating-model``'s judge, as there:

    REINF_HOME=... python docs/benchmarks/pooling_study.py sample DIR
    REINF_HOME=... python docs/benchmarks/pooling_study.py features DIR
    python docs/benchmarks/bag_study.py DIR RATER[,RATER...]

Settings by environment: STUDY_DRAWS (10), STUDY_SETS (all, or a comma-separated subset of
the names in ``feature_sets``).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

DRAWS = int(os.environ.get("STUDY_DRAWS", 10))
COUNTS = (16, 32, 48)


def feature_sets(f: dict, rows: list[dict]) -> dict[str, torch.Tensor]:
    from reinf.training.rating_model import _bag

    product, embedded_max = f["product"], f["max"][:, 0]
    width = 4 * embedded_max.shape[1] + 1  # set 1: three means, the last token, log length
    set1 = product[:, :width]
    bag = _bag([r["reply_ids"] for r in rows])
    return {"set 1": set1,
            "set 1 + max emb": torch.cat([set1, embedded_max], 1),
            "set 1 + bag": torch.cat([set1, bag], 1),
            "set 2 (set 1 + max emb + bag)": product}


def main(where: Path, raters: list[str]) -> None:
    from reinf.bench.raters import load_rater
    from reinf.bench.rating_study import judge, summarise

    rows = json.loads((where / "replies.json").read_text())
    sets = feature_sets(torch.load(where / "features.pt"), rows)
    wanted = os.environ.get("STUDY_SETS")
    if wanted:
        sets = {k: v for k, v in sets.items() if k in wanted.split(",")}
    groups: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(r["group"], []).append(i)
    result: dict[str, dict[str, list]] = {}
    for name in raters:
        rater = load_rater(name, seed=0)
        scores = [float(rater(r["prompt"], r["text"])) for r in rows]
        for label, x in sets.items():
            accuracy = [summarise([judge(x, scores, groups, n, seed=d) for d in range(DRAWS)])
                        ["within_prompt_accuracy"] for n in COUNTS]
            result.setdefault(name, {})[label] = accuracy
            print(f"{name:<44} {label:<30} "
                  + " ".join("  -  " if a is None else f"{a:.3f}" for a in accuracy), flush=True)
    (where / "bag-judged.json").write_text(json.dumps(result, indent=1))
    print("\nmean within-prompt accuracy over the raters, after", " / ".join(map(str, COUNTS)))
    for label in sets:
        columns = []
        for j in range(len(COUNTS)):
            values = [result[r][label][j] for r in raters if result[r][label][j] is not None]
            columns.append(sum(values) / len(values))
        print(f"  {label:<30} " + " / ".join(f"{c:.3f}" for c in columns))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(Path(sys.argv[1]), sys.argv[2].split(","))
