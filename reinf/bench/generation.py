"""Generation speed: time to first token, tokens/s against a bare ``model.generate``, the
trainer's batched rollout sampling against the engine's single stream, and the adapter swap
pause. ``reinf bench speed`` builds on ``measure_generation``.

Every figure comes from one run on one machine, so the ratios are what to compare across
machines; the absolute times are only meaningful with the machine named beside them.

    python -m reinf.bench.generation --model reinf-demo
    python -m reinf.bench.generation --model qwen2.5-0.5b-shape --tokenizer models/reinf-demo --json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Sequence

import torch

from reinf.config import Config, load_config
from reinf.model.modeling import LoadedModel, load_model

# Qwen2.5-0.5B's dimensions (docs/design.md §8): a random model of this shape costs what it costs.
QWEN25_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, intermediate_size=4864, vocab_size=151936,
                  max_position_embeddings=32768, tie_word_embeddings=True, rope_theta=1e6)
SHAPES = {"qwen2.5-0.5b-shape": QWEN25_05B}
PROMPTS = ("What is a cloud?", "Give me three tips for sleeping better.")
ROLLOUT_PROMPTS = PROMPTS + ("Explain how a bicycle stays upright.",
                             "Write a short note to a neighbour about a lost cat.")


def build_shaped_model(tokenizer, dims: dict[str, Any] = QWEN25_05B, *, seed: int = 0,
                       dtype: torch.dtype = torch.float32, device: str = "cpu",
                       name: str = "qwen2.5-0.5b-shape") -> LoadedModel:
    """A randomly initialised Qwen2 causal LM of the given dimensions (no download).

    ``tokenizer`` only has to produce ids below ``vocab_size`` (any chat tokenizer does).
    """
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**dims, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(device=device, dtype=dtype).eval().requires_grad_(False)
    model.generation_config = GenerationConfig(eos_token_id=config.eos_token_id,
                                               pad_token_id=config.pad_token_id)
    return LoadedModel(model, tokenizer, device, dtype, "none", name, [])


def build_random_adapter(model, out_dir: str | Path, *, r: int = 8, alpha: int = 16,
                         target_modules: str | Sequence[str] = "auto", seed: int = 0,
                         scale: float = 0.01) -> Path:
    """Write a random (non-zero) LoRA adapter for ``model`` in PEFT's format, without
    touching the model.

    ``target_modules`` is a ``lora.target_modules`` setting (auto, all-linear or names),
    resolved for this model as the trainer resolves it (``reinf.model.lora``), so any
    architecture gets the adapter its training would make. Shapes are read off the chosen
    layers: nn.Linear stores its weight as (out, in), transformers' Conv1D (GPT-2) as
    (in, out), which the adapter's config records as ``fan_in_fan_out``.
    """
    from peft import LoraConfig
    from safetensors.torch import save_file
    from transformers.pytorch_utils import Conv1D

    from reinf.model.lora import fan_in_fan_out, lora_targets, target_layers

    targets = lora_targets(model, target_modules)
    chosen = target_layers(model, targets)
    base_model = model.get_base_model() if hasattr(model, "get_base_model") else model
    modules = dict(base_model.named_modules())
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name in sorted(chosen):
        module = modules[name]
        base = module.get_base_layer() if hasattr(module, "get_base_layer") else module
        if isinstance(base, Conv1D):
            fan_in, fan_out = base.weight.shape            # (in, out)
        elif isinstance(base, torch.nn.Linear) or hasattr(base, "in_features"):
            fan_in, fan_out = base.in_features, base.out_features  # bitsandbytes' too
        else:
            raise ValueError(f"{name} is a {type(base).__name__}: random adapters cover "
                             "Linear and Conv1D layers only")
        key = f"base_model.model.{name}"
        weights[f"{key}.lora_A.weight"] = torch.randn(r, fan_in, generator=gen) * scale
        weights[f"{key}.lora_B.weight"] = torch.randn(fan_out, r, generator=gen) * scale
    if not weights:
        raise ValueError(f"lora.target_modules {target_modules!r} selects no layer of the model")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # Whole layer names where the targets are a pattern (all-linear, a regex), so the saved
    # config selects exactly the layers that have weights.
    names = list(targets) if isinstance(targets, (list, tuple)) else sorted(chosen)
    LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=names,
               fan_in_fan_out=fan_in_fan_out(model, targets),
               task_type="CAUSAL_LM").save_pretrained(str(out_dir))
    save_file(weights, str(out_dir / "adapter_model.safetensors"))
    return out_dir


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = f", GPU {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
    return (f"{platform.system()} {platform.machine()}, {cpu}, {os.cpu_count()} CPUs visible, "
            f"torch {torch.__version__} with {torch.get_num_threads()} threads{gpu}")


def _time_generate(model, ids: torch.Tensor, n: int, temperature: float, top_p: float) -> float:
    """Seconds for a bare ``model.generate`` of exactly ``n`` sampled tokens."""
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")
        started = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                             temperature=temperature, top_p=top_p, top_k=0, max_new_tokens=n,
                             min_new_tokens=n, pad_token_id=model.generation_config.pad_token_id)
        _sync(ids.device)
        elapsed = time.perf_counter() - started
    assert out.shape[1] == ids.shape[1] + n
    return elapsed


def _in_thread(fn, *args):
    """Run ``fn`` in a fresh worker thread, as the engine runs each reply. On a busy machine
    torch's intra-op threads behave very differently in the main thread (the figures can
    differ several times over), so both sides are timed from the same kind of thread."""
    out: list = []
    errors: list = []

    def target():
        try:
            out.append(fn(*args))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return out[0]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure_generation(config_or_loaded: Config | LoadedModel, prompts: Sequence[str] = PROMPTS,
                       *, config: Config | None = None, max_new_tokens: int = 32,
                       repeats: int = 2, temperature: float = 1.0, top_p: float = 1.0,
                       swaps: int = 3, seed: int = 0, rollout_batch: int = 16,
                       rollouts_per_prompt: int = 4) -> dict[str, Any]:
    """Measure our streaming engine against ``model.generate`` on the same prompts.

    ``config_or_loaded``: a Config (the model is loaded as ``reinf chat`` would) or a
    LoadedModel (e.g. from ``build_shaped_model``; ``config`` then gives the engine's
    settings). Both sides sample exactly ``max_new_tokens`` tokens (EOS ignored), after one
    warm-up each; runs alternate which goes first. Then one batch of ``rollout_batch``
    replies (``rollouts_per_prompt`` to each prompt) from the trainer's batched sampler, on
    the same model and settings (``measure_rollouts``; 0 skips it). ``swaps`` adapter swaps
    are timed with random adapters shaped by the lora settings (0 skips them). Times are
    medians.
    """
    from reinf.serving.engine import Engine

    if isinstance(config_or_loaded, LoadedModel):
        loaded, cfg = config_or_loaded, config or Config()
    else:
        cfg = config_or_loaded
        loaded = load_model(cfg)
    engine = Engine(loaded, cfg)
    model = loaded.model
    params = engine.generation_params(temperature=temperature, top_p=top_p,
                                      max_new_tokens=max_new_tokens, seed=seed)
    prompt_ids = [engine.build_prompt([], p, max_new_tokens=max_new_tokens) for p in prompts]
    n = max_new_tokens

    def ours(ids: list[int]) -> tuple[float, float]:
        reply = engine.stream_prompt(ids, params, ignore_eos=True).wait()
        assert len(reply.reply_ids) == n
        return reply.ttft_ms, reply.latency_ms

    def bare(ids: list[int], thread: bool = True) -> tuple[float, float]:
        tensor = torch.tensor([ids], device=engine.device)
        run = (lambda k: _in_thread(_time_generate, model, tensor, k, temperature, top_p)) \
            if thread else (lambda k: _time_generate(model, tensor, k, temperature, top_p))
        return run(1) * 1000, run(n) * 1000

    ours(prompt_ids[0])  # warm-up: first calls allocate and pick kernels
    bare(prompt_ids[0])
    e_ttft, e_total, g_ttft, g_total = [], [], [], []
    for r in range(repeats):
        for i, ids in enumerate(prompt_ids):
            order = (ours, bare) if (r + i) % 2 == 0 else (bare, ours)
            for fn in order:
                ttft, total = fn(ids)
                (e_ttft if fn is ours else g_ttft).append(ttft)
                (e_total if fn is ours else g_total).append(total)
    main_total = [bare(ids, thread=False)[1] for ids in prompt_ids]
    med = statistics.median
    engine_tps = n / (med(e_total) / 1000)
    generate_tps = n / (med(g_total) / 1000)
    result: dict[str, Any] = {
        "model": loaded.name, "parameters": sum(p.numel() for p in model.parameters()),
        "device": loaded.device, "dtype": str(loaded.dtype).replace("torch.", ""),
        "machine": machine(), "prompt_tokens": [len(p) for p in prompt_ids],
        "new_tokens": n, "runs": len(e_total),
        "engine": {"ttft_ms": round(med(e_ttft), 2), "tokens_per_s": round(engine_tps, 2)},
        "generate": {"ttft_ms": round(med(g_ttft), 2), "tokens_per_s": round(generate_tps, 2),
                     "tokens_per_s_main_thread": round(n / (med(main_total) / 1000), 2)},
        "ratio": {"tokens_per_s": round(engine_tps / generate_tps, 3),
                  "ttft": round(med(e_ttft) / med(g_ttft), 3)},
    }
    if rollout_batch > 0 and rollouts_per_prompt > 0:
        # Before the swaps, so the model is still the bare one the engine was timed on.
        n_prompts = -(-rollout_batch // rollouts_per_prompt)
        texts = [ROLLOUT_PROMPTS[i % len(ROLLOUT_PROMPTS)] for i in range(n_prompts)]
        rollouts = measure_rollouts(engine, [engine.build_prompt([], p, max_new_tokens=n)
                                             for p in texts],
                                    k=rollouts_per_prompt, batch_size=rollout_batch,
                                    max_new_tokens=n, temperature=temperature, top_p=top_p,
                                    repeats=repeats, seed=seed)
        rollouts["ratio_to_engine"] = round(rollouts["tokens_per_s"] / engine_tps, 3)
        result["rollouts"] = rollouts
    if swaps > 0:
        result["swap"] = measure_swaps(engine, cfg, swaps, lambda: ours(prompt_ids[0]), seed)
    return result


def measure_rollouts(engine, prompt_ids: Sequence[Sequence[int]], *, k: int, batch_size: int,
                     max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
                     repeats: int = 1, seed: int = 0) -> dict[str, Any]:
    """Tokens/s of the trainer's batched sampler (``sample_rollouts``): ``k`` replies to each
    of the prompts, ``batch_size`` rows at a time, on the engine's model as it stands.

    The sampler has no way to ignore EOS, so replies stop as in a real round, and a row that
    stopped still rides in its batch until every row has. Only tokens actually sampled count
    (the EOS included, as the engine counts it): a run's rate is the sum of its reply lengths
    over the wall time of the call, prefill included as in the engine's latency, and
    ``tokens_per_s`` is the median over ``repeats`` runs (seeds ``seed``, ``seed + 1``, ...).
    ``occupancy`` is the share of row-steps that sampled a real token. Timed in a worker
    thread, as the engine's replies are, after one short warm-up.
    """
    from reinf.training.rollouts import sample_rollouts

    def run(max_new: int, run_seed: int) -> tuple[list, float]:
        started = time.perf_counter()
        replies = sample_rollouts(engine.model, engine.tokenizer, prompt_ids, k,
                                  temperature=temperature, top_p=top_p, max_new_tokens=max_new,
                                  seed=run_seed, batch_size=batch_size)
        _sync(engine.device)
        return replies, time.perf_counter() - started

    _in_thread(run, 2, seed)  # warm-up: the first batched calls allocate and pick kernels
    runs = [_in_thread(run, max_new_tokens, seed + r) for r in range(repeats)]
    lengths = [[len(reply.reply_ids) for reply in replies] for replies, _ in runs]
    stopped = sum(reply.finish_reason == "stop" for replies, _ in runs for reply in replies)
    # Row-steps computed: each batch runs until its longest reply ends.
    row_steps = sum(len(chunk) * max(chunk) for lens in lengths
                    for chunk in (lens[i:i + batch_size] for i in range(0, len(lens), batch_size)))
    tokens = sum(map(sum, lengths))
    seconds = sum(elapsed for _, elapsed in runs)
    rate = statistics.median(sum(lens) / elapsed for lens, (_, elapsed) in zip(lengths, runs))
    replies = len(prompt_ids) * k
    return {"model": engine.model_name, "batch_size": min(batch_size, replies),
            "prompts": len(prompt_ids),
            "replies_per_prompt": k, "replies": replies, "max_new_tokens": max_new_tokens,
            "runs": repeats, "reply_lengths": lengths, "tokens_sampled": tokens,
            "stopped_early": stopped,
            "occupancy": round(tokens / row_steps, 3) if row_steps else None,
            "seconds": round(seconds, 3),
            "tokens_per_s": round(rate, 2)}


def format_rollouts(r: dict[str, Any], sep: str = " ") -> str:
    """The batched rate, as a multiple of the engine's single stream; ``sep``, then what
    was sampled."""
    ratio = r.get("ratio_to_engine")
    against = f" = {ratio:.2f}× the engine's single stream" if ratio is not None else ""
    return (f"{r['tokens_per_s']:.1f} tok/s at batch {r['batch_size']}{against}{sep}"
            f"({r['prompts']} prompts × {r['replies_per_prompt']} replies, "
            f"{r['tokens_sampled']} tokens sampled in {r['runs']} run(s), up to "
            f"{r['max_new_tokens']} new each; {r['stopped_early']} stopped at EOS, occupancy "
            f"{'-' if r['occupancy'] is None else format(r['occupancy'], '.0%')})")


def measure_swaps(engine, cfg: Config, swaps: int, reply, seed: int = 0) -> dict[str, Any]:
    """Swap random adapters in and out; the pause is the time generation is blocked."""
    load_pause, switch_pause, read_ms = [], [], []
    with tempfile.TemporaryDirectory(prefix="reinf-speed-") as tmp:
        for i in range(swaps):
            path = build_random_adapter(engine.model, Path(tmp) / f"ckpt-{i}", r=cfg.lora.r,
                                        alpha=cfg.lora.alpha,
                                        target_modules=cfg.lora.target_modules,
                                        seed=seed + i)
            started = time.perf_counter()
            pause = engine.request_swap(f"speed-{i}", path)
            read_ms.append((time.perf_counter() - started) * 1000 - pause)
            load_pause.append(pause)
            previous = engine.previous_checkpoint_id  # None: the bare model
            for target in (previous, f"speed-{i}"):  # back and forward again: both loaded
                switch_pause.append(engine.request_swap(target))
        _, with_adapter = reply()
        switch_pause.append(engine.request_swap(None))
    med = statistics.median
    return {"pause_ms_new_adapter": round(med(load_pause), 2),
            "pause_ms_switch": round(med(switch_pause), 3),
            "pause_ms_max": round(max(load_pause + switch_pause), 2),
            "read_ms_outside_lock": round(med(read_ms), 2), "swaps": swaps,
            "latency_ms_with_adapter": round(with_adapter, 2)}


def format_result(r: dict[str, Any]) -> str:
    lines = [f"{r['model']} ({r['parameters']:,} parameters, {r['device']}, {r['dtype']})",
             f"  machine: {r['machine']}",
             f"  prompt tokens {r['prompt_tokens']}, {r['new_tokens']} new tokens, "
             f"{r['runs']} runs each (medians)",
             f"  time to first token: engine {r['engine']['ttft_ms']:.1f} ms, generate "
             f"{r['generate']['ttft_ms']:.1f} ms (ratio {r['ratio']['ttft']:.2f})",
             f"  tokens/s: engine {r['engine']['tokens_per_s']:.1f}, generate "
             f"{r['generate']['tokens_per_s']:.1f} (ratio {r['ratio']['tokens_per_s']:.2f}; "
             f"generate from the main thread: {r['generate']['tokens_per_s_main_thread']:.1f})"]
    if "rollouts" in r:
        lines.append(f"  batched sampling: {format_rollouts(r['rollouts'])}")
    if "swap" in r:
        s = r["swap"]
        lines.append(f"  swap pause: new adapter {s['pause_ms_new_adapter']:.1f} ms, switch to a "
                     f"loaded one {s['pause_ms_switch']:.2f} ms, max {s['pause_ms_max']:.1f} ms "
                     f"(reading it, outside the lock: {s['read_ms_outside_lock']:.1f} ms)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reinf.bench.generation",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="reinf-demo",
                        help="model_path (directory, hub id, reinf-demo) or "
                             + " | ".join(SHAPES) + " for a random model of that shape")
    parser.add_argument("--tokenizer", help="tokenizer for a shaped model (default: the demo "
                                            "model's)")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--swaps", type=int, default=3)
    parser.add_argument("--rollout-batch", type=int, default=16,
                        help="replies sampled together by the batched sampler (0 skips it)")
    parser.add_argument("--rollouts-per-prompt", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    cfg = load_config()
    if args.model in SHAPES:
        from transformers import AutoTokenizer

        from reinf.catalog import demo_model_dir
        source = args.tokenizer or str(demo_model_dir(cfg))
        loaded = build_shaped_model(AutoTokenizer.from_pretrained(source), SHAPES[args.model])
        result = measure_generation(loaded, PROMPTS, config=cfg, max_new_tokens=args.new_tokens,
                                    repeats=args.repeats, swaps=args.swaps,
                                    rollout_batch=args.rollout_batch,
                                    rollouts_per_prompt=args.rollouts_per_prompt)
    else:
        cfg = cfg.replace(model_path=args.model)
        result = measure_generation(cfg, PROMPTS, max_new_tokens=args.new_tokens,
                                    repeats=args.repeats, swaps=args.swaps,
                                    rollout_batch=args.rollout_batch,
                                    rollouts_per_prompt=args.rollouts_per_prompt)
    print(json.dumps(result, indent=2) if args.json else format_result(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
