"""The JSON API of training (docs/design.md §6): status, train now, runs, checkpoints, rollback,
and the figures the training page charts. Train now and rollback are the daemon's
(reinf.daemon.background.Daemon); these routes only check the request and report its answer."""
from __future__ import annotations

import math

from flask import Blueprint, jsonify

from reinf.daemon.status import collect_status
from reinf.errors import BadInput
from webui.params import query_int, read_json
from webui.reports import checkpoint_scores
from webui.runtime import get_runtime

bp = Blueprint("training", __name__, url_prefix="/api")


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value)


@bp.get("/status")
def status():
    runtime = get_runtime()
    schedule = runtime.schedule_info()
    current, change = runtime.config_now()
    out = collect_status(runtime.config, runtime.store, engine=runtime.engine, daemon=schedule,
                         round_config=current)
    out["config_changed"] = change
    if change and change["message"]:
        # in the schedule too: `reinf status` shows the server's schedule warnings
        out["warnings"].append(change["message"])
        schedule["warnings"] = [*(schedule.get("warnings") or []), change["message"]]
    out["next_run"] = schedule.get("next_run")
    out["schedule"] = schedule
    out["training"] = {**out["training"], "running": bool(schedule.get("training", False)),
                       "last_result": schedule.get("last_result")}
    return jsonify(out)


@bp.post("/train")
def train():
    """Start a round now: 202 when it started, 409 with the reason when it did not (one
    is running, or nothing new to train on)."""
    body = read_json({"force"}, optional_body=True)
    force = body.get("force", False)
    if not isinstance(force, bool):
        raise BadInput("'force' must be true or false", key="force")
    result = get_runtime().daemon.train_now(force=force)
    if result.get("started") is False:
        reason = result.get("reason") or "training did not start"
        return jsonify({"error": reason, "status": 409, **result}), 409
    return jsonify(result), 202


@bp.get("/runs")
def runs():
    limit = query_int("limit", low=1, high=1000, default=50)
    return jsonify({"runs": [r.to_dict() for r in get_runtime().store.list_runs(limit=limit)]})


@bp.get("/checkpoints")
def checkpoints():
    store = get_runtime().store
    active = store.active_checkpoint()
    return jsonify({"checkpoints": [c.to_dict() for c in store.list_checkpoints()],
                    "active_checkpoint": active.id if active else "base"})


@bp.post("/rollback")
def rollback():
    body = read_json({"checkpoint_id"}, optional_body=True)
    target = body.get("checkpoint_id")
    if target is not None and (not isinstance(target, str) or not target.strip()
                               or len(target) > 64):
        raise BadInput("'checkpoint_id' must be a checkpoint id (or a unique prefix of one) "
                       "or \"base\"", key="checkpoint_id",
                       fix="list them with GET /api/checkpoints")
    return jsonify(get_runtime().daemon.rollback(target))


@bp.get("/stats")
def stats():
    """The training page's charts: reward_mean per finished run, mean rating per
    checkpoint, and each checkpoint's own record against the bare base by the person's
    picks (its pairs with the base, blind or seen; reinf.training.leaderboard)."""
    from reinf.training.leaderboard import BASE, games, tally

    store = get_runtime().store
    played = games(store.list_pairs(limit=None))
    against_base = sorted({a if b == BASE else b for a, b, _ in played if BASE in (a, b)})
    picks = [{"checkpoint_id": c, **tally(played, {c}, {BASE}).to_dict()}
             for c in against_base]
    curve = [{"run_id": r.id, "finished_at": r.finished_at.isoformat(timespec="seconds"),
              "status": r.status, "reward_mean": r.metrics.get("reward_mean"),
              "checkpoint_id": r.checkpoint_id}
             for r in reversed(store.list_runs(limit=500))
             if r.finished_at is not None and is_number(r.metrics.get("reward_mean"))]
    return jsonify({"reward_curve": curve, "rating_by_checkpoint": checkpoint_scores(store),
                    "picks_vs_base": picks})
