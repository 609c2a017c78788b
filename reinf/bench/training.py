"""How long a PPO round takes, against a bare LoRA forward+backward over the same tokens.

``measure_round(config, n_samples=64)`` builds ``n_samples`` synthetic rated turns (random
prompt and reply tokens, behaviour log-probs from the policy itself, rewards +-1), then
times, on the same model and the same minibatches:

- bare: one LoRA forward + backward pass over every minibatch (no optimizer step), the
  cost of one epoch of plain fine-tuning on these tokens; timed before and after the round
  and averaged, since the load of a shared machine drifts;
- round: what ``train_round`` does after loading the model: the no-grad pass for the old
  policy, reference and values, ``ppo_epochs`` epochs of updates, the exact-KL pass, and
  writing the checkpoint (into a temporary directory).

It reports seconds, their ratio, and peak memory: the process's peak RSS (Linux's
``ru_maxrss``, so it includes everything the process held before) and, on CUDA, the peak
allocated GPU memory. ``reinf bench speed`` reuses it.
"""
from __future__ import annotations

import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from reinf.training import checkpoints
from reinf.training.ppo import (Hyper, KLController, Policy, ValueHead, build_rollout,
                                train_policy, update_mode)


def measure_round(config, n_samples: int = 64, *, loaded=None, prompt_tokens: int = 32,
                  reply_tokens: int = 32, seed: int = 0) -> dict[str, Any]:
    """Time one PPO round on ``n_samples`` synthetic turns; see the module docstring.

    ``loaded``: a ``reinf.model.modeling.LoadedModel`` (or anything with ``model``, ``device``,
    ``dtype``, ``name``), e.g. a randomly initialised model built in memory; default: the
    configured model, loaded for training. Its model gets a fresh LoRA adapter.
    """
    from reinf.model.modeling import quiet_peft
    from reinf.training.session import (fresh_adapter, load_base, prepare_for_training,
                                        resolve_train_device)

    if loaded is None:
        loaded = load_base(config, resolve_train_device(config)[0])
    device = torch.device(loaded.device)
    model = prepare_for_training(loaded, config.ppo.gradient_checkpointing)
    torch.manual_seed(seed)
    with quiet_peft():
        peft_model = fresh_adapter(model, config, seed=seed)
    policy = Policy(peft_model,
                    ValueHead(model.config.get_text_config().hidden_size).to(device),
                    amp_dtype=torch.bfloat16 if device.type == "cuda"
                    and torch.cuda.is_bf16_supported() else None)
    hp = Hyper.from_config(config.ppo)
    b = _synthetic_batch(model, n_samples, prompt_tokens, reply_tokens, seed, device)
    minibatches = [torch.arange(s, min(s + hp.batch_size, n_samples), device=device)
                   for s in range(0, n_samples, hp.batch_size)]
    _bare_pass(policy, b, minibatches[:1])                 # warm-up (allocations, kernels)
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    _bare_pass(policy, b, minibatches)
    _sync(device)
    bare = time.perf_counter() - started

    optimizer = torch.optim.AdamW(policy.parameters(), lr=config.ppo.learning_rate,
                                  weight_decay=0.0)
    kl_ctl = KLController(config.ppo.kl_coef, config.ppo.kl_target, config.ppo.kl_horizon,
                          config.ppo.adaptive_kl)
    started = time.perf_counter()
    metrics = train_policy(policy, optimizer, b, kl_ctl, hp, seed=seed)
    _sync(device)
    updated = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        checkpoints.write_checkpoint(Path(tmp), "speed", model=policy.model,
                                     value_head=policy.value_head,
                                     state={"optimizer": optimizer.state_dict()},
                                     metrics=metrics)
    finished = time.perf_counter()
    round_seconds = finished - started
    # The bare pass again, after the round: on a shared machine the load drifts, and the
    # mean of a pass before and one after is a fairer yardstick than either.
    again = time.perf_counter()
    _bare_pass(policy, b, minibatches)
    _sync(device)
    bare_after = time.perf_counter() - again
    bare_before, bare = bare, (bare + bare_after) / 2
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss_bytes = rss if sys.platform == "darwin" else rss * 1024
    return {
        "model": str(getattr(loaded, "name", "")), "device": str(device),
        "dtype": str(getattr(loaded, "dtype", model.dtype)).replace("torch.", ""),
        "threads": torch.get_num_threads(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "trainable_parameters": sum(p.numel() for p in policy.parameters()),
        "samples": n_samples, "prompt_tokens": prompt_tokens, "reply_tokens": reply_tokens,
        "batch_size": hp.batch_size, "ppo_epochs": hp.ppo_epochs,
        "epochs_run": metrics["epochs_run"],
        "seconds_round": round_seconds, "seconds_update": updated - started,
        "seconds_checkpoint": finished - updated, "seconds_bare_fwd_bwd": bare,
        "seconds_bare_before": bare_before, "seconds_bare_after": bare_after,
        "ratio_round_to_bare": round_seconds / bare if bare > 0 else float("nan"),
        "peak_rss_bytes": rss_bytes,
        "peak_cuda_bytes": torch.cuda.max_memory_allocated() if device.type == "cuda" else None,
        "kl": metrics["kl"], "approx_kl": metrics["approx_kl"],
    }


def _synthetic_batch(model, n, prompt_tokens, reply_tokens, seed, device):
    gen = torch.Generator().manual_seed(seed)
    vocab = model.get_input_embeddings().num_embeddings
    ids = torch.randint(0, vocab, (n, prompt_tokens + reply_tokens), generator=gen).tolist()
    # logprobs None: as if sampled by the adapter the round starts from, like a round's own
    # rollouts (train_policy takes the round-start pass as their behaviour)
    episodes = [(row[:prompt_tokens], row[prompt_tokens:], None, 1.0,
                 1.0 if i % 2 else -1.0, 1.0) for i, row in enumerate(ids)]
    return build_rollout(episodes, device)


def _bare_pass(policy, b, minibatches) -> None:
    with update_mode(policy.model):
        for idx in minibatches:
            mb = b.select(idx)
            out = policy.forward(mb, values=False)
            (-(out.logp * mb.mask).sum() / mb.mask.sum()).backward()
    policy.model.zero_grad(set_to_none=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def build_random_model(name: str = "qwen2.5-0.5b", dtype: torch.dtype = torch.float32,
                       device: str = "cpu"):
    """A randomly initialised model with a real architecture's dimensions (no download),
    wrapped like a LoadedModel for :func:`measure_round`."""
    from types import SimpleNamespace

    from transformers import Qwen2Config, Qwen2ForCausalLM

    dims = {"qwen2.5-0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                                 num_key_value_heads=2, intermediate_size=4864,
                                 vocab_size=151936, tie_word_embeddings=True,
                                 max_position_embeddings=32768)}[name]
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**dims)).to(device=device, dtype=dtype).eval()
    return SimpleNamespace(model=model, tokenizer=None, device=device, dtype=dtype,
                           quantization="none", name=f"random {name}", warnings=[])


if __name__ == "__main__":  # python -m reinf.bench.training [demo|qwen2.5-0.5b]
    import json

    from reinf.config import load_config

    which = sys.argv[1] if len(sys.argv) > 1 else "demo"
    cfg = load_config()
    given = None if which == "demo" else build_random_model(which)
    print(json.dumps(measure_round(cfg, loaded=given), indent=2))
