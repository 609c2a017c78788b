"""The memory plan of a training round: what the server and the trainer child hold at once.

During a round the server keeps its copy of the base model (plus a KV cache, since a person
may chat meanwhile) and the trainer child loads another, trains a LoRA adapter on it and
samples rollouts with it. ``plan_memory`` estimates both from the model's ``config.json``
alone (no weights are read; safetensors headers only where config.json lacks the shape) and
compares the sum with what the device has. ``reinf status`` shows the plan; the trainer
uses it for ``training.base_quantization: auto`` (:func:`trainer_quantization`).

The formulas, one function a part, are in ``reinf.model.footprint``; the model's shape comes from
``reinf.model.shape``. Here: the plan against what each device has, its verdict, and the settings
that would make it fit.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reinf.catalog import resolve_model_path
from reinf.model.footprint import GIB, Settings, server_parts, trainer_parts, trainer_total
from reinf.model.shape import Shape, load_shape

TIGHT_FROM = 0.85          # planned / capacity above this: tight; above 1: will not fit
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FITS, TIGHT, WONT, UNKNOWN = "fits", "tight", "will not fit", "unknown"


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
    name = resolve_model_path(config)
    shape, reason = load_shape(name)
    if shape is None:
        return MemoryPlan(model=name, verdict=UNKNOWN, reason=reason)
    if device is None:
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
# torch is imported only where a GPU is asked about: `reinf status` with a device set by name
# plans without it.

def planned_device(setting: str) -> str:
    """The device a model load picks for the ``device`` setting (reinf.model.modeling.plan_load),
    without loading one. A device set by name is taken as set (a load refuses one this
    machine lacks, and says why), so only ``auto`` imports torch to look."""
    if setting != "auto":
        return setting
    from reinf.model.modeling import plan_load, visible_devices

    return plan_load(setting, "auto", "none", **visible_devices()).device


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
    return importlib.util.find_spec("bitsandbytes") is not None


def _cuda_bf16() -> bool:
    import torch

    from reinf.model.modeling import cuda_facts

    return cuda_facts()[0] if torch.cuda.is_available() else True
