"""Which layers get LoRA adapters: ``lora.target_modules`` resolved for the loaded model.

``auto`` (the default) picks the attention projections: peft's own mapping for the model
type where its names exist in the model, else the query/value projections found inside the
attention blocks (Linear or transformers' Conv1D), else a fused qkv layer. ``all-linear``
is peft's own. A list must match some layer; when it matches none, the error lists the
layer names the model does have. The adapter's saved config records what it targeted, and
``target_layers`` / ``adapted_layers`` compare settings by the layers they select, so an
expanded name never reads as a changed setting.
"""
from __future__ import annotations

import re

import torch

from reinf.errors import ConfigError, ReinfError

TARGETS_KEY = "lora.target_modules"
# Leaf names of attention projections, for architectures peft's own mapping does not know.
_QUERY_NAMES = ("q_proj", "query", "q", "wq", "query_proj")
_VALUE_NAMES = ("v_proj", "value", "v", "wv", "value_proj")
_FUSED_NAMES = ("qkv_proj", "query_key_value", "c_attn", "Wqkv", "W_pack", "qkv", "in_proj")


def lora_targets(model, setting) -> list[str] | str:
    """What peft's ``LoraConfig(target_modules=...)`` gets for ``lora.target_modules``.

    ``auto``: the attention projections: peft's mapping for the model type where it has
    one (and its names exist here), else the query and value projections (or the fused
    qkv one, or all Linear layers) found inside the model's attention blocks.
    ``all-linear``: peft's own ``"all-linear"``. A list: kept as it is, but one that names
    no layer of this model is refused with the names the model does have.
    """
    if setting == "all-linear":
        return "all-linear"
    if setting == "auto":
        return _auto_targets(model)
    names = [setting] if isinstance(setting, str) else list(setting)
    if not target_layers(model, names):
        raise ConfigError(f"{TARGETS_KEY} {names} matches no layer of "
                          f"{_model_type(model) or 'this model'}; its Linear layers are "
                          f"named {', '.join(linear_names(model)) or '(none)'}",
                          key=TARGETS_KEY, fix=f"set {TARGETS_KEY} to auto, all-linear, "
                                               "or some of those names")
    return names


def lora_target_names(model, setting) -> list[str]:
    """Distinct leaf names of the layers ``setting`` selects in ``model`` (for code that
    matches layers by leaf name, such as the benchmarks' random adapters)."""
    layers = target_layers(model, lora_targets(model, setting))
    return sorted({name.rsplit(".", 1)[-1] for name in layers})


def lora_target_warnings(model, setting) -> list[str]:
    """The reason ``setting`` cannot train ``model``, as warnings for `reinf status`."""
    try:
        lora_targets(model, setting)
    except ReinfError as exc:
        return [f"{exc} (training stops until it is fixed)"]
    return []


def target_layers(model, targets) -> set[str]:
    """Names of the layers an adapter with ``targets`` wraps, by peft's matching rule (a
    string is a regex over the whole name; a list matches a name or its dotted suffix)."""
    if targets == "all-linear":
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") \
            else None
        return {name for name, kind, module in _layers(model)
                if kind == "linear" and module is not head}
    if isinstance(targets, str):
        return {name for name, _, _ in _layers(model) if re.fullmatch(targets, name)}
    return {name for name, _, _ in _layers(model)
            if any(name == t or name.endswith("." + t) for t in targets)}


def fan_in_fan_out(model, targets) -> bool:
    """Whether the layers ``targets`` selects are transformers' Conv1D (GPT-2's), which store
    their weight as (in, out): peft's ``LoraConfig(fan_in_fan_out=...)`` must say so."""
    from transformers.pytorch_utils import Conv1D

    chosen = target_layers(model, targets)
    convs = {name for name, _, module in _layers(model)
             if isinstance(getattr(module, "base_layer", module), Conv1D)}
    return bool(chosen) and chosen <= convs


def adapted_layers(model) -> set[str]:
    """Names of the layers that carry LoRA in a (peft-injected) model."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {name for name, module in base.named_modules() if isinstance(module, BaseTunerLayer)}


def linear_names(model) -> list[str]:
    """Distinct leaf names of the model's Linear (and transformers Conv1D) layers."""
    return sorted({name.rsplit(".", 1)[-1] for name, kind, _ in _layers(model)
                   if kind == "linear"})


def _layers(model):
    """(name, kind, module) of each layer peft can wrap: kind "linear" (nn.Linear, also
    bitsandbytes', or transformers' Conv1D) or "other" (Embedding, Conv). Inside a LoRA
    layer only the LoRA layer itself counts, as the layer it wraps."""
    from peft.tuners.tuners_utils import BaseTunerLayer
    from transformers.pytorch_utils import Conv1D

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    inside: tuple[str, ...] = ()
    for name, module in base.named_modules():
        if not name or (inside and name.startswith(inside)):
            continue
        wrapped = module
        if isinstance(module, BaseTunerLayer):
            inside += (name + ".",)
            wrapped = module.get_base_layer()
        if isinstance(wrapped, (torch.nn.Linear, Conv1D)):
            yield name, "linear", module
        elif isinstance(wrapped, (torch.nn.Embedding, torch.nn.Conv1d, torch.nn.Conv2d,
                                  torch.nn.Conv3d)):
            yield name, "other", module


def _model_type(model) -> str | None:
    cfg = getattr(model, "config", None)
    return getattr(cfg, "model_type", None)


def _auto_targets(model) -> list[str] | str:
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as MAP

    cfg = getattr(model, "config", None)
    types = [_model_type(model)]
    if cfg is not None and hasattr(cfg, "get_text_config"):
        types.append(getattr(cfg.get_text_config(), "model_type", None))
    for kind in types:
        mapped = MAP.get(kind) if kind else None
        if mapped and target_layers(model, mapped):
            return mapped if isinstance(mapped, str) else list(mapped)
    found = attention_projections(model)
    if not found:
        raise ConfigError(f"{TARGETS_KEY} auto found no attention projections in "
                          f"{_model_type(model) or 'this model'}; its Linear layers are named "
                          f"{', '.join(linear_names(model)) or '(none)'}", key=TARGETS_KEY,
                          fix=f"set {TARGETS_KEY} to all-linear or to some of those names")
    return found


def attention_projections(model) -> list[str]:
    """Leaf names of the input projections of the model's attention blocks (modules whose
    class or name says attention): query and value where they are separate, else the fused
    qkv projection, else every Linear layer in there."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    blocks = tuple(name + "." for name, module in base.named_modules()
                   if name and ("Attention" in type(module).__name__
                                or re.search(r"attn|attention", name.rsplit(".", 1)[-1], re.I)))
    leaves: list[str] = []
    for name, kind, _ in _layers(model):
        leaf = name.rsplit(".", 1)[-1]
        if kind == "linear" and name.startswith(blocks) and leaf not in leaves:
            leaves.append(leaf)
    query = next((n for n in leaves if n in _QUERY_NAMES), None)
    value = next((n for n in leaves if n in _VALUE_NAMES), None)
    if query and value:
        return [query, value]
    fused = [n for n in leaves if n in _FUSED_NAMES or "qkv" in n.lower()]
    return fused[:1] or leaves
