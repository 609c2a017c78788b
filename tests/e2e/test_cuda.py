"""The CUDA tier: the engine, the trainer and bitsandbytes bases on a real GPU.

Every test here skips on a machine without CUDA (CI has none); they run where a GPU is
(`python -m pytest tests/e2e/test_cuda.py`). The bitsandbytes tests also skip without
bitsandbytes (`pip install 'reinf[cuda]'`). What each checks is what only a GPU shows:
bf16 serving with sane behaviour log-probs, a hot swap on the GPU, 4-bit and 8-bit bases
that serve and train, and PPO on the GPU moving the policy the rewarded way.
"""
from __future__ import annotations

import math

import pytest
import torch

import trainkit as tk
from reinf.serving.engine import Engine
from reinf.storage.store import Store
from reinf.training.trainer import train_round
from tiny import make_adapter, make_tiny_model

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
QUANTS = ["4bit", "8bit"]


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A tiny model wide enough for bitsandbytes' kernels (64-wide rows)."""
    root = tmp_path_factory.mktemp("cuda")
    model = make_tiny_model(root / "wide", hidden_size=64, intermediate_size=128)
    return {"model": model, "adapter": make_adapter(model, root / "ckpt-a", seed=1)}


def needs_bitsandbytes():
    pytest.importorskip("bitsandbytes")


def test_engine_serves_in_bf16_on_the_gpu_and_swaps_an_adapter(config, wide):
    engine = Engine.load(config.replace(model_path=str(wide["model"]), device="cuda",
                                        max_new_tokens=12))
    d = engine.describe()
    assert d["device_in_use"].startswith("cuda") and d["dtype"] == "bfloat16", d
    base = engine.generate([], "Hello there", temperature=1.0, seed=0)
    assert base.reply_ids and all(math.isfinite(x) and x <= 0 for x in base.logprobs)
    assert engine.request_swap("ckpt-a", wide["adapter"]) >= 0
    swapped = engine.generate([], "Hello there", temperature=1.0, seed=0)
    assert swapped.checkpoint_id == "ckpt-a"
    # same seed, same prompt: a non-zero adapter changes what the model says or how sure it is
    assert (swapped.reply_ids, swapped.logprobs) != (base.reply_ids, base.logprobs)


@pytest.mark.parametrize("quant", QUANTS)
def test_engine_serves_a_quantized_base(config, wide, quant):
    needs_bitsandbytes()
    engine = Engine.load(config.replace(model_path=str(wide["model"]), device="cuda",
                                        quantization=quant, max_new_tokens=8))
    d = engine.describe()
    assert d["quantization_in_use"] == quant, d
    reply = engine.generate([], "Hello there", temperature=1.0, seed=0)
    assert reply.reply_ids and all(math.isfinite(x) and x <= 0 for x in reply.logprobs)
    engine.request_swap("ckpt-a", wide["adapter"])
    assert engine.generate([], "Hi", temperature=1.0, seed=1).checkpoint_id == "ckpt-a"


def test_ppo_on_the_gpu_moves_the_policy_the_rewarded_way(home, tmp_path):
    model_dir = tk.make_model(tmp_path)
    config = tk.train_config(home, model_dir, device="cuda", train_device="cuda")
    store = Store.open(config)
    base = tk.load_policy(model_dir)
    good0 = tk.first_token_logp(base, tk.GOOD)
    bad0 = tk.first_token_logp(base, tk.BAD)
    active = None
    for round_ in range(3):
        policy = tk.load_policy(model_dir, active.path if active else None)
        tk.add_rated_turns(store, policy, 16, seed=round_,
                           checkpoint_id=active.id if active else None)
        result = train_round(config, store)
        assert result.status == "succeeded", result.message
        assert result.metrics["device"].startswith("cuda")
        active = store.active_checkpoint()
    trained = tk.load_policy(model_dir, active.path)  # the checkpoint loads on the CPU
    assert tk.first_token_logp(trained, tk.GOOD) > good0 + 0.1
    assert tk.first_token_logp(trained, tk.BAD) < bad0 - 0.1


@pytest.mark.parametrize("quant", QUANTS)
def test_a_round_trains_an_adapter_on_a_quantized_base(home, wide, quant):
    needs_bitsandbytes()
    config = tk.train_config(home, wide["model"], device="cuda", quantization=quant,
                             training_base_quantization=quant, gradient_checkpointing=True)
    store = Store.open(config)
    tk.add_rated_turns(store, tk.load_policy(wide["model"]), 8, seed=0)
    result = train_round(config, store)
    assert result.status == "succeeded", result.message
    assert result.metrics["device"].startswith("cuda")
    assert tk.lora_vector(store.get_checkpoint(result.checkpoint_id).path).abs().max() > 0
