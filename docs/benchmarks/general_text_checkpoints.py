"""General-text perplexity of saved checkpoints against their base (docs/benchmarks.md,
"General text, and what learning a style costs it").

`reinf bench learn` measures the general-text perplexity (``reinf.bench.probe``) of the
base and of each run's final policy. This measures it for any checkpoint directories a run
kept (a data directory's ``checkpoints/``), so the rounds in between, or runs from before
the figure existed, can be read too:

    python docs/benchmarks/general_text_checkpoints.py [--drift ANCHOR_FILE] MODEL_DIR \
        CHECKPOINT_DIR ...

It prints the base's general-text perplexity and the demo corpus's held-out one (50 items,
as ``--heldout 50``), then each checkpoint's, with the change. ``--drift`` adds the drift
budget's own figure (``training.drift_budget``, reinf.training.budget): the drift on the
first ``DRIFT_TEXTS`` passages of an anchor file a run kept (``<data_dir>/anchor/*.json``),
so the two can be set side by side ("The drift budget" in docs/benchmarks.md). One thread;
about a minute a checkpoint for smollm2-135m on one CPU core.
"""
from __future__ import annotations

import math
import sys

import torch


def main(model_dir: str, checkpoints: list[str], anchor_file: str | None = None) -> None:
    from reinf.bench.probe import load_general_text, load_heldout, load_policy, measure_policy
    from reinf.config import load_config

    torch.set_num_threads(1)
    config = load_config(None, environ={}, overrides={"model_path": model_dir})
    cache: dict = {}     # the base, loaded once; each policy is a copy with its adapter
    base = load_policy(config, None, cache=cache)
    tokenizer = cache["base_model"].tokenizer
    general, heldout = load_general_text(tokenizer), load_heldout(tokenizer, 50)

    def perplexities(policy) -> tuple[float, float]:
        m = measure_policy(policy, [], heldout, adapter=False, batch_size=16, general=general)
        return m["perplexity_general"], m["perplexity"]

    base_general, base_corpus = perplexities(base)
    print(f"base: general text {base_general:.3f}, demo corpus {base_corpus:.3f}", flush=True)
    passages = own_text(anchor_file) if anchor_file else None
    for path in checkpoints:
        policy = load_policy(config, path, cache=cache)
        g, c = perplexities(policy)
        drift = ""
        if passages is not None:
            from reinf.training.budget import drift_kl
            drift = f", drift {math.expm1(drift_kl(policy, passages, 16)):+.1%}"
        print(f"{path}: general text {g:.3f} ({g / base_general - 1:+.1%}), demo corpus "
              f"{c:.3f} ({c / base_corpus - 1:+.1%}){drift}", flush=True)


def own_text(anchor_file: str):
    """The drift budget's passages: the first DRIFT_TEXTS of a kept anchor file."""
    from reinf.training.anchor import read_episodes
    from reinf.training.budget import DRIFT_TEXTS
    from reinf.training.ppo import build_rollout

    return build_rollout(read_episodes(anchor_file)[:DRIFT_TEXTS])


if __name__ == "__main__":
    args = sys.argv[1:]
    anchor = None
    if args[:1] == ["--drift"] and len(args) > 1:
        anchor, args = args[1], args[2:]
    if len(args) < 2:
        sys.exit(__doc__)
    main(args[0], args[1:], anchor)
