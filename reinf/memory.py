"""The memory plan of a training round: what the server and the trainer child hold at once.

During a round the server keeps its copy of the base model (plus a KV cache, since a person
may chat meanwhile) and the trainer child loads another, trains a LoRA adapter on it and
samples rollouts with it. ``plan_memory`` estimates both from the model's ``config.json``
alone (no weights are read; safetensors headers only where config.json lacks the shape) and
compares the sum with what the device has. ``reinf status`` shows the plan; the trainer
uses it for ``training.base_quantization: auto`` (:func:`trainer_quantization`).

The formulas (docs/training.md, "Memory", has them with the numbers for three shapes):

- parameters of a Llama/Qwen2/Mistral-shaped decoder, h = hidden, i = intermediate, L =
  layers, q = heads x head_dim, k = KV heads x head_dim, V = vocabulary:
  ``L (2hq + 2hk + 3hi + 2h) + h + Vh (+ Vh untied) (+ L (q + 2k) QKV biases, Qwen2)``;
- weights: 4 bytes a parameter (fp32), 2 (bf16, fp16); bitsandbytes quantizes the decoder's
  Linear layers only, to 1 byte (8-bit) or 0.5625 (NF4: 0.5 plus an fp32 scale per block of
  64), the rest stays in the dtype; a trainer's k-bit base has that rest cast to fp32
  (peft's ``prepare_model_for_kbit_training`` does it);
- KV cache: ``2 L k x tokens x dtype bytes``;
- LoRA: ``r (in + out)`` per adapted layer, 16 bytes each (fp32 weight, gradient, Adam's two
  moments);
- activations a minibatch keeps for the backward, per token and layer, in values of the
  activation dtype (bf16 under autocast: 2 bytes; fp32: 4), measured with
  ``torch.autograd.graph.saved_tensors_hooks`` on LoRA'd Llama and Qwen2 layers with a frozen
  base and PyTorch's SDPA attention (so no T x T matrix): ``5h + 3i + 2k`` in fp32,
  ``8.5h + 3i + 2k`` under bf16 autocast (RMSNorm keeps fp32 copies), plus h with an adapter
  on o_proj and i with one on down_proj; with gradient checkpointing h per layer plus one
  layer's worth recomputed. The reply's logits (B, K, V) and their gradient come on top,
  and the update's sum is multiplied by what its peak measured beyond it (1.7 on the CPU,
  1.25 assumed on a GPU: ``UPDATE_OVERHEAD``).
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GIB = 1024 ** 3
RUNTIME_BYTES = GIB // 2   # per process: CUDA context, or torch + transformers in RAM
LORA_STATE_BYTES = 16      # per LoRA parameter: fp32 weight, gradient, Adam's m and v
TIGHT_FROM = 0.85          # planned / capacity above this: tight; above 1: will not fit
# A minibatch's forward + backward peaks above what it saves for the backward. Measured on
# CPU (fp32, LoRA'd Llama layers, B 4-8, T 512-1024, 2-24 layers): 1.2x live (the backward's
# gradient buffers), 1.45-1.85x peak RSS, as glibc's heap keeps freed blocks. On a GPU the
# caching allocator's slack is assumed, not measured here.
UPDATE_OVERHEAD = {"cpu": 1.7, "cuda": 1.25, "mps": 1.25}
FALLBACK_CONTEXT = 2048    # as reinf.modeling.FALLBACK_CONTEXT (which imports torch)
QUANT_BYTES = {"none": None, "8bit": 1.0, "4bit": 0.5625}
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FITS, TIGHT, WONT, UNKNOWN = "fits", "tight", "will not fit", "unknown"


@dataclass(frozen=True)
class Shape:
    """What the plan needs to know about a model, from its config.json."""
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    context: int                # the model's own longest prompt + reply
    params: int
    linear_params: int          # in the decoder's Linear layers (what bitsandbytes quantizes)
    source: str                 # "config.json" or "safetensors headers"


@dataclass(frozen=True)
class Settings:
    """The settings a plan depends on, resolved (a device, never auto)."""
    server_device: str
    trainer_device: str
    dtype: str                  # the dtype setting (auto | float32 | bfloat16 | float16)
    bf16: bool                  # the GPU computes in bf16 (irrelevant off CUDA)
    quantization: str           # the server's, effective
    trainer_quantization: str   # the trainer base's, effective
    context: int                # longest prompt + reply: max_context_tokens, else the model's
    train_context: int          # longest row a round reads: context, capped by max_train_tokens
    reply: int                  # longest reply a round meets (rated or rollout)
    rollout_reply: int
    batch_size: int
    rollout_rows: int
    feature_rows: int
    gradient_checkpointing: bool
    lora_r: int
    lora_targets: tuple[str, ...]


@dataclass(frozen=True)
class MemoryPlan:
    model: str
    verdict: str                       # fits | tight | will not fit | unknown
    reason: str | None = None          # why the verdict is unknown
    params: int | None = None
    server_device: str = ""
    trainer_device: str = ""
    trainer_quantization: str = "none"
    trainer_quantization_note: str | None = None  # why auto chose it
    server: dict[str, int] = dataclasses.field(default_factory=dict)   # part -> bytes
    trainer: dict[str, int] = dataclasses.field(default_factory=dict)
    server_bytes: int = 0
    trainer_bytes: int = 0
    peak_device: str = ""              # the device closest to full (server's, trainer's)
    peak_bytes: int = 0                # planned there
    capacity_bytes: int | None = None  # what it has
    free_bytes: int | None = None
    devices: dict[str, dict] = dataclasses.field(default_factory=dict)  # planned, capacity
    rows: str = ""                     # "minibatches of 8 x 2048 tokens"
    assumptions: str = ""
    fixes: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "fixes": list(self.fixes), "notes": list(self.notes)}

    def summary(self) -> str:
        """One line: server + trainer against the device (``reinf status``)."""
        if self.verdict == UNKNOWN and not self.server_bytes:
            return f"unknown ({self.reason})"
        if len(self.devices) > 1:
            each = "; ".join(f"{d['planned'] / GIB:.1f} GiB of {_gib(d['capacity'])} on {name}"
                             for name, d in self.devices.items())
            return (f"server {self.server_bytes / GIB:.1f} GiB on {self.server_device}, trainer "
                    f"{self.trainer_bytes / GIB:.1f} GiB on {self.trainer_device} ({each}) "
                    f"— {self.verdict} ({self.rows})")
        return (f"server {self.server_bytes / GIB:.1f} GiB + trainer {self.trainer_bytes / GIB:.1f}"
                f" GiB = {self.peak_bytes / GIB:.1f} GiB peak of {_gib(self.capacity_bytes)} on "
                f"{self.server_device} — {self.verdict} ({self.rows})")

    def warning(self) -> str | None:
        """The line to show before a round would fail, with its fix; None when it fits."""
        if self.verdict not in (TIGHT, WONT):
            return None
        outcome = "memory is tight" if self.verdict == TIGHT else "it will run out of memory"
        fix = ("set " + ", or ".join(self.fixes[:3])) if self.fixes else "use a smaller model"
        return (f"a training round beside the server needs about {self.peak_bytes / GIB:.1f} GiB "
                f"on {self.peak_device} ({self.rows}), which has {_gib(self.capacity_bytes)}: "
                f"{outcome} — {fix}")


def _gib(n: int | None) -> str:
    return "unknown memory" if n is None else f"{n / GIB:.1f} GiB"


# --- the model's shape, from config.json -----------------------------------------------------

def load_shape(name: str) -> tuple[Shape | None, str | None]:
    """The shape of the model at ``name`` (a directory, or a hub id read from the local
    cache only), or (None, why not)."""
    path = Path(name)
    if path.is_dir():
        config_file = path / "config.json"
    elif path.is_absolute() or name.startswith((".", "~")):
        return None, f"no model at {name}"
    else:
        config_file = _cached_config(name)
        if config_file is None:
            return None, f"{name} is not in the local Hugging Face cache"
    try:
        cfg = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return None, f"cannot read {config_file}: {exc}"
    if not isinstance(cfg, dict):
        return None, f"{config_file} is not a JSON object"
    if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg["text_config"], "tie_word_embeddings": cfg.get(
            "tie_word_embeddings", cfg["text_config"].get("tie_word_embeddings"))}
    return shape_from_config(cfg, config_file.parent)


def shape_from_config(cfg: dict, model_dir: Path | None = None) -> tuple[Shape | None, str | None]:
    def first(*keys, default=None):
        return next((cfg[k] for k in keys if isinstance(cfg.get(k), int) and cfg[k] > 0), default)

    h = first("hidden_size", "n_embd", "d_model")
    layers = first("num_hidden_layers", "n_layer", "num_layers")
    heads = first("num_attention_heads", "n_head")
    vocab = first("vocab_size")
    if None in (h, layers, heads, vocab):
        return None, "config.json does not give hidden_size, num_hidden_layers, " \
                     "num_attention_heads and vocab_size"
    inter = first("intermediate_size", "n_inner", "ffn_dim", default=4 * h)
    kv_heads = first("num_key_value_heads", default=heads)
    head_dim = first("head_dim", default=h // heads)
    tied = bool(cfg.get("tie_word_embeddings", False))
    context = first("max_position_embeddings", "n_positions", "max_sequence_length",
                    "seq_length", default=FALLBACK_CONTEXT)
    q, k = heads * head_dim, kv_heads * head_dim
    gated = "intermediate_size" in cfg   # Llama, Qwen2, Mistral, Gemma, Phi-3: gate, up, down
    if gated:
        linear = layers * (2 * h * q + 2 * h * k + 3 * h * inter)
        bias = cfg.get("attention_bias", cfg.get("model_type") == "qwen2")
        params = (linear + layers * (2 * h + (q + 2 * k if bias else 0)) + h
                  + vocab * h * (1 if tied else 2))
        source = "config.json"
    else:
        counted = _count_safetensors(model_dir) if model_dir is not None else None
        if counted is None:
            return None, (f"config.json of a {cfg.get('model_type', 'non-Llama')} model, and no "
                          "safetensors headers to count its parameters")
        params, linear = counted
        source = "safetensors headers"
    return Shape(h, inter, layers, heads, kv_heads, head_dim, vocab, tied, context, params,
                 linear, source), None


def _cached_config(repo_id: str) -> Path | None:
    """config.json of a hub id in the local Hugging Face cache; never the network."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # noqa: BLE001 - an id the hub library refuses is simply not cached
        return None
    return Path(found) if isinstance(found, str) else None


def _count_safetensors(model_dir: Path) -> tuple[int, int] | None:
    """(parameters, those in 2-D weights other than embeddings and the LM head) from the
    headers of the directory's safetensors files."""
    total = linear = 0
    files = sorted(model_dir.glob("*.safetensors"))
    for file in files:
        try:
            with open(file, "rb") as f:
                size = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(size)) if 0 < size < 100_000_000 else {}
        except (OSError, ValueError):
            return None
        for key, meta in header.items():
            shape = meta.get("shape") if isinstance(meta, dict) else None
            if not isinstance(shape, list):
                continue
            n = 1
            for d in shape:
                n *= int(d)
            total += n
            if len(shape) == 2 and not any(s in key for s in ("embed", "lm_head", "wte", "wpe")):
                linear += n
    return (total, linear) if files and total else None


# --- bytes -----------------------------------------------------------------------------------

def weight_bytes(dtype: str, device: str) -> int:
    """Bytes a weight takes in the dtype setting (auto: bf16 or fp16 on CUDA, fp32 elsewhere)."""
    if dtype == "auto":
        return 2 if device == "cuda" else 4
    return 4 if dtype == "float32" else 2


def activation_bytes(s: Settings, device: str) -> int:
    """Bytes of an activation: bf16 under the trainer's autocast on a bf16 GPU, else the
    weights' own dtype."""
    return 2 if device == "cuda" and s.bf16 else weight_bytes(s.dtype, device)


def base_weights(shape: Shape, dtype_bytes: int, quantization: str, *, trainer: bool) -> int:
    q = QUANT_BYTES[quantization]
    if q is None:
        return shape.params * dtype_bytes
    rest = shape.params - shape.linear_params   # embeddings, LM head, norms: not quantized;
    return int(shape.linear_params * q) + rest * (4 if trainer else dtype_bytes)  # k-bit: fp32


def lora_params(shape: Shape, r: int, targets: tuple[str, ...]) -> int:
    h, i = shape.hidden, shape.intermediate
    q, k = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    sizes = {"q_proj": h + q, "k_proj": h + k, "v_proj": h + k, "o_proj": q + h,
             "gate_proj": h + i, "up_proj": h + i, "down_proj": i + h}
    return shape.layers * r * sum(sizes.get(t, 0) for t in targets) + h + 1  # + value head


def saved_per_token_layer(shape: Shape, act: int, targets: tuple[str, ...]) -> float:
    """Activation values one token keeps for the backward in one layer (module docstring)."""
    h, i = shape.hidden, shape.intermediate
    values = (5.0 if act == 4 else 8.5) * h + 3 * i + 2 * shape.kv_heads * shape.head_dim
    return values + h * ("o_proj" in targets) + i * ("down_proj" in targets)


def server_parts(shape: Shape, s: Settings) -> dict[str, int]:
    d = s.server_device
    wb = weight_bytes(s.dtype, d)
    kv = 2 * shape.layers * shape.kv_heads * shape.head_dim * s.context * wb
    return {"weights": base_weights(shape, wb, s.quantization, trainer=False),
            "kv_cache": kv,                                        # one reply at full context
            "prefill": s.context * (2 * shape.intermediate + 4 * shape.hidden) * wb,
            "runtime": RUNTIME_BYTES}


def trainer_parts(shape: Shape, s: Settings) -> dict[str, int]:
    """Resident parts, then each phase of a round; the peak is resident + the largest phase."""
    d = s.trainer_device
    wb, act = weight_bytes(s.dtype, d), activation_bytes(s, d)
    h, i, n_layers, vocab = shape.hidden, shape.intermediate, shape.layers, shape.vocab
    t, k = s.train_context, s.reply + 1  # a minibatch row: prompt + reply; logits kept: reply + 1
    per_layer = saved_per_token_layer(shape, act, s.lora_targets)
    kept = n_layers * h + per_layer if s.gradient_checkpointing else n_layers * per_layer
    logits = 2 * s.batch_size * k * vocab * act + 3 * k * vocab * 4   # + grad; fp32 rows
    kv_row = 2 * n_layers * shape.kv_heads * shape.head_dim * t * wb
    prompt = max(t - s.rollout_reply, 1)
    return {
        "weights": base_weights(shape, wb, s.trainer_quantization, trainer=True),
        "lora_and_adam": lora_params(shape, s.lora_r, s.lora_targets) * LORA_STATE_BYTES,
        "runtime": RUNTIME_BYTES,
        # phases, one at a time
        # (B, 1, T, T) bool attention mask: left padding keeps SDPA from using is_causal
        "update": int(UPDATE_OVERHEAD.get(d, 1.7) * (s.batch_size * t * kept * act + logits
                                                     + s.batch_size * t * t)),
        "rating_features": s.feature_rows * t * ((h * (n_layers + 1) + 2 * i) * act + t),
        "rollouts": s.rollout_rows * (kv_row + prompt * (2 * i * wb + prompt)),
    }


PHASES = ("update", "rating_features", "rollouts")


def trainer_total(parts: dict[str, int]) -> int:
    return sum(v for p, v in parts.items() if p not in PHASES) + max(parts[p] for p in PHASES)


def verdict_of(planned: int, capacity: int | None) -> str:
    if capacity is None:
        return UNKNOWN
    return FITS if planned <= TIGHT_FROM * capacity else TIGHT if planned <= capacity else WONT


def _evaluate(shape: Shape, s: Settings, capacity: dict[str, int | None]
              ) -> tuple[dict, dict, dict[str, dict], str]:
    server, trainer = server_parts(shape, s), trainer_parts(shape, s)
    planned: dict[str, int] = {}
    planned[s.server_device] = planned.get(s.server_device, 0) + sum(server.values())
    planned[s.trainer_device] = planned.get(s.trainer_device, 0) + trainer_total(trainer)
    devices = {d: {"planned": n, "capacity": capacity.get(d),
                   "verdict": verdict_of(n, capacity.get(d))} for d, n in planned.items()}
    order = (WONT, TIGHT, UNKNOWN, FITS)
    worst = min((v["verdict"] for v in devices.values()), key=order.index)
    return server, trainer, devices, worst


# --- the plan ------------------------------------------------------------------------------

def read_settings(config, shape: Shape, device: str, bf16: bool) -> Settings:
    trainer = config.ppo.train_device if config.ppo.train_device != "auto" else device
    quant, base = config.model.quantization, config.training.base_quantization
    budget = config.model.max_context_tokens
    reply = config.generation.max_new_tokens
    rollout_reply = config.training.rollout_max_new_tokens or reply
    t = config.training
    context = min(shape.context, budget) if budget > 0 else shape.context
    rollouts = t.method == "rollouts"
    targets = config.lora.target_modules
    return Settings(
        server_device=device, trainer_device=trainer, dtype=config.model.dtype, bf16=bf16,
        quantization=quant if device == "cuda" else "none",
        trainer_quantization=(quant if base == "auto" else base) if trainer == "cuda" else "none",
        context=context, train_context=min(context, t.max_train_tokens),
        reply=max(reply, rollout_reply), rollout_reply=rollout_reply,
        batch_size=config.ppo.batch_size,
        rollout_rows=min(t.rollout_batch_size, t.rollout_prompts * t.rollouts_per_prompt)
        if rollouts else 0,
        feature_rows=2 * config.ppo.batch_size if rollouts else 0,  # the rating model's batch
        gradient_checkpointing=config.ppo.gradient_checkpointing, lora_r=config.lora.r,
        lora_targets=ALL_LINEAR if targets == "all-linear" else ("q_proj", "v_proj")
        if targets == "auto" else tuple(targets))


def plan_memory(config, *, device_total_bytes: int | None = None, device: str | None = None,
                bf16: bool | None = None, bitsandbytes: bool | None = None) -> MemoryPlan:
    """The round's memory plan for ``config``'s model, settings and device.

    ``device`` is the serving device in use (None: what ``model.device`` picks here);
    ``device_total_bytes`` replaces what the device reports (tests, or "what if");
    ``bf16`` and ``bitsandbytes`` replace what this machine has (None: ask torch, look for
    the package). Reads config.json; torch only where the device is a CUDA GPU.
    """
    from reinf.config import resolve_model_path

    name = resolve_model_path(config)
    shape, reason = load_shape(name)
    if shape is None:
        return MemoryPlan(model=name, verdict=UNKNOWN, reason=reason)
    if device is None:
        from reinf.status import planned_device
        device = planned_device(config.model.device)
    trainer_device = config.ppo.train_device if config.ppo.train_device != "auto" else device
    if bf16 is None:
        bf16 = _cuda_bf16() if "cuda" in (device, trainer_device) else True
    if bitsandbytes is None:
        bitsandbytes = _has_bitsandbytes()
    capacity: dict[str, int | None] = {}
    free: dict[str, int | None] = {}
    for d in (device, trainer_device):
        capacity[d], free[d] = (device_total_bytes, None) if device_total_bytes \
            else device_memory(d)
    s = read_settings(config, shape, device, bf16)
    notes: list[str] = []
    note = None
    if config.training.base_quantization == "auto" and trainer_device == "cuda" \
            and s.trainer_quantization == "none":
        # 4-bit where an unquantized trainer will not fit and a 4-bit one does better
        # (fits, or is only tight): where it cannot help, it would only train slower
        *_, devices, verdict = _evaluate(shape, s, capacity)
        four = dataclasses.replace(s, trainer_quantization="4bit")
        if verdict == WONT and _evaluate(shape, four, capacity)[3] in (FITS, TIGHT):
            if bitsandbytes:
                s = four
                note = (f"training.base_quantization auto: the trainer loads its base in 4-bit "
                        f"(QLoRA) beside the server, since an unquantized one would need "
                        f"{devices[trainer_device]['planned'] / GIB:.1f} GiB of "
                        f"{_gib(capacity[trainer_device])} on the GPU")
            else:
                notes.append("training.base_quantization auto would train on a 4-bit base "
                             "here, but bitsandbytes is not installed — pip install "
                             "'reinf[cuda]'")
    if trainer_device == "cuda" and not bf16 and config.model.dtype in ("auto", "float16"):
        notes.append("this GPU has no bfloat16 and training refuses float16 (it would need loss "
                     "scaling) — set dtype: float32")
    server, trainer, devices, verdict = _evaluate(shape, s, capacity)
    busiest = max(devices, key=lambda d: devices[d]["planned"] / (capacity[d] or float("inf")))
    return MemoryPlan(
        model=name, verdict=verdict, params=shape.params, server_device=device,
        trainer_device=trainer_device, trainer_quantization=s.trainer_quantization,
        trainer_quantization_note=note, server=server, trainer=trainer,
        server_bytes=sum(server.values()), trainer_bytes=trainer_total(trainer),
        peak_device=busiest, peak_bytes=devices[busiest]["planned"],
        capacity_bytes=capacity[busiest],
        free_bytes=free[busiest], devices=devices,
        rows=f"minibatches of {s.batch_size} x {s.train_context} tokens",
        assumptions=(f"{shape.params / 1e9:.2f}B parameters ({shape.source}); minibatches of "
                     f"{s.batch_size} rows of {s.train_context} tokens (prompt + reply), replies up to "
                     f"{s.reply}; rollouts {s.rollout_rows} rows at a time"),
        fixes=_fixes(shape, s, capacity, bitsandbytes, config.training.base_quantization)
        if verdict in (TIGHT, WONT) else (),
        notes=tuple(notes))


def trainer_quantization(config) -> tuple[str, str | None]:
    """What the trainer loads its base with: ``training.base_quantization``, where ``auto``
    is ``model.quantization`` unless the plan says an unquantized trainer will not fit beside
    the server on the GPU; then 4-bit, and the second value says why (None: as set)."""
    base = config.training.base_quantization
    if base != "auto":
        return base, None
    plan = plan_memory(config)
    if plan.trainer_quantization_note:
        return plan.trainer_quantization, plan.trainer_quantization_note
    return config.model.quantization, None


def _fixes(shape: Shape, s: Settings, capacity: dict, bitsandbytes: bool, base: str
           ) -> tuple[str, ...]:
    """Settings that make the plan fit: each one that does alone, else one combination
    (memory first: checkpointing, 4-bit weights; then smaller minibatches, shorter rows)."""
    def fits(t: Settings) -> bool:
        return _evaluate(shape, t, capacity)[3] == FITS

    def largest(make, low: int, high: int) -> int:
        """The largest value in [low, high] that fits (memory grows with it), else low."""
        while low < high:
            mid = (low + high + 1) // 2
            low, high = (mid, high) if fits(make(mid)) else (low, mid - 1)
        return low

    def checkpointing(t: Settings):
        return None if t.gradient_checkpointing else (
            "gradient_checkpointing: true", dataclasses.replace(t, gradient_checkpointing=True))

    def server_4bit(t: Settings):
        if t.server_device != "cuda" or t.quantization != "none" or not bitsandbytes:
            return None
        trainer = "4bit" if base == "auto" and t.trainer_device == "cuda" else t.trainer_quantization
        return "quantization: 4bit", dataclasses.replace(t, quantization="4bit",
                                                         trainer_quantization=trainer)

    def trainer_4bit(t: Settings):
        if t.trainer_device != "cuda" or t.trainer_quantization != "none" or not bitsandbytes:
            return None
        return "training.base_quantization: 4bit", dataclasses.replace(
            t, trainer_quantization="4bit")

    def batch(t: Settings):
        def make(b: int) -> Settings:
            return dataclasses.replace(t, batch_size=b, feature_rows=min(t.feature_rows, 2 * b))
        if t.batch_size <= 1:
            return None
        n = largest(make, 1, t.batch_size - 1)
        return f"batch_size: {n} (raise gradient_accumulation_steps to keep the step)", make(n)

    def context(t: Settings):
        """Shorter training rows: training.max_train_tokens (the server's context stays)."""
        floor = t.reply // 256 + 2      # in units of 256 tokens: room for a prompt and a reply
        if t.train_context <= floor * 256:
            return None
        n = largest(lambda c: dataclasses.replace(t, train_context=c * 256), floor,
                    (t.train_context - 1) // 256)
        return (f"training.max_train_tokens: {n * 256}",
                dataclasses.replace(t, train_context=n * 256))

    singles = (trainer_4bit, checkpointing, batch, context, server_4bit)
    alone = [change[0] for change in (step(s) for step in singles)
             if change is not None and fits(change[1])]
    if alone:
        return tuple(alone)
    labels, t = [], s
    for step in (checkpointing, server_4bit, trainer_4bit, batch, context):
        change = step(t)
        if change is not None:
            labels.append(change[0])
            t = change[1]
            if fits(t):
                return (" and ".join(labels),)
    return ()


# --- what the device has -----------------------------------------------------------------------

def device_memory(device: str) -> tuple[int | None, int | None]:
    """(total, free) bytes of ``device``: the GPU's (torch.cuda.mem_get_info), else the
    machine's RAM (MPS shares it); (None, None) where it cannot be told."""
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return None, None
        free, total = torch.cuda.mem_get_info()
        return int(total), int(free)
    return physical_memory()


def physical_memory() -> tuple[int | None, int | None]:
    """(MemTotal, MemAvailable) from /proc/meminfo, else the page count from sysconf."""
    try:
        info = {}
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            info[key] = int(rest.split()[0]) * 1024
        return info["MemTotal"], info.get("MemAvailable")
    except (OSError, KeyError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), None
    except (ValueError, OSError, AttributeError):
        return None, None


def _has_bitsandbytes() -> bool:
    import importlib.util

    return importlib.util.find_spec("bitsandbytes") is not None


def _cuda_bf16() -> bool:
    import torch

    if not torch.cuda.is_available():
        return True
    from reinf.modeling import cuda_facts
    return cuda_facts()[0]
