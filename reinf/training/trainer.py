"""One training round: rated turns -> rewards -> LoRA PPO -> checkpoint -> runs row.

``train_round(config, store, ...)`` is the unit the scheduler, the CLI and the benchmark
call. A round:

1. refuses when no rating arrived since the last finished round ("nothing new to train
   on"), unless ``force``;
2. records a ``training_runs`` row, reads the newest ``replay_buffer_size`` rated turns and
   maps them to rewards and weights (``reinf.rewards``; a broken hook fails the run);
3. loads the base model on the training device and continues from the ACTIVE checkpoint
   (``reinf.training.session``): adapter, value head, optimizer state, KL controller, reward
   statistics and counters; with the base model active, all of it starts fresh;
4. runs PPO (``reinf.training.ppo``), then the promotion gate: a round with NaN, or whose KL per
   reply token to the base exceeds ``kl_max``, is ``rejected``: its row is recorded, no
   files are kept, and it is never activated; the next round from the same parent starts
   with at least twice the rejected round's kl_coef so it does not repeat itself;
5. writes the checkpoint atomically, records and activates it, applies retention, and
   finishes the run with its metrics.

Any failure finishes the run as ``failed`` with a one-line reason and raises a ReinfError
for the person; the traceback goes to ``<data_dir>/logs/trainer.log`` only.
"""
from __future__ import annotations

import logging
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from reinf.training import checkpoints
from reinf.errors import HookError, ModelError, ReinfError, TrainingError

log = logging.getLogger("reinf.training.trainer")
STATE_VERSION = 1
OOM_FIX = ("lower batch_size (raise gradient_accumulation_steps to keep the step size), set "
           "gradient_checkpointing: true, or quantization: 4bit on CUDA")


class NothingToTrain(TrainingError):
    """No rating arrived since the last finished round."""


@dataclass
class RoundResult:
    run_id: int | None
    status: str                      # succeeded | rejected | failed | skipped
    metrics: dict[str, Any]
    checkpoint_id: str | None
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "status": self.status, "checkpoint_id": self.checkpoint_id,
                "metrics": checkpoints.jsonable(self.metrics), "message": self.message}


# --- the round ------------------------------------------------------------------------

def train_round(config, store, *, trigger: str = "manual", progress: Callable | None = None,
                now: datetime | None = None, force: bool = False) -> RoundResult:
    """Run one training round; see the module docstring. Raises ReinfError on failure."""
    started = time.perf_counter()
    root = checkpoints.root_dir(config)
    checkpoints.clean_stray(root)
    if not force and store.ratings_waiting() == 0:
        raise NothingToTrain("nothing new to train on: no ratings since the last round",
                             fix="rate some replies first (`reinf rate last 5`), or pass "
                                 "--force to train on the stored ratings again")
    run = store.start_run(trigger, pid=os.getpid())
    try:
        return _run(config, store, run.id, root, progress, now, started)
    except BaseException as exc:  # KeyboardInterrupt too: the row must not stay "running"
        reason = _one_line(exc)
        _log_failure(config, run.id, exc)
        store.finish_run(run.id, "failed", error=reason,
                         metrics={"seconds": time.perf_counter() - started})
        if isinstance(exc, HookError):
            broken = HookError(f"reward hook broken: {exc.message}", fix=exc.fix, key=exc.key)
            broken.path, broken.line = getattr(exc, "path", None), getattr(exc, "line", None)
            broken.run_id = run.id
            raise broken from exc
        if isinstance(exc, ReinfError):
            exc.run_id = run.id
            raise
        if not isinstance(exc, Exception):
            raise
        fix = (OOM_FIX if type(exc).__name__ in ("OutOfMemoryError", "MemoryError")
               else f"details in {_log_path(config)}; run `reinf train` again after fixing "
                    "the cause")
        err = TrainingError(f"training failed: {reason}", fix=fix)
        err.run_id = run.id
        raise err from exc


def _run(config, store, run_id: int, root: Path, progress, now, started) -> RoundResult:
    # torch and transformers load only once there is work: a round with nothing to do
    # (the daemon's child, every few minutes) stays cheap.
    from reinf.training.ppo import Hyper, build_rollout, train_policy
    from reinf.rewards import compute_rewards
    from reinf.training.session import build_session, select_episodes

    report = progress or (lambda event: None)
    samples = store.training_samples(config.ppo.replay_buffer_size)
    report({"stage": "rewards", "samples": len(samples)})
    rows = compute_rewards(config, samples, now=now or datetime.now(timezone.utc))
    by_turn = {row.turn_id: row for row in rows}
    kept = [(s, by_turn[s.turn_id]) for s in samples
            if s.turn_id in by_turn and by_turn[s.turn_id].kept]
    report({"stage": "load"})
    session = build_session(config, store)
    episodes, skipped = select_episodes(session, kept)
    if not episodes:
        raise TrainingError(f"none of the {len(samples)} rated turns can be trained on "
                            f"({_describe(skipped, len(samples) - len(kept))})",
                            fix="rate replies the current model produced (`reinf chat`)")
    device = session.loaded.device
    b = build_rollout(episodes, device)
    session.reward_stats.update(b.rewards)
    if config.ppo.normalize_rewards:
        b.rewards = (b.rewards - session.reward_stats.mean) / max(session.reward_stats.std, 1e-6)
    counters = session.counters
    report({"stage": "update", "done": 0, "total": config.ppo.ppo_epochs
            * math.ceil(len(b) / config.ppo.batch_size)})
    metrics = train_policy(session.policy, session.optimizer, b, session.kl_ctl,
                           Hyper.from_config(config.ppo),
                           seed=config.ppo.seed + counters["round"], progress=progress)
    counters = {"round": counters["round"] + 1,
                "global_step": counters["global_step"] + metrics["steps"],
                "samples_seen": counters["samples_seen"] + len(b)}
    metrics.update(counters, reward_mean=sum(e[4] for e in episodes) / len(episodes),
                   reward_stats_mean=session.reward_stats.mean,
                   reward_stats_std=session.reward_stats.std,
                   skipped=sum(skipped.values()), skipped_reasons=skipped,
                   dropped=len(samples) - len(kept), parent_id=session.parent_id,
                   device=str(device), warnings=session.warnings)
    reason = gate(metrics, config.ppo.kl_max)
    ckpt_id = checkpoints.create_checkpoint_id(counters["round"])
    metrics["seconds"] = time.perf_counter() - started
    if reason:
        metrics["rejected_reason"] = reason
        metrics["kl_coef_next"] = max(metrics["kl_coef_next"], 2 * metrics["kl_coef"]) \
            if reason.startswith("KL") else metrics["kl_coef_next"]
        clean = checkpoints.jsonable(metrics)
        store.add_checkpoint(ckpt_id, str(root / ckpt_id), parent_id=session.parent_id,
                             run_id=run_id, metrics=clean, status="rejected")
        store.finish_run(run_id, "rejected", metrics=clean, samples=len(b), error=reason,
                         checkpoint_id=ckpt_id)
        parent = session.parent_id or "the base model"
        return RoundResult(run_id, "rejected", metrics, ckpt_id,
                           f"round rejected: {reason}; {parent} stays active")
    report({"stage": "checkpoint", "checkpoint_id": ckpt_id})
    state = {"version": STATE_VERSION, "optimizer": session.optimizer.state_dict(),
             "kl_controller": session.kl_ctl.state_dict(),
             "reward_stats": session.reward_stats.state_dict(), **counters}
    lineage = {"checkpoint_id": ckpt_id, "parent_id": session.parent_id, "run_id": run_id,
               "base_model": session.loaded.name}
    path = checkpoints.write_checkpoint(root, ckpt_id, model=session.policy.model,
                                        value_head=session.policy.value_head, state=state,
                                        metrics={**metrics, **lineage})
    metrics["seconds"] = time.perf_counter() - started
    promote(config, store, run_id, ckpt_id, path, parent_id=session.parent_id,
            metrics=metrics, samples=len(b))
    return RoundResult(run_id, "succeeded", metrics, ckpt_id,
                       f"round {counters['round']}: checkpoint {ckpt_id} is active "
                       f"({len(b)} samples, reward_mean {metrics['reward_mean']:.3f}, "
                       f"kl {metrics['kl']:.4f}/token, {metrics['seconds']:.1f} s)")


def promote(config, store, run_id: int, ckpt_id: str, path: Path, *, parent_id: str | None,
            metrics: dict[str, Any], samples: int) -> None:
    """Record a written checkpoint, make it active, apply retention and finish the run as
    succeeded (the trainer's rounds and the benchmark's baselines end the same way)."""
    clean = checkpoints.jsonable(metrics)
    store.add_checkpoint(ckpt_id, str(path), parent_id=parent_id, run_id=run_id,
                         metrics=clean, status="promoted")
    store.activate_checkpoint(ckpt_id)
    try:
        deleted = checkpoints.apply_retention(store, checkpoints.root_dir(config),
                                              config.ppo.keep_best)
    except OSError as exc:  # the round itself succeeded; old files can go next time
        deleted = []
        metrics.setdefault("warnings", []).append(
            f"retention could not remove old checkpoints: {exc}")
        clean = checkpoints.jsonable(metrics)
    store.finish_run(run_id, "succeeded", metrics=clean, samples=samples,
                     checkpoint_id=ckpt_id)
    log.info("run %s: checkpoint %s active; retention removed %s", run_id, ckpt_id,
             deleted or "nothing")


def gate(metrics: dict[str, Any], kl_max: float) -> str | None:
    """Why a round must not be promoted, or None."""
    numbers = [metrics[k] for k in ("reward_mean", "kl", "policy_loss", "value_loss")]
    if metrics.get("nan") or not all(math.isfinite(x) for x in numbers):
        return "NaN in the round (loss, reward or weights)"
    if metrics["kl"] > kl_max:
        return f"KL to the base {metrics['kl']:.4f} per token exceeds kl_max {kl_max}"
    return None


# --- logging --------------------------------------------------------------------------

def _describe(skipped: dict[str, int], dropped: int) -> str:
    parts = [f"{n} {reason.replace('_', ' ')}" for reason, n in skipped.items()]
    if dropped:
        parts.append(f"{dropped} dropped by the reward critics")
    return ", ".join(parts) or "none rated"


def _one_line(exc: BaseException) -> str:
    text = exc.message if isinstance(exc, ReinfError) else f"{type(exc).__name__}: {exc}"
    return " ".join(str(text).split())[:500] or type(exc).__name__


def _log_path(config) -> Path:
    return config.data_dir / "logs" / "trainer.log"


def _log_failure(config, run_id: int, exc: BaseException) -> None:
    """The traceback goes to the trainer log file only, never to the person's terminal."""
    try:
        path = _log_path(config)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"{datetime.now(timezone.utc).isoformat(timespec='seconds')} run {run_id} "
                     f"failed: {_one_line(exc)}\n")
            fh.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    except OSError:
        pass


# --- the CLI and the child process share this ---------------------------------------------

# Exit codes of `python -m reinf.training.trainer` and `reinf train` (the daemon reads them).
EXIT_SUCCEEDED, EXIT_FAILED, EXIT_REJECTED, EXIT_NOTHING, EXIT_HOOK, EXIT_MODEL = 0, 1, 3, 4, 5, 6


def run_once(config, store, *, trigger: str = "manual", force: bool = False,
             progress: Callable | None = None) -> tuple[int, dict, ReinfError | None]:
    """One round -> (exit code, JSON payload, the error for the person or None)."""
    try:
        result = train_round(config, store, trigger=trigger, progress=progress, force=force)
    except ReinfError as exc:
        kind, code = next((k, c) for t, k, c in (
            (NothingToTrain, "nothing_to_train", EXIT_NOTHING), (HookError, "hook", EXIT_HOOK),
            (ModelError, "model", EXIT_MODEL), (ReinfError, "error", EXIT_FAILED))
            if isinstance(exc, t))
        return code, {"run_id": getattr(exc, "run_id", None),
                      "status": "skipped" if kind == "nothing_to_train" else "failed",
                      "checkpoint_id": None, "metrics": {}, "message": str(exc),
                      "error": kind}, exc
    code = EXIT_SUCCEEDED if result.status == "succeeded" else EXIT_REJECTED
    return code, {**result.to_dict(), "error": None}, None


def apply_process_settings(config, *, nice: bool = False) -> None:
    """schedule.train_threads (and train_nice, for the child process); and no loading
    bars from transformers (read when it is first imported): the round has its own."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if nice and config.schedule.train_nice and hasattr(os, "setpriority"):
        # Absolute, not relative: a child the daemon already niced before exec stays at
        # train_nice instead of getting it twice. Before torch starts its thread pool:
        # Linux niceness is per thread, and new threads inherit it.
        try:
            current = os.getpriority(os.PRIO_PROCESS, 0)
            os.setpriority(os.PRIO_PROCESS, 0, max(config.schedule.train_nice, current))
        except OSError:
            pass
    if config.schedule.train_threads > 0:
        import torch
        torch.set_num_threads(config.schedule.train_threads)


class ProgressBar:
    """A tqdm bar on stderr over epochs x minibatches, with live KL and loss."""
    STAGES = {"rewards": "reading rated turns and computing rewards…",
              "load": "loading the model…"}

    def __init__(self, enabled: bool = True):
        self.enabled, self.bar = enabled, None

    def __call__(self, event: dict) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        if event["stage"] != "update":
            if self.bar is None and event["stage"] in self.STAGES:
                print(self.STAGES[event["stage"]], file=sys.stderr, flush=True)
            return
        if self.bar is None:
            self.bar = tqdm(total=event["total"], desc="PPO", unit="minibatch", file=sys.stderr,
                            dynamic_ncols=True)
        if event.get("done"):
            self.bar.update(event["done"] - self.bar.n)
            self.bar.set_postfix_str(f"epoch {event['epoch']}/{event['epochs']} "
                                     f"kl {event['kl']:.4f} approx_kl {event['approx_kl']:.4f} "
                                     f"loss {event['loss']:+.4f}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m reinf.training.trainer``: one round in a child process; the JSON result is the
    last line of stdout with --json. Exit codes: see EXIT_*."""
    import argparse
    import json

    from reinf.config import load_config
    from reinf.store import Store

    parser = argparse.ArgumentParser(prog="python -m reinf.training.trainer",
                                     description="Run one Reinf training round.")
    parser.add_argument("--json", action="store_true", help="print the result as JSON (last line)")
    parser.add_argument("--trigger", default="manual", help="recorded on the run (e.g. schedule)")
    parser.add_argument("--force", action="store_true", help="train even with no new ratings")
    parser.add_argument("--config", help="config file (default: $REINF_HOME/config.yaml)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    store = None
    try:
        config = load_config(args.config)
        store = Store.open(config)
        apply_process_settings(config, nice=True)
        bar = ProgressBar(enabled=not args.no_progress)
        try:
            code, payload, err = run_once(config, store, trigger=args.trigger, force=args.force,
                                          progress=bar)
        finally:
            bar.close()
    except ReinfError as exc:  # config or database trouble, before any run row exists
        code, err = EXIT_FAILED, exc
        payload = {"run_id": None, "status": "failed", "checkpoint_id": None, "metrics": {},
                   "message": str(exc), "error": "error"}
    finally:
        if store is not None:
            store.close()
    if err is not None:
        print(f"Error: {err}", file=sys.stderr)
    else:
        print(payload["message"], file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(payload, ensure_ascii=False), flush=True)
    return code


if __name__ == "__main__":
    exit_code = main()
    # Everything is written and closed (store, checkpoint, result line); skip the
    # interpreter's teardown of torch and transformers (about 1 s of every round on two
    # busy cores).
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(exit_code)
