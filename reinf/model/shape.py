"""A model's shape from its files alone: config.json and the safetensors headers.

``load_shape`` gives what the memory plan (reinf.model.memory) needs: sizes, layer and head
counts, the context length and the parameter count (computed from config.json for a
Llama/Qwen2/Mistral-shaped decoder, else counted in the safetensors headers).
``read_weight_shapes`` reads those headers (8 bytes of length, then JSON), which is also
how ``reinf status`` judges ``lora.target_modules`` (reinf.model.lora.read_layers). No weights
are read, and nothing here imports torch.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# The context length of a model that does not give one (reinf.model.modeling uses it too).
FALLBACK_CONTEXT = 2048


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
    try:  # function-local: only a hub id needs huggingface_hub, a local directory does not
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # noqa: BLE001 - an id the hub library refuses is simply not cached
        return None
    return Path(found) if isinstance(found, str) else None


def read_weight_shapes(model_dir: Path) -> dict[str, list[int]] | None:
    """Tensor name -> shape, from the headers of the directory's safetensors files; None
    where there are none or one cannot be read."""
    files = sorted(Path(model_dir).glob("*.safetensors")) if Path(model_dir).is_dir() else []
    if not files:
        return None
    shapes: dict[str, list[int]] = {}
    for file in files:
        try:
            with open(file, "rb") as f:
                size = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(size)) if 0 < size < 100_000_000 else {}
        except (OSError, ValueError):
            return None
        for key, meta in header.items():
            shape = meta.get("shape") if isinstance(meta, dict) else None
            if isinstance(shape, list):
                shapes[key] = shape
    return shapes


def _count_safetensors(model_dir: Path) -> tuple[int, int] | None:
    """(parameters, those in 2-D weights other than embeddings and the LM head) from the
    headers of the directory's safetensors files."""
    total = linear = 0
    for key, shape in (read_weight_shapes(model_dir) or {}).items():
        n = 1
        for d in shape:
            n *= int(d)
        total += n
        if len(shape) == 2 and not any(s in key for s in ("embed", "lm_head", "wte", "wpe")):
            linear += n
    return (total, linear) if total else None
