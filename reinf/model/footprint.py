"""The bytes each part of a training round takes, for a model's shape and the settings.

The memory plan (reinf.model.memory) adds these up for the server and the trainer child.
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

from dataclasses import dataclass

from reinf.model.shape import Shape

GIB = 1024 ** 3
RUNTIME_BYTES = GIB // 2   # per process: CUDA context, or torch + transformers in RAM
LORA_STATE_BYTES = 16      # per LoRA parameter: fp32 weight, gradient, Adam's m and v
# A minibatch's forward + backward peaks above what it saves for the backward. Measured on
# CPU (fp32, LoRA'd Llama layers, B 4-8, T 512-1024, 2-24 layers): 1.2x live (the backward's
# gradient buffers), 1.45-1.85x peak RSS, as glibc's heap keeps freed blocks. On a GPU the
# caching allocator's slack is assumed, not measured here.
UPDATE_OVERHEAD = {"cpu": 1.7, "cuda": 1.25, "mps": 1.25}
QUANT_BYTES = {"none": None, "8bit": 1.0, "4bit": 0.5625}


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
