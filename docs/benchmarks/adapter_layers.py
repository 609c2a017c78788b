"""Where in the model a checkpoint's adapter moved, layer by layer (docs/benchmarks.md,
"The anchor's gradient, and where the drift lives").

For each checkpoint directory: the norm of each decoder layer's LoRA update
(scale x B @ A, summed over the layer's adapted modules), and the sum of the optimizer's
second moments (AdamW's ``exp_avg_sq``, from ``trainer_state.pt``) over that layer's LoRA
weights: where the gradients the round stepped on were large. Two runs on one seed, one
with the anchor and one without, show which layers the anchor's gradient lands on. Each
checkpoint after the first also gets the cosine of its whole update with the first's
(1: the same direction, however far; 0: unrelated), e.g. a run at half the learning rate
against the default's on the same seed.

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


Pairs = dict[str, tuple[torch.Tensor, torch.Tensor]]


def lora_pairs(checkpoint: Path | Pairs) -> Pairs:
    """Each adapted module's (scale B, A), by the name of its A weight (already loaded
    pairs are passed through, so a checkpoint read once serves every figure)."""
    if isinstance(checkpoint, dict):
        return checkpoint
    from safetensors.torch import load_file

    config = json.loads((checkpoint / "adapter_config.json").read_text())
    scale = config["lora_alpha"] / config["r"]
    weights = load_file(str(checkpoint / "adapter_model.safetensors"))
    return {name: (scale * weights[name.replace("lora_A", "lora_B")].float(), a.float())
            for name, a in weights.items() if "lora_A" in name}


def module_dot(x: tuple[torch.Tensor, torch.Tensor], y: tuple[torch.Tensor, torch.Tensor]
               ) -> float:
    """<B1 A1, B2 A2> = sum((B1^T B2) * (A1 A2^T)): no full-size matrix is built."""
    return float(((x[0].T @ y[0]) * (x[1] @ y[1].T)).sum())


def update_norms(checkpoint: Path | Pairs) -> dict[int, float]:
    """Each layer's LoRA update norm, sqrt of the sum over its modules of |scale B A|^2."""
    pairs = lora_pairs(checkpoint)
    squares: dict[int, float] = defaultdict(float)
    for name, pair in pairs.items():
        if layer_of(name) is not None:
            squares[layer_of(name)] += module_dot(pair, pair)
    return {layer: max(value, 0.0) ** 0.5 for layer, value in sorted(squares.items())}


def update_cosine(first: Path | Pairs, other: Path | Pairs) -> float:
    """The cosine of two checkpoints' whole updates (every module's B A, as one vector)."""
    one, two = lora_pairs(first), lora_pairs(other)
    if one.keys() != two.keys():
        sys.exit("the two checkpoints adapt different modules: no cosine")

    def inner(x: Pairs, y: Pairs) -> float:
        return sum(module_dot(x[n], y[n]) for n in x)

    denominator = (inner(one, one) * inner(two, two)) ** 0.5
    return inner(one, two) / denominator if denominator else 0.0


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
    first = None
    for path in map(Path, paths):
        pairs = lora_pairs(path)
        norms, moments = update_norms(pairs), second_moments(path)
        total = sum(v * v for v in norms.values()) ** 0.5
        against = f", cosine with the first {update_cosine(first, pairs):.2f}" \
            if first is not None else ""
        first = pairs if first is None else first
        print(f"{path}: |update| {total:.2f}{against}")
        print("  layer " + " ".join(f"{n:>7d}" for n in norms))
        print("  update" + " ".join(f"{v:7.2f}" for v in norms.values()))
        if moments:
            print("  v sum " + " ".join(f"{v:7.1e}" for v in moments.values()))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
