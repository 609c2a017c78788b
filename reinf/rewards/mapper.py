"""The reward mapper: how a 1-5 rating becomes the reward PPO trains on, and its weight.

The contract is a plain function ``reward_mapper(score: int, metadata: dict) -> float``.
``reward_mapper: default`` in the config uses :func:`default_reward`; ``path/to/file.py:fn``
uses the person's hook file, run in a child process by :mod:`reinf.rewards.hooks` (so a broken or
hung hook never takes anything down, and every evaluation sees the file as it is now).
Automatic critics (:mod:`reinf.rewards.critics`) may then be combined with the human reward; the
result is clipped to [reward_min, reward_max]. Time decay is a separate sample weight.

A broken hook raises HookError (file, line, message); nothing ever falls back to another
mapper. :func:`hook_status` reports the same error cheaply for ``reinf status``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Mapping, Sequence

from reinf.errors import HookError
from reinf.records import Sample
from reinf.rewards import critics as critics_mod
from reinf.rewards import hooks

log = logging.getLogger("reinf.rewards.mapper")
FAILURE_FILE = "reward_hook_error.json"   # last failure on real data, for `reinf status`
_status_cache: dict[str, dict] = {}       # fingerprint of (hook, file bytes, settings) -> result
_status_lock = threading.Lock()
_last_logged: str | None = None


@dataclass(frozen=True)
class RewardRow:
    turn_id: int
    score: int
    human_reward: float            # the mapper's output, before critics and clipping
    critics: dict[str, float]      # enabled critics' values, each in [-1, 1]
    reward: float                  # final: combined with critics, clipped
    weight: float                  # time decay, 0.5 ** (age_days / half_life_days)
    kept: bool                     # False: dropped by consensus; the trainer must skip it
    age_seconds: float
    tags: list[str]
    critical: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --- the default mapper -----------------------------------------------------------------

def rewards_settings(config: Any) -> dict[str, Any]:
    """The rewards section as a plain dict, from a Config, a RewardsConfig or a dict."""
    if isinstance(config, Mapping):
        return dict(config)
    section = getattr(config, "rewards", config)
    return dataclasses.asdict(section)


def default_mapper(score: int, metadata: Mapping[str, Any], *, config: Any) -> float:
    """(score - 3) / 2, moved further from 0 by ``critical_bonus`` for a critical rating, plus
    ``tag_adjustments`` of each tag. Not clipped here: the final reward is.

    A predicted score (the rating model's guess for a fresh reply) may be a float.
    Examples with the defaults: 5 -> 1.0, 4.2 -> 0.6, 5 critical -> 1.5, 1 critical -> -1.5, 3 critical
    -> 0.0, 2 with "too technical" -> -0.7. Tags match ignoring case and extra spaces.
    """
    settings = rewards_settings(config)
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not 1 <= score <= 5:
        raise ValueError(f"score must be a number from 1 to 5, got {score!r}")
    reward = (score - 3) / 2
    if metadata.get("critical") and reward != 0:
        reward += math.copysign(float(settings["critical_bonus"]), reward)
    adjustments = {_tag_key(t): float(v) for t, v in settings["tag_adjustments"].items()}
    for tag in {_tag_key(t) for t in metadata.get("tags") or ()}:
        reward += adjustments.get(tag, 0.0)
    return reward


def default_reward(score: int, metadata: Mapping[str, Any]) -> float:
    """The built-in mapper with the settings Reinf put in ``metadata["settings"]``; what
    ``reward_mapper: default`` means, and what a hook file calls to build on it."""
    if "settings" not in metadata:
        raise KeyError("metadata has no 'settings': pass on the metadata your hook was given")
    return default_mapper(score, metadata, config=metadata["settings"])


def decay_weight(age_seconds: float, half_life_days: float) -> float:
    """0.5 ** (age_days / half_life_days); 1 when half_life_days is 0 (no decay)."""
    if half_life_days <= 0:
        return 1.0
    return 0.5 ** (max(0.0, age_seconds) / 86_400 / half_life_days)


def _tag_key(tag: str) -> str:
    return " ".join(str(tag).lower().split())


# --- metadata ---------------------------------------------------------------------------

def build_metadata(sample: Sample, now: datetime, *,
                   settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What the mapper and critics see about one rated turn (JSON-ready; the README's
    "The contract" lists it)."""
    rated_at = _aware(sample.rated_at)
    age = max(0.0, (_aware(now) - rated_at).total_seconds())
    return {
        "turn_id": sample.turn_id, "score": sample.score,
        "prompt": sample.prompt, "response": sample.response,
        "response_length": {"tokens": len(sample.reply_ids), "chars": len(sample.response)},
        "prompt_length": {"tokens": len(sample.prompt_ids), "chars": len(sample.prompt)},
        "tags": list(sample.tags), "comment": sample.comment, "critical": bool(sample.critical),
        "rated_at": rated_at.isoformat(), "created_at": _aware(sample.created_at).isoformat(),
        "age_seconds": age, "age_days": age / 86_400,
        "conversation_id": sample.conversation_id, "turn_index": sample.turn_index,
        "user_id": sample.user_id, "checkpoint_id": sample.checkpoint_id or "base",
        "temperature": sample.temperature,
        "settings": dict(settings) if settings is not None else {},
        "predicted": bool(sample.predicted), "rewrite": bool(sample.rewrite),
    }


def _aware(ts: datetime) -> datetime:
    return ts if ts.tzinfo else ts.replace(tzinfo=timezone.utc)


# --- computing rewards ------------------------------------------------------------------

def compute_rewards(config, samples: Sequence[Sample], *, now: datetime | None = None,
                    labels: list[str] | None = None) -> list[RewardRow]:
    """The reward, weight and critic values of each sample, in order. ``labels`` name the
    samples in error messages (default: "turn <id>").

    Raises HookError (file, line, message) if the hook or a critic fails on any sample;
    the error is logged and remembered for :func:`hook_status`. Never falls back.
    """
    return _compute(config, samples, now=now, log_errors=True, labels=labels)


def _compute(config, samples, *, now, log_errors: bool, remember: bool = True,
             labels: list[str] | None = None) -> list[RewardRow]:
    now = now or datetime.now(timezone.utc)
    settings = rewards_settings(config)
    weights = critics_mod.enabled(settings["critics"])
    spec = sha = None
    try:
        spec = hooks.parse_spec(settings["reward_mapper"], config.data_dir)
        metas = [build_metadata(s, now, settings=settings) for s in samples]
        if spec is None:
            _check_critics(weights, [], None)
            human = [default_mapper(s.score, m, config=settings) for s, m in zip(samples, metas)]
            custom: list[dict[str, float]] = [{} for _ in samples]
        else:
            source, sha = hooks.read_source(spec)  # these bytes are what runs and what is keyed
            result = hooks.run_hook(spec, source, [(s.score, m) for s, m in zip(samples, metas)],
                                    labels or [f"turn {s.turn_id}" for s in samples],
                                    critics=list(weights),
                                    call_timeout=settings["hook_timeout_seconds"],
                                    import_timeout=_import_timeout(settings),
                                    memory_mb=int(settings.get("hook_memory_mb",
                                                               hooks.MEMORY_MB)))
            _check_critics(weights, result.defined_critics, spec)
            human, custom = result.rewards, result.critics
    except HookError as exc:
        if log_errors:
            _log_error(exc)
        if remember and samples and sha is not None:
            _record_failure(config, _fingerprint(spec, sha, settings), exc)
        raise
    if remember and spec is not None:
        _clear_failure(config)
    return [_finish(s, m, h, c, settings) for s, m, h, c in zip(samples, metas, human, custom)]


def _log_error(exc: HookError) -> None:
    """Log a hook failure at ERROR once; the same failure again (every history page, every
    scheduler tick) only at DEBUG, so the log stays readable."""
    global _last_logged
    text = str(exc)
    log.log(logging.DEBUG if text == _last_logged else logging.ERROR, "%s", text)
    _last_logged = text


def _import_timeout(settings: Mapping[str, Any]) -> float:
    return float(settings.get("hook_import_timeout_seconds", hooks.IMPORT_TIMEOUT_SECONDS))


def _check_critics(weights: Mapping[str, float], defined: list[str], spec) -> None:
    unknown = [n for n in weights if n not in critics_mod.BUILTIN and n not in defined]
    if not unknown:
        return
    name = unknown[0]
    fix = (f"define critic_{name}(prompt, response, metadata) in your hook file, or set its "
           "weight to 0; training is paused until then")
    builtin = ", ".join(critics_mod.BUILTIN)
    if spec is not None:
        raise hooks.build_error(spec.path, None, f"critic '{name}' has a weight in the config, "
                                f"but the file has no critic_{name}() and it is not built in "
                                f"({builtin})", fix=fix)
    raise HookError(f"critic '{name}' has a weight in the config but is not built in ({builtin}),"
                    " and reward_mapper is 'default', so no hook file can define it",
                    fix=fix, key="critics")


def _finish(sample: Sample, meta: dict, human: float, custom: dict[str, float],
            settings: Mapping[str, Any]) -> RewardRow:
    weights = critics_mod.enabled(settings["critics"])
    values = {}
    for name in weights:  # the hook file's critic wins over a built-in of the same name
        values[name] = custom[name] if name in custom else \
            critics_mod.BUILTIN[name](sample.prompt, sample.response, meta)
    reward, kept = critics_mod.combine(human, values, weights, settings["critic_combine"],
                                       settings["human_weight"])
    reward = min(max(reward, settings["reward_min"]), settings["reward_max"])
    return RewardRow(turn_id=sample.turn_id, score=sample.score, human_reward=human,
                     critics=values, reward=reward,
                     weight=decay_weight(meta["age_seconds"], settings["half_life_days"]),
                     kept=kept, age_seconds=meta["age_seconds"], tags=list(sample.tags),
                     critical=bool(sample.critical))


# --- status -----------------------------------------------------------------------------

def hook_status(config) -> dict[str, Any]:
    """``{"mapper", "path", "ok", "error", "line", "fix"}`` for `reinf status` and GET /api/status.

    A hook file is checked by importing it and calling it (and its enabled critics) on five
    example ratings, in a child process with the usual time limits; the result is cached
    by the file's bytes and the rewards settings, so repeated calls cost a file read and a
    hash. A failure seen on real ratings (by training or preview) is reported too, until
    the file or the settings change or a later evaluation succeeds.
    """
    settings = rewards_settings(config)
    out: dict[str, Any] = {"mapper": settings["reward_mapper"], "path": None, "ok": True,
                           "error": None, "line": None, "fix": None}
    try:
        spec = hooks.parse_spec(settings["reward_mapper"], config.data_dir)
        if spec is None:
            _check_critics(critics_mod.enabled(settings["critics"]), [], None)
            return out
        out["path"] = str(spec.path)
        _, sha = hooks.read_source(spec)
        key = _fingerprint(spec, sha, settings)
        with _status_lock:
            if key not in _status_cache:
                _status_cache.clear()  # only the newest version matters
                _status_cache[key] = _validate(config)
            error = _status_cache[key] or _load_failure(config, key)
    except HookError as exc:
        error = {"message": exc.message, "line": getattr(exc, "line", None), "fix": exc.fix}
    if error:
        out.update(ok=False, error=error["message"], line=error.get("line"),
                   fix=error.get("fix") or hooks.FIX)
    return out


def check_hook(config, store=None) -> dict[str, Any]:
    """Raise HookError if training would refuse; the daemon calls this before scheduling.

    With a store, the hook is run on the samples the next round would use (the definitive
    check, which also clears a remembered failure once fixed); without one it is
    :func:`hook_status`.
    """
    if store is not None:
        compute_rewards(config, store.training_samples(config.ppo.replay_buffer_size))
    status = hook_status(config)
    if not status["ok"]:
        exc = HookError(status["error"], fix=status["fix"])
        exc.path, exc.line = status["path"], status["line"]
        _log_error(exc)
        raise exc
    return status


def _validate(config) -> dict | None:
    """Import the hook and run it on the example ratings: None if fine, else the error."""
    now = datetime.now(timezone.utc)
    samples = _examples(now)
    labels = [f"example rating {s.score}" + (" critical" if s.critical else "")
              + (f" tagged {', '.join(s.tags)}" if s.tags else "") for s in samples]
    try:
        _compute(config, samples, now=now, log_errors=False, remember=False, labels=labels)
    except HookError as exc:
        log.info("%s", exc)
        return {"message": exc.message, "line": getattr(exc, "line", None), "fix": exc.fix}
    return None


def _examples(now: datetime) -> list[Sample]:
    """Five made-up ratings (scores 1-5, one critical, some tags) to try a hook on."""
    reply = "Put the egg in boiling water for nine minutes, then cool it in cold water."
    out = []
    for score, tags, critical in ((1, ["wrong"], True), (2, ["too long"], False),
                                  (3, [], False), (4, ["needs examples"], False),
                                  (5, [], True)):
        out.append(Sample(turn_id=0, conversation_id=0, turn_index=1, user_id="local",
                          prompt="How do I boil an egg?", response=reply,
                          prompt_ids=list(range(8)), reply_ids=list(range(18)),
                          logprobs=[-1.0] * 18,
                          checkpoint_id=None, score=score, tags=tags, comment="",
                          critical=critical, rated_at=now - timedelta(days=1),
                          created_at=now - timedelta(days=1), temperature=0.8))
    return out


def _fingerprint(spec, sha: str | None, settings: Mapping[str, Any]) -> str:
    hook = None if spec is None else [spec.text, str(spec.path), spec.function, sha]
    blob = json.dumps([hook, settings], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def mapper_fingerprint(config) -> str | None:
    """The mapper's version: a hash of the hook file's bytes, its path and function, and
    the rewards settings. Anything cached from the mapper's output (failures here, mapped
    rewards in the web UI's history) is keyed by it, so an edit to the file or a setting
    maps again. None when the hook cannot be read (the mapper then says why)."""
    settings = rewards_settings(config)
    try:
        spec = hooks.parse_spec(settings["reward_mapper"], config.data_dir)
        sha = None if spec is None else hooks.read_source(spec)[1]
    except (HookError, OSError):
        return None
    return _fingerprint(spec, sha, settings)


def _record_failure(config, key: str, exc: HookError) -> None:
    record = {"key": key, "message": exc.message, "fix": exc.fix,
              "line": getattr(exc, "line", None),
              "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    path = Path(config.data_dir) / FAILURE_FILE
    try:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as err:
        log.warning("cannot remember the reward hook failure in %s: %s", path, err)


def _load_failure(config, key: str) -> dict | None:
    try:
        record = json.loads((Path(config.data_dir) / FAILURE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("key") == key else None


def scrub_failure(data_dir, texts) -> None:
    """Forget: the remembered failure quoting a forgotten comment or tag keeps the rest of
    its message, with "[forgotten]" in its place."""
    path = Path(data_dir) / FAILURE_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not isinstance(record, dict) or not isinstance(record.get("message"), str):
        return
    message = record["message"]
    for text in texts:
        message = hooks.redact(message, text)
    if message == record["message"]:
        return
    record["message"] = message
    try:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as err:  # it must not keep the text: better no record at all
        log.warning("cannot rewrite %s (%s): removing it", path, err)
        path.unlink(missing_ok=True)


def _clear_failure(config) -> None:
    try:
        (Path(config.data_dir) / FAILURE_FILE).unlink()
    except OSError:
        pass


# --- preview ----------------------------------------------------------------------------

def preview(config, store, limit: int, *, now: datetime | None = None) -> list[dict[str, Any]]:
    """The current mapper and critics applied to the ``limit`` most recently rated turns
    that training would use, newest first. Raises HookError like compute_rewards."""
    now = now or datetime.now(timezone.utc)
    samples = store.training_samples(limit)
    rows = _compute(config, samples, now=now, log_errors=False)  # the person sees it anyway
    return [{"turn_id": r.turn_id, "score": r.score, "tags": r.tags, "critical": r.critical,
             "age": describe_age(r.age_seconds), "age_seconds": round(r.age_seconds, 1),
             "critics": r.critics, "human_reward": r.human_reward, "reward": r.reward,
             "weight": r.weight, "kept": r.kept, "prompt": _clip(s.prompt),
             "response": _clip(s.response)}
            for r, s in zip(rows, samples)]


def describe_age(seconds: float) -> str:
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def _clip(text: str, n: int = 120) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= n else flat[: n - 1] + "…"


def hook_template() -> str:
    """The commented reward_mapper.py that `reinf init` writes into the data directory."""
    return hooks.TEMPLATE
