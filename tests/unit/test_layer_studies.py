"""The layer studies in docs/benchmarks (adapter_layers.py, layer_drift_study.py) read and
rewrite a checkpoint's adapter files: on a hand-made checkpoint of two layers, each
figure they print is worked out here by hand."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

pytestmark = pytest.mark.stack  # safetensors and torch: run again on the minimum versions
ROOT = Path(__file__).resolve().parents[2]


def study(name: str):
    """The script as a module, its directory on sys.path as when it is run."""
    scripts = str(ROOT / "docs" / "benchmarks")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    spec = importlib.util.spec_from_file_location(name,
                                                  ROOT / "docs" / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def name(layer: int, module: str, ab: str) -> str:
    return f"base_model.model.model.layers.{layer}.self_attn.{module}_proj.lora_{ab}.weight"


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    """Two layers, q and v adapted, r 1, alpha 2 (scale 2). Layer 0's q update is
    2 * [[3], [0]] @ [[1, 0]] (norm 6), its v update 2 * [[0], [4]] @ [[0, 1]] (norm 8), so
    layer 0 moved by 10; layer 1's are zero (B = 0)."""
    weights = {name(0, "q", "A"): torch.tensor([[1.0, 0.0]]),
               name(0, "q", "B"): torch.tensor([[3.0], [0.0]]),
               name(0, "v", "A"): torch.tensor([[0.0, 1.0]]),
               name(0, "v", "B"): torch.tensor([[0.0], [4.0]]),
               name(1, "q", "A"): torch.tensor([[1.0, 1.0]]),
               name(1, "q", "B"): torch.zeros(2, 1),
               name(1, "v", "A"): torch.tensor([[1.0, 1.0]]),
               name(1, "v", "B"): torch.zeros(2, 1)}
    path = tmp_path / "r0001"
    path.mkdir()
    save_file(weights, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps({"r": 1, "lora_alpha": 2}))
    # the optimizer's state, in the sorted order of the names: 0 = layer 0 q A, 1 = q B,
    # 2 = v A, 3 = v B, 4..7 = layer 1; exp_avg_sq filled with the index
    state = {i: {"exp_avg_sq": torch.full_like(weights[n], float(i))}
             for i, n in enumerate(sorted(weights))}
    torch.save({"optimizer": {"state": state}}, path / "trainer_state.pt")
    return path


def test_each_layers_update_and_second_moments(checkpoint):
    layers = study("adapter_layers")
    norms = layers.update_norms(checkpoint)
    assert norms == pytest.approx({0: 10.0, 1: 0.0})
    # layer 0: 2 * (0 + 1 + 2 + 3) = 12 (two entries each); layer 1: 2 * (4 + 5 + 6 + 7) = 44
    assert layers.second_moments(checkpoint) == pytest.approx({0: 12.0, 1: 44.0})


def test_the_cosine_of_two_updates(checkpoint, tmp_path):
    """Against itself 1, against its half 1 (direction, not size); with layer 0's v update
    dropped, 6 / 10 (the q update is 6 of the norm 10, and v is orthogonal to it); with
    layer 0's q update's sign flipped, (-36 + 64) / 100."""
    layers, drift = study("adapter_layers"), study("layer_drift_study")
    assert layers.update_cosine(checkpoint, checkpoint) == pytest.approx(1.0)
    half = drift.without_layers(checkpoint, [0, 1], tmp_path / "half", scale=0.5)
    assert layers.update_cosine(checkpoint, half) == pytest.approx(1.0)
    weights = load_file(str(checkpoint / "adapter_model.safetensors"))
    for target, change in (("no-v", {name(0, "v", "B"): torch.zeros(2, 1)}),
                           ("flip-q", {name(0, "q", "B"): torch.tensor([[-3.0], [0.0]])})):
        other = tmp_path / target
        other.mkdir()
        save_file({**weights, **change}, str(other / "adapter_model.safetensors"))
        (other / "adapter_config.json").write_text(
            (checkpoint / "adapter_config.json").read_text())
        want = 0.6 if target == "no-v" else 0.28
        assert layers.update_cosine(checkpoint, other) == pytest.approx(want)


def test_dropping_or_scaling_layers_changes_only_their_update(checkpoint, tmp_path):
    drift = study("layer_drift_study")
    assert drift.layer_range("0-2") == [0, 1, 2] and drift.layer_range("5") == [5]
    copy = drift.without_layers(checkpoint, [0], tmp_path / "copy")
    weights = load_file(str(copy / "adapter_model.safetensors"))
    assert float(weights[name(0, "q", "B")].abs().sum()) == 0.0
    assert float(weights[name(0, "q", "A")].abs().sum()) == 1.0  # A kept: B = 0 is enough
    assert study("adapter_layers").update_norms(copy) == pytest.approx({0: 0.0, 1: 0.0})
    assert load_file(str(checkpoint / "adapter_model.safetensors"))[name(0, "v", "B")][1, 0] == 4
    half = drift.without_layers(checkpoint, [0, 1], tmp_path / "half", scale=0.5)
    assert study("adapter_layers").update_norms(half) == pytest.approx({0: 5.0, 1: 0.0})
    assert drift.layer_of(name(1, "v", "B")) == 1 and drift.layer_of("lm_head.weight") is None
    with pytest.raises(SystemExit, match="no LoRA weights of layers"):
        drift.without_layers(checkpoint, [7], tmp_path / "none")
