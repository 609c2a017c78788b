"""Which of the adapter's layers carry the general-text drift, and which the person's style
(docs/benchmarks.md, "The anchor's gradient, and where the drift lives").

A learning run keeps its checkpoints. This takes one, and for each set of layers given,
a copy of its adapter with those layers' LoRA update set to zero (``lora_B`` = 0: the
layer is the base's again), and for each factor given a copy with the whole update scaled
by it (a shorter or slower run's update, to first order), then measures each copy as
`reinf bench learn` measures a checkpoint: the general-text perplexity against the
base's, and the mean rating of the rater over the first N held-out probe prompts, sampled
with the bench's probe seeds (so reply j of every copy answers the same prompt with the
same seed: a paired comparison).

    python docs/benchmarks/layer_drift_study.py MODEL RATER CHECKPOINT_DIR \\
        [--probe 64] [--drop 0-2] [--drop 27-29] [--scale 0.5] ...

One thread; for smollm2-135m about three minutes a copy on one free CPU core (64 probe
replies and the general text).
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

import torch
from adapter_layers import layer_of  # docs/benchmarks, beside this script


def layer_range(text: str) -> list[int]:
    """"0-2" -> [0, 1, 2]; "5" -> [5]."""
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def without_layers(checkpoint: Path, layers: list[int], into: Path, *,
                   scale: float = 0.0) -> Path:
    """A copy of ``checkpoint`` whose LoRA update on ``layers`` is ``scale`` times its own
    (0: the layer is the base's again)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(checkpoint, into)
    weights_file = into / "adapter_model.safetensors"
    weights = load_file(str(weights_file))
    changed = 0
    for name, tensor in weights.items():
        if "lora_B" in name and layer_of(name) in layers:
            weights[name] = tensor * scale
            changed += 1
    if layers and not changed:
        raise SystemExit(f"no LoRA weights of layers {layers} in {checkpoint}")
    save_file(weights, str(weights_file), metadata={"format": "pt"})
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="as for `reinf bench learn --model`")
    parser.add_argument("rater")
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--probe", type=int, default=64)
    parser.add_argument("--drop", action="append", default=[], type=layer_range,
                        help="layers whose update is set to zero, e.g. 0-2 (repeat)")
    parser.add_argument("--scale", action="append", default=[], type=float,
                        help="also the whole update scaled by this, e.g. 0.5 (repeat)")
    parser.add_argument("--no-whole", action="store_true",
                        help="skip the whole adapter (measured by an earlier call)")
    args = parser.parse_args()

    from reinf.bench.harness import PROBE_SEED
    from reinf.bench.probe import (load_general_text, load_heldout, load_policy,
                                   measure_policy, sample_probe)
    from reinf.bench.prompts import build_prompt_plan
    from reinf.bench.raters import load_rater
    from reinf.config import load_config
    from reinf.serving.engine import Engine

    torch.set_num_threads(1)
    config = load_config(None, overrides={"model_path": args.model})
    plan = build_prompt_plan(demo=False, seeds=[0], ratings=8)
    prompts = plan.probe[:args.probe]
    engine = Engine.load(config)
    cache: dict = {}  # the base for the perplexities, loaded apart from the engine's
    general, heldout = load_general_text(engine.tokenizer), load_heldout(engine.tokenizer, 50)

    def measure(name: str, path: Path | None) -> tuple[float, float]:
        if path is not None:
            engine.request_swap(name, path)
        judge = load_rater(args.rater, seed=PROBE_SEED)
        replies = sample_probe(engine, prompts, 0, len(prompts), seed=PROBE_SEED)
        rating = statistics.fmean(judge(r.prompt, r.text) for r in replies)
        m = measure_policy(load_policy(config, path, cache=cache), [], heldout, adapter=False,
                           general=general)
        return rating, m["perplexity_general"]

    base_rating, base_general = measure("base", None)
    print(f"base: probe mean {base_rating:.2f} ({len(prompts)}), general text "
          f"{base_general:.2f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        every = sorted({layer_of(n) for n in load_names(args.checkpoint)} - {None})
        copies = ([] if args.no_whole else [("whole adapter", "whole", [], 0.0)])
        copies += [(f"without layers {d[0]}-{d[-1]}", "drop-" + "-".join(map(str, d)), d, 0.0)
                   for d in args.drop]
        copies += [(f"the update scaled by {f:g}", f"scale-{f:g}", every, f)
                   for f in args.scale]
        for label, name, layers, factor in copies:
            path = without_layers(args.checkpoint, layers, Path(tmp) / name, scale=factor)
            rating, general_ppl = measure(name, path)
            print(f"{label}: probe mean {rating:.2f} ({rating - base_rating:+.2f}), general "
                  f"text {general_ppl:.2f} ({general_ppl / base_general - 1:+.1%})", flush=True)


def load_names(checkpoint: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(checkpoint / "adapter_model.safetensors"), framework="pt") as f:
        return list(f.keys())


if __name__ == "__main__":
    main()
