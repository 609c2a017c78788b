"""General-text perplexity of saved checkpoints against their base (docs/benchmarks.md,
"General text, and what learning a style costs it").

`reinf bench learn` measures the general-text perplexity (``reinf.bench.probe``) of the
base and of each run's final policy. This measures it for any checkpoint directories a run
kept (a data directory's ``checkpoints/``), so the rounds in between, or runs from before
the figure existed, can be read too:

    python docs/benchmarks/general_text_checkpoints.py MODEL_DIR CHECKPOINT_DIR ...

It prints the base's general-text perplexity and the demo corpus's held-out one (50 items,
as ``--heldout 50``), then each checkpoint's, with the change. One thread; about a minute a
checkpoint for smollm2-135m on one CPU core.
"""
from __future__ import annotations

import sys

import torch


def main(model_dir: str, checkpoints: list[str]) -> None:
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
    for path in checkpoints:
        g, c = perplexities(load_policy(config, path, cache=cache))
        print(f"{path}: general text {g:.3f} ({g / base_general - 1:+.1%}), demo corpus "
              f"{c:.3f} ({c / base_corpus - 1:+.1%})", flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
