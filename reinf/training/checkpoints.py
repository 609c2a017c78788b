"""Checkpoint directories: atomic write, load, retention.

A checkpoint lives in ``<data_dir>/checkpoints/<id>/`` and holds:

- ``adapter_config.json`` + ``adapter_model.safetensors``: the PEFT adapter, loadable with
  ``PeftModel.from_pretrained(base, path)``; its ``base_model_name_or_path`` is the
  ``model_path`` setting as written (``reinf-demo``, a hub id), not this machine's path, so
  a checkpoint can be moved and shared (Reinf loads it onto a base it has already loaded);
- ``value_head.safetensors``: the PPO value head, when the round trained it
  (``ppo.advantage: gae``); optional, since an RLOO round
  neither reads nor trains it, and a round whose checkpoint has none starts a fresh (zero)
  head;
- ``rating_model.safetensors``: the round's rating model (``reinf.training.rating_model``),
  when the round fitted one; optional, since each round fits it afresh from the ratings;
- ``trainer_state.pt``: optimizer state, KL controller, running reward statistics and the
  round / step counters (plain tensors and numbers: loads with ``weights_only=True``);
- ``metrics.json``: the round's metrics and lineage (id, parent_id, run_id), written last.

It is written into ``.tmp-<id>-<pid>-<random>`` beside its final place and renamed into
place in one step, so a crash leaves either a complete checkpoint or a ``.tmp-*`` directory
that nothing loads (the loader refuses both ``.tmp-*`` names and incomplete file sets) and
that the next round removes once its writer process is gone.

torch is imported only where tensors are read or written, so that checking, cleaning and
retention stay cheap for the daemon and for a round that finds nothing to do.
"""
from __future__ import annotations

import json
import math
import os
import re
import secrets
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from reinf.errors import TrainingError

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
VALUE_HEAD = "value_head.safetensors"       # optional: not in REQUIRED
RATING_MODEL = "rating_model.safetensors"   # optional: not in REQUIRED
TRAINER_STATE = "trainer_state.pt"
METRICS = "metrics.json"
REQUIRED = ADAPTER_FILES + (TRAINER_STATE, METRICS)
TMP_PREFIX = ".tmp-"


def root_dir(config) -> Path:
    return config.data_dir / "checkpoints"


def create_checkpoint_id(round_number: int, now: datetime | None = None) -> str:
    """Sortable and unique: ``r0007-20250101-120000-3fa2``."""
    now = now or datetime.now(timezone.utc)
    return f"r{round_number:04d}-{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def is_complete(path: Path) -> bool:
    """A real checkpoint: not a temporary directory, and every file present."""
    path = Path(path)
    return (path.is_dir() and not path.name.startswith(TMP_PREFIX)
            and all((path / name).is_file() for name in REQUIRED))


def write_checkpoint(root: Path, checkpoint_id: str, *, model, value_head,
                     state: dict[str, Any], metrics: dict[str, Any],
                     rating_model: dict[str, Any] | None = None,
                     base_model_name: str | None = None) -> Path:
    """Write a checkpoint atomically and return its final path.

    ``model`` is the PEFT model (``save_pretrained`` writes only the adapter);
    ``value_head`` the value head, or None when the round did not train it;
    ``rating_model`` the rating model's tensors (``RatingModel.state_dict()``), if any;
    ``base_model_name`` the base model as the adapter config records it (default: the
    path it was loaded from).
    """
    import torch
    from safetensors.torch import save_file

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_id
    if final.exists():
        raise TrainingError(f"checkpoint {checkpoint_id} already exists at {final}")
    tmp = root / f"{TMP_PREFIX}{checkpoint_id}-{os.getpid()}-{secrets.token_hex(3)}"
    tmp.mkdir()
    try:
        _point_at_loaded_base(model)
        model.save_pretrained(str(tmp))
        if base_model_name:
            record_base_model(tmp, base_model_name)
        if value_head is not None:
            save_file({k: v.detach().float().cpu().contiguous()
                       for k, v in value_head.state_dict().items()}, str(tmp / VALUE_HEAD))
        torch.save(state, tmp / TRAINER_STATE)
        if rating_model is not None:
            save_file({k: v.detach().cpu().contiguous() for k, v in rating_model.items()},
                      str(tmp / RATING_MODEL))
        # metrics.json last: its presence marks the set complete.
        (tmp / METRICS).write_text(json.dumps(jsonable(metrics), indent=2, sort_keys=True),
                                   encoding="utf-8")
        _fsync_tree(tmp)
        publish(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(root)
    return final


def _point_at_loaded_base(model) -> None:
    """Saving, PEFT reads the recorded base's config.json (from the Hub if it is no local
    directory). A round resumed from a checkpoint carries that checkpoint's recorded name
    (``reinf-demo``): point it at the base actually loaded, so nothing is looked up."""
    get_base = getattr(model, "get_base_model", None)
    loaded = getattr(get_base(), "name_or_path", None) if get_base else None
    if loaded:
        for peft_config in getattr(model, "peft_config", {}).values():
            peft_config.base_model_name_or_path = loaded


def record_base_model(directory: Path, name: str) -> None:
    """Set ``base_model_name_or_path`` in the adapter config(s) saved under ``directory``."""
    for path in sorted(Path(directory).rglob("adapter_config.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        data["base_model_name_or_path"] = name
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def publish(tmp: Path, final: Path) -> None:
    """The one step that makes a checkpoint visible (a directory rename; atomic on POSIX)."""
    os.rename(tmp, final)


@dataclass
class LoadedCheckpoint:
    path: Path
    value_head: dict[str, Any] | None   # name -> tensor; None: no file, or a damaged one
    state: dict[str, Any] | None        # None: the file is damaged
    metrics: dict[str, Any]             # {} when the file is damaged
    # (file name, why) for each file that exists but cannot be read
    damaged: list[tuple[str, str]] = field(default_factory=list)


def load_checkpoint(path: Path) -> LoadedCheckpoint:
    """The value head, trainer state and metrics of a complete checkpoint.

    The adapter itself is loaded by the caller with ``PeftModel.from_pretrained(base, path)``.
    A value head, trainer state or metrics file that is there but cannot be read (damaged
    on disk, written by something else) comes back as None (``{}`` for the metrics), named
    in ``damaged`` with the reason, so the caller can start those parts fresh and say so.
    No value head file (a round that did not train one) is None too, and no damage.
    """
    import torch
    from safetensors.torch import load_file

    path = Path(path)
    if not is_complete(path):
        missing = [n for n in REQUIRED if not (path / n).is_file()] if path.is_dir() else ["all"]
        raise TrainingError(f"checkpoint {path} is incomplete (missing: {', '.join(missing)})",
                            fix="roll back to another checkpoint with `reinf rollback`, "
                                "or to the base model with `reinf rollback base`")
    damaged: list[tuple[str, str]] = []

    def read(name: str, load, kind: type):
        try:
            value = load(path / name)
        except Exception as exc:  # noqa: BLE001 - whatever the library raises on bad bytes
            damaged.append((name, one_line(exc)))
            return None
        if not isinstance(value, kind):
            damaged.append((name, f"holds a {type(value).__name__}, not a mapping"))
            return None
        return value

    value_head = (read(VALUE_HEAD, lambda f: load_file(str(f)), dict)
                  if (path / VALUE_HEAD).exists() else None)
    state = read(TRAINER_STATE, lambda f: torch.load(f, map_location="cpu", weights_only=True),
                 dict)
    metrics = read(METRICS, lambda f: json.loads(f.read_text(encoding="utf-8")), dict)
    return LoadedCheckpoint(path=path, value_head=value_head, state=state,
                            metrics=metrics or {}, damaged=damaged)


def one_line(exc: BaseException, limit: int = 160) -> str:
    """``Type: message`` on one line: a long message is cut after its first sentence (torch's
    goes on about ``weights_only``, beside the point for a damaged file), and at ``limit``."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    if len(text) > limit and ". " in text:
        text = text[:text.index(". ")]
    return text if len(text) <= limit else text[:limit - 1] + "…"


def load_rating_model(path: Path) -> dict[str, Any] | None:
    """The rating model's tensors saved in a checkpoint, or None if it has none."""
    from safetensors.torch import load_file

    file = Path(path) / RATING_MODEL
    return load_file(str(file)) if file.is_file() else None


def clean_stray(root: Path) -> list[Path]:
    """Remove ``.tmp-*`` directories whose writer process has gone (a crash mid-write)."""
    removed = []
    root = Path(root)
    if not root.is_dir():
        return removed
    for path in root.iterdir():
        if path.is_dir() and path.name.startswith(TMP_PREFIX) and not _writer_alive(path.name):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


CHECKPOINT_NAME = re.compile(r"r\d{4}-\d{8}-\d{6}-[0-9a-f]{4}")  # create_checkpoint_id's
LINEAGE = ("checkpoint_id", "parent_id", "run_id", "base_model")


def adopt_stray(store, root: Path) -> tuple[list[str], list[Path]]:
    """Published checkpoint directories that have no row: a kill between the rename (in
    ``write_checkpoint``) and the store's transaction (``Store.promote``). Returns the ids
    recorded and the directories removed.

    A complete one whose ``metrics.json`` names itself and a run the store has is recorded
    as a promoted checkpoint, but not made active: its round passed the gate before it was
    written, but the person never saw it served, so it waits in `reinf checkpoints` for a
    `reinf rollback ID`. Any other (files missing, or its run unknown, e.g. the database
    was restored from an older backup) is removed: nothing refers to it, nothing can load
    it, and it would otherwise stay forever. Directories that have a row, ``.tmp-*``
    directories (``clean_stray``'s) and names Reinf does not write are never touched. The
    caller holds the train lock, so no round is between its rename and its row.
    """
    from reinf.errors import NotFound

    root = Path(root)
    if not root.is_dir():
        return [], []
    rows = store.list_checkpoints()
    known = {r.id for r in rows} | {Path(r.path).name for r in rows}
    adopted, removed = [], []
    for path in sorted(root.iterdir()):
        if not path.is_dir() or not CHECKPOINT_NAME.fullmatch(path.name) or path.name in known:
            continue
        try:
            data = json.loads((path / METRICS).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = None
        run_id = data.get("run_id") if isinstance(data, dict) else None
        try:
            run = store.get_run(run_id) if isinstance(run_id, int) else None
        except NotFound:
            run = None
        if run is not None and is_complete(path) and data.get("checkpoint_id") == path.name:
            store.add_checkpoint(path.name, str(path), parent_id=data.get("parent_id"),
                                 run_id=run_id, status="promoted",
                                 metrics={k: v for k, v in data.items() if k not in LINEAGE})
            adopted.append(path.name)
        else:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return adopted, removed


def _writer_alive(name: str) -> bool:
    # .tmp-<id>-<pid>-<hex>; the id has dashes of its own, so read from the right.
    try:
        pid = int(name.rsplit("-", 2)[1])
    except (IndexError, ValueError):
        return False
    if pid == os.getpid():
        return False  # our own leftover from an earlier, failed write
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- retention --------------------------------------------------------------------------

def score(metrics: dict[str, Any]) -> float:
    """How retention ranks checkpoints: the mean mapped reward of the round that made it."""
    value = metrics.get("reward_mean")
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else -math.inf


def apply_retention(store, root: Path, keep_best: int) -> list[str]:
    """Keep the active checkpoint, its parent and the ``keep_best`` best promoted ones;
    delete the other promoted checkpoints' files and mark their rows ``deleted``.

    Rejected rows keep their status (their files are never kept; see trainer.py).
    Only directories inside ``root`` are ever removed.
    """
    root = Path(root).resolve()
    rows = store.list_checkpoints()
    keep = set()
    for row in rows:
        if row.active:
            keep |= {row.id, row.parent_id}
    promoted = [r for r in rows if r.status == "promoted"]
    ranked = sorted(promoted, key=lambda r: (score(r.metrics), r.created_at, r.id), reverse=True)
    keep |= {r.id for r in ranked[:keep_best]}
    deleted = []
    for row in promoted:
        if row.id in keep:
            continue
        remove_files(root, Path(row.path))
        store.set_checkpoint_status(row.id, "deleted")
        deleted.append(row.id)
    return deleted


def remove_files(root: Path, path: Path) -> None:
    path = path.resolve()
    if path.parent == Path(root).resolve() and path.is_dir():
        shutil.rmtree(path, ignore_errors=True)


# --- helpers ------------------------------------------------------------------------------

def jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; the run row says why the round was rejected
    if hasattr(value, "tolist"):  # a tensor or numpy value
        return jsonable(value.tolist())
    return value


def _fsync_tree(path: Path) -> None:
    for file in path.iterdir():
        if file.is_file():
            with open(file, "rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(path)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
