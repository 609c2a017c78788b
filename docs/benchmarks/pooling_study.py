"""Does the rating model order replies better when it also sees the *largest* value of each
feature over the reply's tokens, not only the mean? (docs/benchmarks.md, "Max-pooling over
the reply's tokens".)

A mean over a reply of ~100 tokens dilutes one telling token (a "!", a digit, "for example")
a hundredfold; a max keeps it. This study takes the replies once, keeps the product's features
(the trainer's ``reply_features``) and the max over the reply's tokens of every layer's
hidden state, and judges feature sets built from
them with ``reinf bench rating-model``'s own judge (``reinf.bench.rating_study.judge``: the
trainer's ridge ensemble fitted on one reply of n prompts, within-prompt accuracy on the
others). Three stages, each its own process, so the slow ones run once:

    REINF_HOME=... python docs/benchmarks/pooling_study.py sample DIR   # replies (23 min on 1 core)
    REINF_HOME=... python docs/benchmarks/pooling_study.py features DIR # pooled states (8 min)
    python docs/benchmarks/pooling_study.py judge DIR RATER[,RATER...]  # minutes a rater

Settings by environment: STUDY_MODEL (smollm2-135m), STUDY_PROMPTS (128), STUDY_REPLIES (4),
STUDY_DRAWS (10), STUDY_THREADS (1). Replies come from the training side of the built-in
prompt set (never the probe), at the rollouts' sampling settings, seed 0.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

MODEL = os.environ.get("STUDY_MODEL", "smollm2-135m")
PROMPTS = int(os.environ.get("STUDY_PROMPTS", 128))
REPLIES = int(os.environ.get("STUDY_REPLIES", 4))
DRAWS = int(os.environ.get("STUDY_DRAWS", 10))
COUNTS = (16, 32, 48)
SEED = 0


def load():
    from reinf.config import load_config
    from reinf.model.modeling import load_model

    config = load_config(None, environ=dict(os.environ), overrides={"model_path": MODEL})
    torch.manual_seed(SEED)
    return config, load_model(config)


def sample(out: Path) -> None:
    from reinf.bench.prompts import load_builtin, split_prompts, stream_prompts
    from reinf.model.modeling import build_prompt_ids
    from reinf.training.rollouts import sample_rollouts

    config, loaded = load()
    texts = stream_prompts(split_prompts(load_builtin())[0], SEED, PROMPTS)
    max_new = config.training.rollout_max_new_tokens or config.generation.max_new_tokens
    ids = [build_prompt_ids(loaded.tokenizer, [], t, max_history=0, max_context_tokens=0,
                            max_new_tokens=max_new) for t in texts]
    started = time.time()
    replies = sample_rollouts(
        loaded.model, loaded.tokenizer, ids, REPLIES, temperature=config.generation.temperature,
        top_p=config.generation.top_p, max_new_tokens=max_new, seed=SEED,
        batch_size=config.training.rollout_batch_size,
        progress=lambda done, total: print(f"sampled {done}/{total}", flush=True))
    rows = [{"group": r.group, "prompt": texts[r.group], "prompt_ids": list(r.prompt_ids),
             "reply_ids": list(r.reply_ids), "text": r.text} for r in replies if r.reply_ids]
    (out / "replies.json").write_text(json.dumps(rows))
    print(f"{len(rows)} replies in {time.time() - started:.0f} s")


def features(out: Path) -> None:
    """Per reply: the product's features (``reply_features``, the trainer's own), and the max
    over the reply's tokens of every layer's hidden state (layer 0: the input embeddings)."""
    from reinf.training.rating_model import reply_batch, reply_features

    _, loaded = load()
    decoder = loaded.model.get_decoder()
    rows = json.loads((out / "replies.json").read_text())
    product = reply_features(loaded.model, [(r["prompt_ids"], r["reply_ids"]) for r in rows])
    maxes = []
    with torch.no_grad():
        for start in range(0, len(rows), 16):
            chunk = rows[start:start + 16]
            ids, attention, reply, _, _ = reply_batch(
                [(r["prompt_ids"], r["reply_ids"]) for r in chunk])
            reply = reply.bool()
            hidden = torch.stack(decoder(input_ids=ids, attention_mask=attention,
                                         output_hidden_states=True,
                                         use_cache=False).hidden_states, 1).float()
            mask = reply[:, None, :, None]  # (B, layers + 1, L, H) against (B, 1, L, 1)
            maxes.append(hidden.masked_fill(~mask, float("-inf")).amax(2))
            print(f"features {start + len(chunk)}/{len(rows)}", flush=True)
    torch.save({"product": product, "max": torch.cat(maxes)}, out / "features.pt")


def feature_sets(f: dict) -> dict[str, torch.Tensor]:
    product, top = f["product"], f["max"].shape[1] - 1
    mid = (top + 1) // 2  # the product's middle layer: hidden_states[len // 2]
    return {"product": product,
            "+max emb": torch.cat([product, f["max"][:, 0]], 1),
            "+max emb, mid": torch.cat([product, f["max"][:, 0], f["max"][:, mid]], 1),
            "+max emb, last": torch.cat([product, f["max"][:, 0], f["max"][:, top]], 1),
            "+max emb twice": torch.cat([product, f["max"][:, 0], f["max"][:, 0]], 1),
            "+max mid, last": torch.cat([product, f["max"][:, mid], f["max"][:, top]], 1)}


def judge_all(out: Path, raters: list[str]) -> None:
    rows = json.loads((out / "replies.json").read_text())
    judge_sets(out / "judged.json", rows, feature_sets(torch.load(out / "features.pt")), raters)


def judge_sets(result_file: Path, rows: list[dict], sets: dict[str, torch.Tensor],
               raters: list[str]) -> None:
    """Each feature set judged for each rater (within-prompt accuracy after COUNTS ratings,
    DRAWS draws), printed as it goes and written to ``result_file`` with the means."""
    from reinf.bench.raters import load_rater
    from reinf.bench.rating_study import judge, summarise

    groups: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(r["group"], []).append(i)
    result: dict[str, dict[str, list]] = {}
    for name in raters:
        rater = load_rater(name, seed=SEED)
        scores = [float(rater(r["prompt"], r["text"])) for r in rows]
        for label, x in sets.items():
            accuracy = [summarise([judge(x, scores, groups, n, seed=d) for d in range(DRAWS)])
                        ["within_prompt_accuracy"] for n in COUNTS]
            result.setdefault(name, {})[label] = accuracy
            print(f"{name:<44} {label:<30} "
                  + " ".join("  -  " if a is None else f"{a:.3f}" for a in accuracy), flush=True)
    result_file.write_text(json.dumps(result, indent=1))
    print("\nmean within-prompt accuracy over the raters, after", " / ".join(map(str, COUNTS)))
    for label in sets:
        columns = []
        for j in range(len(COUNTS)):
            values = [result[r][label][j] for r in raters if result[r][label][j] is not None]
            columns.append(sum(values) / len(values))
        print(f"  {label:<30} " + " / ".join(f"{c:.3f}" for c in columns))


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("STUDY_THREADS", 1)))
    stage, where = sys.argv[1], Path(sys.argv[2])
    where.mkdir(parents=True, exist_ok=True)
    if stage == "sample":
        sample(where)
    elif stage == "features":
        features(where)
    elif stage == "judge":
        judge_all(where, sys.argv[3].split(","))
    else:
        sys.exit(f"unknown stage {stage!r}: sample, features or judge")
