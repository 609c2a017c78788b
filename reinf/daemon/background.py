"""The serving process's background half: lock, schedule, child trainer, hot-swap.

``reinf serve`` builds one ``Daemon(config, store, engine, lock=...)`` and hands it to
``webui.create_app(..., daemon=daemon)``. The web app calls ``train_now()``,
``rollback(target)``, ``schedule_info()`` and ``notify_rating()``; the daemon does the rest:

- **start-up** (``start``): rounds left ``running`` by a crash become failed
  ("interrupted"); a checkpoint directory a crash left without its row is recorded (not
  active) or removed; and the engine serves the active checkpoint, or, when its files are
  missing or do not load, its nearest ancestor that does, or the base model, with a
  warning when it had to fall back;
- **rounds** run in a child process (reinf.daemon.worker) on the schedule of reinf.daemon.scheduler;
  a round that succeeds (and so passed the promotion gate) is swapped into the engine
  between two replies;
- **rollback** switches the active checkpoint in the store (so it survives a restart) and
  in the engine; a rollback made while a round trains wins over that round's result;
- **shutdown** stops the schedule and the child (recorded "stopped at shutdown");
- **reconcile**, every few seconds: what other processes changed in the store (a
  foreground ``reinf train``, a rollback that could not reach us) reaches the engine, and
  ratings they stored (``reinf rate``) reach the ratings trigger.

Other processes talk to a running daemon through the lock file and its HTTP API, in
reinf.daemon.remote. Signals and the serving loop are in reinf.daemon.shutdown.
"""
from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any, Callable

from reinf.daemon.lock import FileLock, acquire_lock, acquire_train_lock, read_info, train_lock_path
from reinf.daemon.scheduler import Scheduler, utcnow
from reinf.daemon.worker import ChildRunner
from reinf.errors import BadInput, Conflict, NotFound, ReinfError
from reinf.logs import log_path
from reinf.training.pairs import pairs_waiting

__all__ = ["Daemon", "INTERRUPTED", "adopt_checkpoints", "choose_active", "is_loadable",
           "recover_runs"]

log = logging.getLogger("reinf.daemon.background")

INTERRUPTED = "interrupted (the daemon stopped mid-round)"
RECONCILE_SECONDS = 10.0
_UNSET = object()


class Daemon:
    """Scheduling, child trainer and adapter swaps of one ``reinf serve``."""

    def __init__(self, config, store, engine=None, *, lock: FileLock | None = None,
                 runner: ChildRunner | None = None, schedule: bool = True,
                 now: Callable = utcnow):
        self.config = config
        self.store = store
        self.engine = engine
        self.lock = lock
        self.runner = runner or ChildRunner(config, store)
        self.scheduler = Scheduler(config, store, self._round, enabled=schedule, now=now,
                                   current_run_id=self.runner.current_run_id)
        self.warnings: list[str] = []
        self._own_lock = False
        self._swap = threading.Lock()      # post-round swaps and rollbacks, one at a time
        self._rollback_in_round: Any = _UNSET
        self._life = threading.Lock()
        self._state = "new"                # new | running | stopping | stopped
        self._stopped = threading.Event()
        self.reconcile_seconds = RECONCILE_SECONDS

    # --- life ------------------------------------------------------------------------

    def start(self) -> "Daemon":
        with self._life:
            if self._state != "new":
                return self
            if self.lock is None:
                self.lock = acquire_lock(self.config)
                self._own_lock = True
            self._state = "running"
        try:
            recovered = recover_runs(self.config, self.store)
            if recovered:
                log.warning("%s training run(s) left running by a previous server marked "
                            "failed", recovered)
            for text in adopt_checkpoints(self.config, self.store):
                self.warnings.append(text)
                log.warning(text)
            self._load_active()
            self.scheduler.start()
            self.scheduler.add_every("reconcile", self.reconcile_seconds, self._reconcile)
            self.scheduler.add_every("ratings-poll", self.reconcile_seconds,
                                     self.scheduler.poll_ratings)
        except BaseException:
            self.shutdown(timeout=5)  # releases a lock taken here
            raise
        return self

    def shutdown(self, timeout: float = 30.0) -> bool:
        """Stop scheduling and the child trainer; True when the round (if any) ended in time.
        Idempotent and safe from any thread; later callers wait for the first."""
        with self._life:
            first = self._state in ("new", "running")
            if first:
                self._state = "stopping"
        if not first:
            return self._stopped.wait(timeout)
        try:
            self.scheduler.shutdown()
            self.runner.stop("stopped at shutdown")
            idle = self.scheduler.wait_idle(timeout)
            if not idle:
                log.warning("the training round did not stop within %.0f s", timeout)
            return idle
        finally:
            if self._own_lock and self.lock is not None:
                self.lock.release()
            self._state = "stopped"
            self._stopped.set()
            log.info("daemon stopped")

    def kill_child(self) -> None:
        """SIGKILL the child trainer at once (a second Ctrl+C)."""
        self.runner.kill_now()

    def _reconcile(self) -> None:
        """Catch up with other processes: a foreground ``reinf train`` that activated a new
        checkpoint, a ``reinf rollback`` that could not reach us, a trainer that outlived
        a crashed server (macOS has no parent-death signal). Runs on the scheduler's one
        worker, so never during our own round; takes the train lock only when the store
        and the engine disagree, and waits while another process's round runs. Also
        empties the WAL a forget could not (another program was reading)."""
        self.store.retry_scrub()
        active = self.store.active_checkpoint()
        orphans = any(r.status == "running" for r in self.store.list_runs(limit=5))
        differs = (self.engine is not None
                   and (active.id if active else None) != self.engine.active_checkpoint_id)
        if not (orphans or differs):
            return
        lock = acquire_train_lock(self.config, trigger="reconcile")
        if lock is None:
            return  # their round is still running; look again at the next tick
        try:
            if orphans:
                self.store.mark_interrupted_runs(INTERRUPTED)
        finally:
            lock.release()
        with self._swap:
            log.info("the store changed under us (active %s): catching up",
                     active.id if active else "base")
            self._load_active()

    def _load_active(self) -> None:
        """Make the engine serve what the store says is active, or the nearest good one."""
        if self.engine is None:
            _, warnings = choose_active(self.store)
        else:
            warnings = serve_active(self.engine, self.store)
        self.warnings.extend(warnings)
        for w in warnings:
            log.warning(w)

    # --- what the web app calls ------------------------------------------------------

    def train_now(self, *, force: bool = False) -> dict[str, Any]:
        """Start a round now, unless one runs ("started": False with the reason)."""
        if self._state != "running":
            return {"started": False, "reason": "the server is not running its scheduler"}
        if not force and not self.scheduler.active and self.store.ratings_waiting() == 0 \
                and not pairs_waiting(self.store):
            return {"started": False, "ratings_waiting": 0,
                    "reason": "nothing new to train on: no ratings, picks or rewrites since "
                              "the last round"}
        return self.scheduler.request("request", force=force)

    def notify_rating(self) -> None:
        if self._state == "running":
            self.scheduler.notify_rating()

    def rollback(self, target: str | None) -> dict[str, Any]:
        """Make ``target`` (a checkpoint id or a unique prefix of one, 'base', or None = the
        active one's parent) the active adapter, in the store (persistent) and in the engine
        (between replies)."""
        with self._swap:
            before = self.store.active_checkpoint()
            if target is None:
                if before is None:
                    raise Conflict("the base model is already active; nothing to roll back",
                                   fix="pick a checkpoint id from `reinf checkpoints`")
                checkpoint_id = before.parent_id  # an exact id: never read as a prefix
            else:
                checkpoint_id = self.store.resolve_checkpoint(str(target))
            record = None
            if checkpoint_id is not None:
                record = self.store.get_checkpoint(checkpoint_id)
                if record.status != "promoted":
                    raise BadInput(f"checkpoint {checkpoint_id} is {record.status} and cannot "
                                   "be made active", fix="pick a promoted checkpoint")
                if not is_loadable(record.path):
                    raise Conflict(f"checkpoint {checkpoint_id} is missing or incomplete at "
                                   f"{record.path}", fix="roll back to another checkpoint, or "
                                                         "to the base model (`base`)")
            self.store.activate_checkpoint(checkpoint_id)
            pause = None
            if self.engine is not None:
                try:
                    pause = self.engine.request_swap(checkpoint_id, record.path if record else None)
                except Exception as exc:
                    self.store.activate_checkpoint(before.id if before else None)
                    if isinstance(exc, ReinfError):
                        raise
                    raise ReinfError(f"the engine could not load checkpoint {checkpoint_id}: "
                                     f"{exc}", status=409,
                                     fix="the active checkpoint is unchanged") from None
            if self.scheduler.busy:
                self._rollback_in_round = checkpoint_id
        log.info("rolled back to %s", checkpoint_id or "base")
        return {"active_checkpoint": checkpoint_id or "base",
                "previous_checkpoint": before.id if before else "base",
                "swap_requested": self.engine is not None, "swap_pause_ms": pause}

    def schedule_info(self) -> dict[str, Any]:
        """Status of the schedule and of this server. ``running`` is whether the daemon
        runs (as in reinf.daemon.remote.locate_server); ``training`` whether a round runs now."""
        info = self.scheduler.info()
        lock = self.lock.info if self.lock is not None else {}
        info.update(running=self._state == "running", pid=os.getpid(),
                    trainer_pid=getattr(self.runner, "pid", None), url=lock.get("url"),
                    started_at=lock.get("started_at"), warnings=list(self.warnings),
                    log_file=str(log_path(self.config)),
                    active_checkpoint=(self.engine.active_checkpoint_id or "base")
                    if self.engine is not None else None)
        return info

    # --- one round (called by the scheduler's job) ------------------------------------

    def _round(self, trigger: str, force: bool) -> dict[str, Any]:
        with self._swap:
            self._rollback_in_round = _UNSET
            before = self.store.active_checkpoint()
        outcome = self.runner.run(trigger, force=force)
        result = outcome.to_dict()
        if outcome.status == "succeeded" and outcome.checkpoint_id:
            result.update(self._adopt(outcome.checkpoint_id, before))
        return result

    def _adopt(self, checkpoint_id: str, before) -> dict[str, Any]:
        """Swap a new checkpoint in, unless the person rolled back during the round."""
        with self._swap:
            chosen, self._rollback_in_round = self._rollback_in_round, _UNSET
            if chosen is not _UNSET:
                # The trainer activated its checkpoint in the store; the person's choice wins.
                self.store.activate_checkpoint(chosen)
                return {"swapped": False, "note": f"{checkpoint_id} kept but not activated: "
                        f"rolled back to {chosen or 'base'} during the round"}
            if self.engine is None:
                return {"swapped": False}
            try:
                record = self.store.get_checkpoint(checkpoint_id)
                pause = self.engine.request_swap(checkpoint_id, record.path)
            except Exception as exc:  # noqa: BLE001 - keep serving the previous adapter
                log.exception("swapping in %s failed", checkpoint_id)
                self.store.activate_checkpoint(before.id if before else None)
                text = f"new checkpoint {checkpoint_id} could not be loaded: {exc}"
                self.warnings.append(text)
                return {"swapped": False, "swap_error": text}
        log.info("checkpoint %s swapped in (pause %s ms)", checkpoint_id, pause)
        return {"swapped": True, "active_checkpoint": checkpoint_id, "swap_pause_ms": pause}


# --- start-up ------------------------------------------------------------------------------

def is_loadable(path: str | Path) -> bool:
    from reinf.training.checkpoints import is_complete  # imports torch; only servers and trainers

    return is_complete(Path(path))


def recover_runs(config, store, reason: str = INTERRUPTED) -> int | None:
    """Mark runs a dead server left ``running`` as failed; returns how many. Only when no
    round holds the train lock: a trainer still alive (a foreground ``reinf train``)
    keeps its row, and None is returned."""
    lock = acquire_train_lock(config, trigger="start-up check")
    if lock is None:
        pid = read_info(train_lock_path(config)).get("pid", "?")
        log.warning("a training round (pid %s) is still running; its run row is left alone", pid)
        return None
    try:
        return store.mark_interrupted_runs(reason)
    finally:
        lock.release()


def adopt_checkpoints(config, store) -> list[str]:
    """Published checkpoint directories that have no row (a kill between a round's rename
    and its store transaction): recorded as promoted but not active when complete and
    their run is known, else removed (``checkpoints.adopt_stray``). Only when no round
    holds the train lock: a live trainer may be between those two steps. Returns what to
    tell the person."""
    from reinf.training.checkpoints import adopt_stray, root_dir

    lock = acquire_train_lock(config, trigger="start-up check")
    if lock is None:
        return []
    try:
        adopted, removed = adopt_stray(store, root_dir(config))
    finally:
        lock.release()
    for path in removed:
        log.info("removed %s: a checkpoint directory with no database row that cannot be "
                 "recorded (incomplete, or its run is unknown)", path)
    return [f"checkpoint {cid} was written but not recorded (its round was stopped between "
            f"the two); it is listed now but not active: `reinf rollback {cid}` serves it"
            for cid in adopted]


def choose_active(store) -> tuple[Any, list[str]]:
    """The checkpoint to serve: the active one if complete, else its nearest complete
    ancestor, else None (the base). A fallback is written back to the store."""
    active = store.active_checkpoint()
    warnings: list[str] = []
    candidate = _nearest_complete(store, active, warnings, set())
    if active is not None and (candidate is None or candidate.id != active.id):
        store.activate_checkpoint(candidate.id if candidate else None)
        warnings[-1] += f"; serving {_name(candidate, active)} instead"
    return candidate, warnings


def _nearest_complete(store, record, warnings: list[str], seen: set[str]):
    """``record`` if it is promoted and complete, else its nearest ancestor (parent_id,
    parent's parent, ...) that is; None when none is (the base model)."""
    while record is not None and not (record.status == "promoted"
                                      and is_loadable(record.path)):
        warnings.append(f"checkpoint {record.id} is missing or incomplete at {record.path}")
        seen.add(record.id)
        parent = record.parent_id
        record = None
        if parent and parent not in seen:
            try:
                record = store.get_checkpoint(parent)
            except NotFound:
                record = None
    return record


def _name(record, start) -> str:
    if record is None:
        return "the base model"
    return f"{record.id}, the nearest intact ancestor of {start.id}"


def serve_active(engine, store) -> list[str]:
    """Make ``engine`` serve the store's active checkpoint, or, when its files are missing
    or cannot be loaded (a truncated adapter, a garbled adapter_config.json), its nearest
    ancestor that loads, or the base model; the fallback is recorded as active and said in
    the returned warnings. The server calls this at start-up, and so does ``reinf chat``
    when it runs the model itself."""
    active = store.active_checkpoint()
    record, warnings = choose_active(store)
    seen: set[str] = set()
    while True:
        target = record.id if record else None
        if engine.active_checkpoint_id == target:
            return warnings
        try:
            engine.request_swap(target, record.path if record else None)
            return warnings
        except Exception as exc:  # noqa: BLE001 - serve an ancestor rather than nothing
            text = exc.message if isinstance(exc, ReinfError) else f"{type(exc).__name__}: {exc}"
            if record is None:
                warnings.append(f"the base model could not be switched to ({text})")
                return warnings
            seen.add(record.id)
            failed, parent = record, None
            if record.parent_id and record.parent_id not in seen:
                try:
                    parent = store.get_checkpoint(record.parent_id)
                except NotFound:
                    parent = None
            notes: list[str] = []
            record = _nearest_complete(store, parent, notes, seen)
            store.activate_checkpoint(record.id if record else None)
            warnings.append(f"checkpoint {failed.id} could not be loaded ({text}); serving "
                            f"{_name(record, active or failed)} instead")
            warnings.extend(notes)
