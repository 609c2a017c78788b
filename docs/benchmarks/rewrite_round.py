"""Does one round with rewrites teach the real model a list? (docs/benchmarks.md, "Rewrites:
the reply the person wanted".)

In a temporary data directory of its own (``reinf.bench.harness.bench_home``), the model
answers the first 12 training-side prompts of the built-in set (one batch, seed 7); the
bullets rater rates each, and the first 6 that its rewriter can turn into a list are
rewritten (``reinf.bench.text_raters.rewrite_as_list``). One round trains with
``training.rewrite_imitation`` = COEF, the new adapter is swapped in, and it answers the
first 16 probe-side prompts (one batch, seed 1000003), which the bullets rater rates. With
``base`` instead of a coefficient, the base model answers the same 16 prompts and nothing
trains. One JSON line at the end:

    REINF_HOME=... python docs/benchmarks/rewrite_round.py base
    REINF_HOME=... python docs/benchmarks/rewrite_round.py 0
    REINF_HOME=... python docs/benchmarks/rewrite_round.py 1

MODEL (default smollm2-135m, pulled into REINF_HOME) picks the model; SEED (default 0)
another draw: the next 12 training prompts and 16 probe prompts, and seeds moved by SEED.
One torch thread.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch

from reinf.bench.harness import bench_home
from reinf.bench.prompts import load_builtin, split_prompts
from reinf.bench.text_raters import list_items, rate_bullets, rewrite_as_list
from reinf.config import load_config
from reinf.serving.chat import ChatService
from reinf.serving.engine import Engine
from reinf.storage.store import Store
from reinf.training.trainer import train_round

RATED, REWRITTEN, PROBE = 12, 6, 16
STREAM_SEED, PROBE_SEED = 7, 1_000_003


def main(arg: str) -> dict:
    torch.set_num_threads(1)
    started = time.time()
    coef = None if arg == "base" else float(arg)
    config = load_config().replace(model_path=os.environ.get("MODEL", "smollm2-135m"))
    extra = {} if coef is None else {"training_rewrite_imitation": coef}
    _, cfg = bench_home(config, f"rewrite-round-{arg}", training_winrate_prompts=0, **extra)
    seed = int(os.environ.get("SEED", "0"))
    train, probe = split_prompts(load_builtin())
    train, probe = train[seed * RATED:], probe[seed * PROBE:]
    store, engine = Store.open(cfg), Engine.load(cfg)
    chat = ChatService(engine, store, cfg)
    out: dict = {"arm": arg, "seed": seed}
    if coef is not None:
        wrote = 0
        for turn in chat.send_many([p.text for p in train[:RATED]],
                                    seed=STREAM_SEED + seed):
            store.rate(turn.id, rate_bullets(turn.user_message, turn.reply))
            text = rewrite_as_list(turn.user_message, turn.reply)
            if text and wrote < REWRITTEN:
                store.rewrite(turn.id, text)
                wrote += 1
        result = train_round(cfg, store)
        out.update(status=result.status, mode=result.metrics.get("mode"),
                   kl=result.metrics.get("kl"), rewrites=result.metrics.get("rewrites"),
                   imitation_loss=result.metrics.get("imitation_loss"))
        if result.status == "succeeded":
            engine.request_swap(result.checkpoint_id,
                                store.get_checkpoint(result.checkpoint_id).path)
    replies = chat.send_many([p.text for p in probe[:PROBE]], seed=PROBE_SEED + seed)
    scores = [rate_bullets(t.user_message, t.reply) for t in replies]
    out.update(probe_mean=statistics.fmean(scores), n=len(scores),
               lists=sum(list_items(t.reply) >= 2 for t in replies),
               seconds=round(time.time() - started, 1))
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(json.dumps(main(sys.argv[1])))
