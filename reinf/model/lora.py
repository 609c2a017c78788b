"""Which layers get LoRA adapters: ``lora.target_modules`` resolved for the loaded model.

``auto`` (the default) picks the attention projections: peft's own mapping for the model
type where its names exist in the model, else the query/value projections found inside the
attention blocks (Linear or transformers' Conv1D), else a fused qkv layer. ``all-linear``
is peft's own. A list must match some layer; when it matches none, the error lists the
layer names the model does have. The adapter's saved config records what it targeted, and
``target_layers`` / ``adapted_layers`` compare settings by the layers they select, so an
expanded name never reads as a changed setting.

The rules read a model's ``Layers``: from the loaded model (``layers_of``), or, where none
is loaded (``reinf status``), from its files (``read_layers``: safetensors headers and
config.json), so a setting is judged by one rule either way. Reading the files needs
neither torch nor peft.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from reinf.errors import ConfigError, ReinfError
from reinf.model.shape import read_weight_shapes

TARGETS_KEY = "lora.target_modules"
# Leaf names of attention projections, for architectures peft's own mapping does not know.
_QUERY_NAMES = ("q_proj", "query", "q", "wq", "query_proj")
_VALUE_NAMES = ("v_proj", "value", "v", "wv", "value_proj")
_FUSED_NAMES = ("qkv_proj", "query_key_value", "c_attn", "Wqkv", "W_pack", "qkv", "in_proj")
_ATTENTION = re.compile(r"attn|attention", re.I)


@dataclass(frozen=True)
class Layers:
    """A model's layers as the target rules read them."""
    layers: tuple[tuple[str, str], ...]  # (name, kind) of each layer peft can wrap, in order:
    #                                      "linear" (nn.Linear, bitsandbytes', transformers'
    #                                      Conv1D) or "other" (Embedding, Conv)
    blocks: tuple[str, ...]              # names of the attention blocks
    head: str | None                     # the output layer (all-linear leaves it alone)
    model_types: tuple[str, ...]         # config.model_type, then the text config's


def lora_targets(model, setting) -> list[str] | str:
    """What peft's ``LoraConfig(target_modules=...)`` gets for ``lora.target_modules``.

    ``auto``: the attention projections: peft's mapping for the model type where it has
    one (and its names exist here), else the query and value projections (or the fused
    qkv one, or all Linear layers) found inside the model's attention blocks.
    ``all-linear``: peft's own ``"all-linear"``. A list: kept as it is, but one that names
    no layer of this model is refused with the names the model does have. ``model`` is a
    loaded model or its ``Layers``.
    """
    if setting == "all-linear":
        return "all-linear"
    view = layers_of(model)
    if setting == "auto":
        return _auto_targets(view)
    names = [setting] if isinstance(setting, str) else list(setting)
    if not target_layers(view, names):
        raise ConfigError(f"{TARGETS_KEY} {names} matches no layer of "
                          f"{_model_type(view)}; its Linear layers are "
                          f"named {', '.join(linear_names(view)) or '(none)'}",
                          key=TARGETS_KEY, fix=f"set {TARGETS_KEY} to auto, all-linear, "
                                               "or some of those names")
    return names


def lora_target_names(model, setting) -> list[str]:
    """Distinct leaf names of the layers ``setting`` selects in ``model`` (for code that
    matches layers by leaf name, such as the benchmarks' random adapters)."""
    view = layers_of(model)
    layers = target_layers(view, lora_targets(view, setting))
    return sorted({name.rsplit(".", 1)[-1] for name in layers})


def lora_target_warnings(model, setting) -> list[str]:
    """The reason ``setting`` cannot train ``model`` (a loaded model, or ``read_layers`` of
    its directory), as warnings for the engine and `reinf status`."""
    view = layers_of(model)
    try:
        # auto fails only where peft's mapping and the attention blocks both find nothing:
        # where the blocks find something, peft (and its import) is not needed to say so
        if setting != "auto" or not attention_projections(view):
            lora_targets(view, setting)
    except ReinfError as exc:
        return [f"{exc} (training stops until it is fixed)"]
    return []


def target_layers(model, targets) -> set[str]:
    """Names of the layers an adapter with ``targets`` wraps, by peft's matching rule (a
    string is a regex over the whole name; a list matches a name or its dotted suffix)."""
    view = layers_of(model)
    if targets == "all-linear":
        return {name for name, kind in view.layers if kind == "linear" and name != view.head}
    if isinstance(targets, str):
        return {name for name, _ in view.layers if re.fullmatch(targets, name)}
    return {name for name, _ in view.layers
            if any(name == t or name.endswith("." + t) for t in targets)}


def linear_names(model) -> list[str]:
    """Distinct leaf names of the model's Linear (and transformers Conv1D) layers."""
    return sorted({name.rsplit(".", 1)[-1] for name, kind in layers_of(model).layers
                   if kind == "linear"})


def attention_projections(model) -> list[str]:
    """Leaf names of the input projections of the model's attention blocks (modules whose
    class or name says attention): query and value where they are separate, else the fused
    qkv projection, else every Linear layer in there."""
    view = layers_of(model)
    blocks = tuple(name + "." for name in view.blocks)
    leaves: list[str] = []
    for name, kind in view.layers:
        leaf = name.rsplit(".", 1)[-1]
        if kind == "linear" and name.startswith(blocks) and leaf not in leaves:
            leaves.append(leaf)
    query = next((n for n in leaves if n in _QUERY_NAMES), None)
    value = next((n for n in leaves if n in _VALUE_NAMES), None)
    if query and value:
        return [query, value]
    fused = [n for n in leaves if n in _FUSED_NAMES or "qkv" in n.lower()]
    return fused[:1] or leaves


def _auto_targets(view: Layers) -> list[str] | str:
    # Function-local: peft imports transformers, which reinf status (read_layers) goes without.
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as MAP

    for kind in view.model_types:
        mapped = MAP.get(kind)
        if mapped and target_layers(view, mapped):
            return mapped if isinstance(mapped, str) else list(mapped)
    found = attention_projections(view)
    if not found:
        raise ConfigError(f"{TARGETS_KEY} auto found no attention projections in "
                          f"{_model_type(view)}; its Linear layers are named "
                          f"{', '.join(linear_names(view)) or '(none)'}", key=TARGETS_KEY,
                          fix=f"set {TARGETS_KEY} to all-linear or to some of those names")
    return found


def _model_type(view: Layers) -> str:
    return view.model_types[0] if view.model_types else "this model"


# --- a model's layers --------------------------------------------------------------------------

def layers_of(model) -> Layers:
    """The ``Layers`` of a loaded (or peft-injected) model; ``Layers`` as they are."""
    if isinstance(model, Layers):
        return model
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    layers, head_name = [], None
    for name, kind, module in _walk(model):
        layers.append((name, kind))
        if head is not None and module is head:
            head_name = name
    blocks = tuple(name for name, module in base.named_modules()
                   if name and ("Attention" in type(module).__name__
                                or _ATTENTION.search(name.rsplit(".", 1)[-1])))
    cfg = getattr(model, "config", None)
    types = [getattr(cfg, "model_type", None)]
    if cfg is not None and hasattr(cfg, "get_text_config"):
        types.append(getattr(cfg.get_text_config(), "model_type", None))
    return Layers(tuple(layers), blocks, head_name, tuple(t for t in types if t))


def read_layers(model_dir: Path) -> Layers | None:
    """The ``Layers`` of the model in ``model_dir`` from its files, with no model load: each
    weight in its safetensors headers (2-D: Linear, or Embedding by its name; 3-D and up:
    Conv; 1-D weights are norms, which peft does not wrap), attention blocks by their names
    (the classes are unknown here), the model type from config.json. None where there are
    no readable safetensors files."""
    shapes = read_weight_shapes(Path(model_dir))
    if not shapes:
        return None
    layers = []
    for key, shape in shapes.items():
        if not key.endswith(".weight") or len(shape) < 2:
            continue
        name = key[:-len(".weight")]
        leaf = name.rsplit(".", 1)[-1]
        embedding = "emb" in leaf or leaf in ("wte", "wpe")
        layers.append((name, "linear" if len(shape) == 2 and not embedding else "other"))
    blocks = sorted({".".join(parts[:i]) for name, _ in layers
                     for parts in [name.split(".")] for i in range(1, len(parts))
                     if _ATTENTION.search(parts[i - 1])})
    head = next((name for name, kind in layers if name.rsplit(".", 1)[-1] == "lm_head"), None)
    return Layers(tuple(layers), tuple(blocks), head, _config_types(Path(model_dir)))


def _config_types(model_dir: Path) -> tuple[str, ...]:
    try:
        cfg = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ()
    if not isinstance(cfg, dict):
        return ()
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    return tuple(t for t in (cfg.get("model_type"), text.get("model_type"))
                 if isinstance(t, str) and t)


def _walk(model):
    """(name, kind, module) of each layer peft can wrap: kind "linear" (nn.Linear, also
    bitsandbytes', or transformers' Conv1D) or "other" (Embedding, Conv). Inside a LoRA
    layer only the LoRA layer itself counts, as the layer it wraps."""
    # Function-local: reinf status judges lora.target_modules from the files (read_layers)
    # and must not import torch, transformers or peft for it.
    import torch
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


# --- what a model carries ----------------------------------------------------------------------

def fan_in_fan_out(model, targets) -> bool:
    """Whether the layers ``targets`` selects are transformers' Conv1D (GPT-2's), which store
    their weight as (in, out): peft's ``LoraConfig(fan_in_fan_out=...)`` must say so."""
    from transformers.pytorch_utils import Conv1D  # as _walk's

    chosen = target_layers(model, targets)
    convs = {name for name, _, module in _walk(model)
             if isinstance(getattr(module, "base_layer", module), Conv1D)}
    return bool(chosen) and chosen <= convs


def adapted_layers(model) -> set[str]:
    """Names of the layers that carry LoRA in a (peft-injected) model."""
    from peft.tuners.tuners_utils import BaseTunerLayer  # as _walk's

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {name for name, module in base.named_modules() if isinstance(module, BaseTunerLayer)}
