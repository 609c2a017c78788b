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
    from pooling_study import judge_sets  # beside this file: the same judge and table

    rows = json.loads((where / "replies.json").read_text())
    sets = feature_sets(torch.load(where / "features.pt"), rows)
    wanted = os.environ.get("STUDY_SETS")
    if wanted:
        sets = {k: v for k, v in sets.items() if k in wanted.split(",")}
    judge_sets(where / "bag-judged.json", rows, sets, raters)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(Path(sys.argv[1]), sys.argv[2].split(","))
