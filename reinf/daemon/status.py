"""What ``reinf status`` and ``GET /api/status`` report, gathered in one place.

Each part of Reinf contributes what it knows; nothing here loads a model.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from reinf.catalog import resolve_model_path
from reinf.config import Config, hidden_model_defaults_note
from reinf.errors import BadInput
from reinf.model.lora import lora_target_warnings, read_layers
from reinf.model.memory import plan_memory, planned_device
from reinf.serving.best_of import best_of_state, read_rater
from reinf.storage import db

#: The sections a training round takes from config.yaml as it is then: the trainer child
#: loads the file afresh each round. A running server keeps every other setting (the
#: model it serves, its address, generation, the schedule, the database) until restarted.
ROUND_SECTIONS = ("lora", "ppo", "training", "rewards")


def collect_status(config: Config, store, *, engine=None, daemon: dict | None = None,
                   schedule: dict | None = None, round_config: Config | None = None) -> dict:
    """A JSON-ready snapshot. ``engine``, ``daemon`` (the lock's view: running, pid, url)
    and ``schedule`` (the scheduler's: next_run, training, warnings) add what only a
    running server knows. ``round_config`` is what the next training round will read
    (config.yaml as it is now, :func:`reread_config`) where that differs from ``config``,
    the one a server started with: the reward hook and the method are reported from it."""
    round_config = round_config or config
    warnings: list[str] = []
    model_path = resolve_model_path(config)
    local = Path(model_path).exists()
    if not local and (model_path.startswith("/") or config.model.model_path == "reinf-demo"):
        warnings.append(f"no model at {model_path} — run `reinf init` or set model_path")
    active = store.active_checkpoint()
    runs = store.list_runs(limit=1)
    out: dict[str, Any] = {
        "data_dir": str(config.data_dir),
        "db_url": _redact(config.db_url),
        "schema_revision": db.current_revision(store.engine),
        "model": {"model_path": config.model.model_path, "resolved": model_path,
                  "found_locally": local, "device": config.model.device,
                  "quantization": config.model.quantization},
        "counts": store.counts(),
        "ratings_waiting": store.ratings_waiting(),
        "train_after_ratings": config.schedule.train_after_ratings,
        "active_checkpoint": active.id if active else "base",
        "last_run": runs[0].to_dict() if runs else None,
        "next_run": (schedule or {}).get("next_run"),
        "schedule": schedule,
        "daemon": daemon or {"running": False},
        "reward_hook": _reward_hook_status(round_config),
        "training": _training_status(round_config, store),
        "vs_base": vs_base_status(store, active),
        "best_of": best_of_status(config, active, engine),
        "explore_styles": explore_status(config, store),
        "log_file": str(config.data_dir / "logs" / "reinf.log"),
        "trainer_log_file": str(config.data_dir / "logs" / "trainer.log"),
        "warnings": warnings,
    }
    warnings.extend((schedule or {}).get("warnings") or [])
    if (hidden := hidden_model_defaults_note(round_config, at_default_only=True)) is not None:
        warnings.append(hidden)
    if engine is None:  # what a model load would use here, without loading one
        out["model"]["device_in_use"] = planned_device(config.model.device)
    if engine is not None:
        out["model"].update(engine.describe())
        warnings.extend(engine.warnings)
    elif local and (lora := _lora_warning(config.lora.target_modules, Path(model_path))):
        warnings.append(lora)
    if engine is None and config.model.quantization != "none":
        import torch
        if not torch.cuda.is_available():
            warnings.append(f"quantization {config.model.quantization} needs CUDA; "
                            "the model loads unquantized on this machine")
    out["memory"] = _memory_status(round_config, out["model"].get("device_in_use"), warnings)
    if out["reward_hook"].get("error"):
        hook = out["reward_hook"]
        fix = hook.get("fix") or "fix the hook"
        # most fix texts say so already (hooks.FIX): say it once
        paused = "" if "training is paused" in fix else " (training is paused until it works)"
        warnings.append(f"{hook['error']} — {fix}{paused}")
    return out


def reread_config(started: Config) -> tuple[Config | None, str | None]:
    """config.yaml loaded again as a training round started now loads it (the trainer
    child reads the file afresh, with the server's environment pointed at the same data
    directory), the server's command-line flags kept: ``(config, None)``, or ``(None,
    one-line error)`` when the file no longer loads. ``started`` itself when the server
    read no file and none has appeared since."""
    from reinf.config import find_config_file, load_config, settings
    from reinf.errors import ReinfError

    environ = {**os.environ, "REINF_HOME": str(started.data_dir)}
    path = started.source or find_config_file(environ)
    if path is None:
        return started, None
    flags = {info.public: getattr(getattr(started, info.section), info.key)
             for info in settings() if started.origin_kind(info.public) in ("flag", "override")}
    try:
        return load_config(path, environ=environ, overrides=flags), None
    except ReinfError as exc:
        return None, " ".join(str(exc).split())
    except Exception as exc:  # noqa: BLE001 - a status must answer even so
        return None, f"{path} cannot be read: {type(exc).__name__}: {' '.join(str(exc).split())}"


def config_changes(started: Config, current: Config | None,
                   error: str | None = None) -> dict | None:
    """What differs between the config a server started with and ``current`` (from
    :func:`reread_config`): None when nothing does, else ``{"file", "error",
    "restart_needed", "next_round", "message"}``. ``restart_needed`` lists the settings
    the server applies only when it starts; ``next_round`` those the next training round
    uses as they are now; ``message`` is the warning line (None when only the latter
    changed: nothing is wrong then)."""
    from reinf.config import CONFIG_FILENAME, settings

    file = (current.source if current is not None else None) or started.source \
        or str(started.data_dir / CONFIG_FILENAME)
    out: dict[str, Any] = {"file": file, "error": error, "restart_needed": [],
                           "next_round": [], "message": None}
    if error is not None:
        out["message"] = (f"{Path(file).name} changed since the server started and no longer "
                          f"loads: {error}; training rounds fail until it is fixed")
        return out
    if current is None:
        return None
    for info in settings():
        before = getattr(getattr(started, info.section), info.key)
        if before != getattr(getattr(current, info.section), info.key):
            out["next_round" if info.section in ROUND_SECTIONS else "restart_needed"].append(
                info.public)
    if not out["restart_needed"] and not out["next_round"]:
        return None
    if out["restart_needed"]:
        names = out["restart_needed"]
        shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        out["message"] = (f"{file} changed since the server started: {shown} "
                          f"{'takes' if len(names) == 1 else 'take'} effect only after a "
                          "restart — stop the server and run `reinf serve` again (until then "
                          "it keeps the values it started with)")
    return out


def _memory_status(config: Config, device: str | None, warnings: list[str]) -> dict:
    """The memory plan of a round beside the server (reinf.model.memory), from config.json alone:
    its summary line, and a warning with the fix where the round would not fit."""
    plan = plan_memory(config, device=device if device in ("cuda", "mps", "cpu") else None)
    if (warning := plan.warning()) is not None:
        warnings.append(warning)
    warnings.extend(plan.notes)
    return {**plan.to_dict(), "summary": plan.summary()}


def _lora_warning(setting, model_dir: Path) -> str | None:
    """``lora.target_modules`` judged by reinf.model.lora's rule on the layers in the model's files
    (no model load). Where the engine is at hand (GET /api/status), its own check on the
    loaded model is reported instead."""
    layers = read_layers(model_dir)
    return next(iter(lora_target_warnings(layers, setting)), None) if layers else None


def _training_status(config: Config, store) -> dict:
    """The method, and what the newest round that got that far decided: its mode (rollouts,
    or rated replies only) and why, the rating model's reward consistency, the styles it
    favoured (styled rollouts) and how many styled replies it imitated
    (training.imitate_styled)."""
    out: dict[str, Any] = {"method": config.training.method, "last_mode": None,
                           "last_mode_reason": None, "reward_consistency": None,
                           "rating_model_ratings": None, "favoured_styles": None,
                           "styled_imitated": None}
    for run in store.list_runs(limit=10):
        metrics = run.metrics or {}
        if "mode" in metrics:
            out.update(last_mode=metrics["mode"], last_mode_reason=metrics.get("mode_reason"),
                       reward_consistency=metrics.get("rating_model_consistency"),
                       rating_model_ratings=metrics.get("rating_model_ratings"),
                       favoured_styles=favoured_styles(metrics.get("style_gains")),
                       styled_imitated=metrics.get("styled_imitated"), run_id=run.id)
            break
    return out


def favoured_styles(gains: dict[str, float] | None, top: int = 3) -> list[list] | None:
    """The styled rollouts' instructions the rating model scored above the plain replies
    (``style_gains``, training.styled_rollouts), best first, at most ``top``: [[instruction,
    gain], ...]; None when the round styled nothing."""
    if not gains:
        return None
    ranked = sorted(((s, g) for s, g in gains.items() if g > 0), key=lambda sg: -sg[1])
    return [[s, round(g, 2)] for s, g in ranked[:top]]


def vs_base_status(store, active) -> dict | None:
    """What changed, at a glance: the active checkpoint against the bare base, by the
    rating model (its round's ``vs_base`` metrics) and by the person's picks (counted now:
    pairs between it or its ancestors and the base, reinf.training.leaderboard.picks_vs_base)."""
    from reinf.training.leaderboard import picks_vs_base

    if active is None:
        return None
    by_model = (active.metrics.get("vs_base") or {}).get("by_rating_model")
    picks = picks_vs_base(store, active.id)
    return {"checkpoint_id": active.id, "by_rating_model": by_model, "by_your_picks": picks,
            "line": describe_vs_base(active.id, by_model, picks)}


def explore_status(config: Config, store=None) -> dict:
    """Exploring styles (generation.explore_styles): ``{share, styles_file, pick, favoured,
    line}``; ``favoured`` (explore_pick: ratings, with a store to read): the styles the
    person's ratings now have asked for more often (reinf.training.styles.favoured_by_ratings)."""
    generation, path = config.generation, config.training.styles_file
    share, pick = generation.explore_styles, generation.explore_pick
    source = f"from {path}" if path else "from the built-in list"
    favoured = None
    if share > 0 and pick == "ratings" and store is not None:
        from reinf.training.styles import favoured_by_ratings, load_styles
        try:
            styles = set(load_styles(path))
        except BadInput:
            styles = set()
        favoured = favoured_by_ratings(store.style_ratings(), among=styles)
    line = "off"
    if share > 0:
        how = "picked by your ratings" if pick == "ratings" else "each equally often"
        line = (f"{share:.0%} of replies are asked for in a style {source}, {how} "
                "(explore_styles; the reply's details name it)")
        if favoured:
            line += "; asked for more often now: " + ", ".join(
                f'"{row["style"]}" ({row["mean"]:.1f} over {row["ratings"]})' for row in favoured)
    return {"share": share, "styles_file": path, "pick": pick, "favoured": favoured,
            "line": line}


def best_of_status(config: Config, active, engine=None) -> dict:
    """Best-of-n at serve time (generation.best_of): ``{best_of, active, checkpoint_id,
    reason, line}``, from the engine where one runs, else from the active checkpoint's
    rating model file read as the engine reads it (reinf.serving.best_of.read_rater)."""
    if engine is not None:
        out = engine.best_of_status()
    else:
        n, cid = config.generation.best_of, active.id if active else None
        rater = read_rater(cid, active.path, config.training.min_consistency) \
            if n > 1 and active is not None else None
        out = best_of_state(n, cid, rater)
    out["line"] = ("best-of-n: off" if out["best_of"] <= 1 else
                   f"best-of-{out['best_of']}: on (rating model of "
                   f"{short_name(out['checkpoint_id'])})" if out["active"] else
                   f"best-of-{out['best_of']}: waiting for a trusted rating model "
                   f"({out['reason']})")
    return out


def short_name(checkpoint_id: str) -> str:
    """r0007 of r0007-20261125-030648-8ce1; any other id as it is."""
    name = checkpoint_id.split("-")[0]
    return name if name[1:].isdigit() and name.startswith("r") else checkpoint_id


def describe_vs_base(checkpoint_id: str, by_model: dict | None, picks: dict | None) -> str:
    """'r0007 vs base: wins 62% by the rating model (16 prompts), 3 of 4 by your picks'."""
    parts = []
    if by_model and by_model.get("win_rate") is not None:
        parts.append(f"wins {by_model['win_rate']:.0%} by the rating model "
                     f"({by_model['prompts']} prompts)")
    if picks:
        text = f"{picks['wins']} of {picks['pairs']} by your picks"
        if picks["ties"]:
            text += f" ({picks['ties']} {'tie' if picks['ties'] == 1 else 'ties'})"
        if picks["checkpoints"] != [checkpoint_id]:
            text += " of it and its ancestors"
        parts.append(text)
    return f"{short_name(checkpoint_id)} vs base: " + (
        ", ".join(parts) if parts else "not measured yet (a round with a rating model "
                                       "measures it; the compare page counts your picks)")


def _reward_hook_status(config: Config) -> dict:
    try:
        from reinf.rewards.mapper import hook_status
    except ImportError:
        return {"mapper": config.rewards.reward_mapper, "ok": True, "error": None}
    return hook_status(config)


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - a status line must never fail on a weird URL
        return "<unparseable db_url>"
