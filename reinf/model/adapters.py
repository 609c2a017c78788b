"""LoRA adapters on the running model: read from checkpoints, put in place, switched.

``Adapters`` keeps at most two adapters in the model: the active one and the one before
it (for rollback); older ones are deleted to bound memory. "Base" (checkpoint id None)
means adapter layers disabled, so the reference policy needs no second model copy.
``borrowed`` serves one reply with another adapter (``reinf compare``), then puts the
active one back; an adapter loaded only for it is deleted after it.
Nothing here locks: the engine calls it only while it holds its lock, between replies.

Every checkpoint adapter reaches a model through this module: ``read_adapter`` reads it,
``Adapters`` puts it beside others in the serving model, and ``load_adapter`` gives the
trainer and the benchmarks a model with it (PEFT's ``from_pretrained`` is not used), so
a checkpoint that does not fit is refused in the same words everywhere.

peft (which imports transformers) is imported where an adapter is read or put in place:
reinf.serving.engine imports this module, and code that only names the engine's types (the unit
tier, the benchmarks' helpers) stays free of transformers.
"""
from __future__ import annotations

import hashlib
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from reinf.errors import ModelError
from reinf.model.modeling import quiet_peft


class Adapters:
    def __init__(self, model):
        self.model = model          # the base model; PEFT injects LoRA layers into it in place
        self.peft = None            # the PeftModel wrapper, created with the first adapter
        self.names: dict[str, str] = {}  # checkpoint id -> PEFT adapter name, loaded ones
        self.active: str | None = None
        self.previous: str | None = None
        self.can_rollback = False

    def __contains__(self, checkpoint_id: str | None) -> bool:
        return checkpoint_id is None or checkpoint_id in self.names

    def add(self, checkpoint_id: str, peft_config: Any, state_dict: dict) -> None:
        """Put a read adapter (see ``read_adapter``) into the model beside the others,
        inactive. On failure the model is left as it was."""
        name = adapter_name(checkpoint_id)
        created = self.peft is None
        try:
            with _refused_as_misfit(checkpoint_id):
                if created:
                    self.peft = _wrap(self.model, peft_config, name, low_cpu_mem_usage=True)
                else:
                    self.peft.add_adapter(name, peft_config, low_cpu_mem_usage=True)
                _fill(self.peft, checkpoint_id, name, state_dict, low_cpu_mem_usage=True)
        except BaseException:
            if self.peft is not None and name in self.peft.peft_config:
                self.peft.delete_adapter(name)
            self._apply()
            raise
        self.names[checkpoint_id] = name
        if not self.model.training:
            # New LoRA layers start in train mode, and their dropout (lora.dropout, 0.05 by
            # default) would then act on every served token: replies noisier than the
            # adapter, and behaviour log-probs no re-forward reproduces.
            self.peft.eval()
        if created:  # PeftModel() makes its first adapter active; add_adapter does not
            self._apply()

    def activate(self, checkpoint_id: str | None) -> None:
        """Make a loaded adapter (or None, the base) active; keep the one it replaces for
        rollback, and delete every other adapter."""
        if checkpoint_id not in self:
            raise ModelError(f"checkpoint {checkpoint_id} is not loaded")
        if checkpoint_id != self.active:
            self.previous, self.active = self.active, checkpoint_id
            self.can_rollback = True
        for ckpt in list(self.names):
            if ckpt not in (self.active, self.previous):
                self._drop(ckpt)
        self._apply()  # each call walks every module (peft), so only once

    @contextmanager
    def borrowed(self, checkpoint_id: str | None, peft_config: Any = None,
                 state_dict: dict | None = None):
        """Inside the block the model serves ``checkpoint_id`` (None: the bare base) instead
        of the active adapter; after it, the active one again. One not loaded yet is added
        from ``peft_config`` and ``state_dict`` (see ``read_adapter``) and deleted after
        the block, so the active and previous adapters stay as they were."""
        guest = checkpoint_id not in self
        if guest:
            if state_dict is None:
                raise ModelError(f"checkpoint {checkpoint_id} is not loaded")
            self.add(checkpoint_id, peft_config, state_dict)
        try:
            self._apply(checkpoint_id)
            yield
        finally:
            if guest:
                self._drop(checkpoint_id)
            self._apply()

    def _drop(self, checkpoint_id: str) -> None:
        """Delete a loaded adapter from the model. PEFT's active adapter moves to another one
        first (deleting the active one warns); the last adapter stays loaded, unused."""
        name = self.names[checkpoint_id]
        others = [n for c, n in self.names.items() if c != checkpoint_id]
        if not others:
            return
        if name in self.peft.active_adapters:
            self.peft.set_adapter(others[0], inference_mode=True)
        self.peft.delete_adapter(name)
        del self.names[checkpoint_id]

    def _apply(self, serving: str | None = ...) -> None:
        """Make the model's PEFT state serve ``serving`` (default: ``self.active``)."""
        if self.peft is None:
            return
        serving = self.active if serving is ... else serving
        lora = self.peft.base_model
        if serving is None or serving not in self.names:
            lora.disable_adapter_layers()
        else:
            self.peft.set_adapter(self.names[serving], inference_mode=True)
            lora.enable_adapter_layers()


def adapter_name(checkpoint_id: str) -> str:
    """PEFT adapter names become module keys, which cannot hold dots."""
    digest = hashlib.sha1(checkpoint_id.encode()).hexdigest()[:8]  # keeps "a.b" != "a_b"
    return "ckpt_" + "".join(c if c.isalnum() else "_" for c in checkpoint_id) + "_" + digest


def read_adapter(path: Path, checkpoint_id: str) -> tuple[Any, dict]:
    """The LoRA config and weights (on the CPU) of a checkpoint directory.

    Other files the trainer writes there (value head, optimizer state) are ignored.
    """
    from peft import PeftConfig  # peft: see the module docstring
    from peft.utils import load_peft_weights
    path = Path(path)
    if not (path / "adapter_config.json").is_file() and (path / "adapter").is_dir():
        path = path / "adapter"
    if not (path / "adapter_config.json").is_file():
        raise ModelError(f"checkpoint {checkpoint_id}: no adapter_config.json in {path}",
                         fix="the checkpoint is incomplete; roll back or train again")
    try:
        config = PeftConfig.from_pretrained(str(path))
        weights = load_peft_weights(str(path), device="cpu")
    except Exception as exc:  # noqa: BLE001
        raise ModelError(f"checkpoint {checkpoint_id} in {path} cannot be read: "
                         f"{str(exc).splitlines()[0][:200]}",
                         fix="the checkpoint is damaged; roll back or train again") from exc
    if getattr(config.peft_type, "value", config.peft_type) != "LORA":
        raise ModelError(f"checkpoint {checkpoint_id} is a {config.peft_type} adapter, not LoRA",
                         fix="Reinf loads LoRA adapters only")
    config.inference_mode = True
    return config, weights


def load_adapter(model, path: Path, checkpoint_id: str, *, trainable: bool = False):
    """``model`` (changed in place) as a PeftModel holding the adapter of the checkpoint at
    ``path`` under PEFT's default name, as ``PeftModel.from_pretrained`` would give it:
    ``trainable`` for a round that continues it (its LoRA weights require grad), else in
    eval mode for measuring. Its LoRA layers are created (in the dtype PEFT gives them: fp32
    on a bf16 or fp16 base, as training needs) and then filled with the checkpoint's
    weights; a checkpoint that does not fit raises ModelError, as for the serving model."""
    peft_config, state_dict = read_adapter(path, checkpoint_id)
    peft_config.inference_mode = not trainable
    with _refused_as_misfit(checkpoint_id), quiet_peft():
        peft = _wrap(model, peft_config, "default", low_cpu_mem_usage=False)
        _fill(peft, checkpoint_id, "default", state_dict, low_cpu_mem_usage=False)
    return peft if trainable else peft.eval()


# --- putting a read adapter into a model ------------------------------------------------------

def _misfit(checkpoint_id: str, detail: str) -> ModelError:
    return ModelError(f"checkpoint {checkpoint_id} does not fit this model ({detail})",
                      fix="it was trained for another base model; the active adapter "
                          "is unchanged")


@contextmanager
def _refused_as_misfit(checkpoint_id: str):
    """PEFT's size mismatches and missing target modules, as one line naming the checkpoint."""
    try:
        yield
    except (RuntimeError, ValueError) as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        raise _misfit(checkpoint_id, (lines[1] if len(lines) > 1 else lines[0])[:200]) from exc


def _wrap(model, peft_config: Any, name: str, *, low_cpu_mem_usage: bool):
    """A PeftModel around ``model`` with one adapter ``name`` (empty with
    ``low_cpu_mem_usage``, else initialised), of the class ``from_pretrained`` picks for a
    causal LM adapter."""
    from peft import PeftModel, PeftModelForCausalLM  # peft: see the module docstring

    cls = PeftModelForCausalLM if peft_config.task_type == "CAUSAL_LM" else PeftModel
    with quiet_peft():
        return cls(model, peft_config, adapter_name=name, low_cpu_mem_usage=low_cpu_mem_usage)


def _fill(peft, checkpoint_id: str, name: str, state_dict: dict, *,
          low_cpu_mem_usage: bool) -> None:
    """Load the adapter's weights into adapter ``name``; every LoRA weight must land."""
    from peft import set_peft_model_state_dict  # peft: see the module docstring

    result = set_peft_model_state_dict(peft, state_dict, adapter_name=name,
                                       low_cpu_mem_usage=low_cpu_mem_usage)
    missing = [k for k in getattr(result, "missing_keys", []) if f".{name}." in k]
    bad = [k for k in result.unexpected_keys if "lora_" in k] + missing
    if bad:
        raise _misfit(checkpoint_id, f"weights such as {bad[0]} do not match")
