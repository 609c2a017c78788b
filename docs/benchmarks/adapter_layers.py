"""Where in the model a checkpoint's adapter moved, layer by layer (docs/benchmarks.md,
"The anchor's gradient, and where the drift lives").

For each checkpoint directory: the norm of each decoder layer's LoRA update
(scale x B @ A, summed over the layer's adapted modules), and the sum of the optimizer's
second moments (AdamW's ``exp_avg_sq``, from ``trainer_state.pt``) over that layer's LoRA
weights: where the gradients the round stepped on were large. Two runs on one seed, one
with the anchor and one without, show which layers the anchor's gradient lands on.

    python docs/benchmarks/adapter_layers.py CHECKPOINT_DIR [CHECKPOINT_DIR ...]

Reads files only (no model): a second a checkpoint.
"""
from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import torch

LAYER = re.compile(r"layers\.(\d+)\.")


def layer_of(name: str) -> int | None:
    match = LAYER.search(name)
    return int(match.group(1)) if match else None


def update_norms(checkpoint: Path) -> dict[int, float]:
    """Each layer's LoRA update norm, sqrt of the sum over its modules of |scale B A|^2."""
    from safetensors.torch import load_file

    config = json.loads((checkpoint / "adapter_config.json").read_text())
    scale = config["lora_alpha"] / config["r"]
    weights = load_file(str(checkpoint / "adapter_model.safetensors"))
    squares: dict[int, float] = defaultdict(float)
    for name, a in weights.items():
        if "lora_A" not in name or layer_of(name) is None:
            continue
        b = weights[name.replace("lora_A", "lora_B")]
        squares[layer_of(name)] += float((scale * b.float() @ a.float()).norm()) ** 2
    return {layer: value ** 0.5 for layer, value in sorted(squares.items())}


def second_moments(checkpoint: Path) -> dict[int, float] | None:
    """Each layer's sum of AdamW's exp_avg_sq over its LoRA weights. The optimizer keeps
    them in the order of the trainable parameters, sorted by name (Policy.parameters)."""
    from safetensors.torch import load_file

    state_file = checkpoint / "trainer_state.pt"
    if not state_file.is_file():
        return None
    names = sorted(load_file(str(checkpoint / "adapter_model.safetensors")))
    state = torch.load(state_file, map_location="cpu", weights_only=False)["optimizer"]["state"]
    sums: dict[int, float] = defaultdict(float)
    for index, name in enumerate(names):
        if index in state and layer_of(name) is not None:
            sums[layer_of(name)] += float(state[index]["exp_avg_sq"].sum())
    return dict(sorted(sums.items()))


def main(paths: list[str]) -> None:
    for path in map(Path, paths):
        norms, moments = update_norms(path), second_moments(path)
        total = sum(v * v for v in norms.values()) ** 0.5
        print(f"{path}: |update| {total:.2f}")
        print("  layer " + " ".join(f"{n:>7d}" for n in norms))
        print("  update" + " ".join(f"{v:7.2f}" for v in norms.values()))
        if moments:
            print("  v sum " + " ".join(f"{v:7.1e}" for v in moments.values()))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
