"""Training and rollback as the web app sees them.

With a daemon (``reinf serve`` with its scheduler) every action goes to it. Without
one — tests, or a server started with the app factory alone — "Train now" runs
``reinf.training.trainer.train_round`` on a background thread, one round at a time, and a
rollback updates the store and asks the engine to swap adapters between replies.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any

from reinf.errors import Conflict, NotAvailable, ReinfError

log = logging.getLogger("reinf.webui")


class Control:
    def __init__(self, config, store, *, engine=None, daemon=None):
        self.config = config
        self.store = store
        self.engine = engine
        self.daemon = daemon
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._last: dict[str, Any] | None = None

    # --- training ---------------------------------------------------------------------

    def train_now(self, *, force: bool = False) -> dict[str, Any]:
        """Start a round; {"started": False, "reason"} when there is nothing new."""
        if self.daemon is not None:
            return dict(self.daemon.train_now(force=force) if force else self.daemon.train_now())
        train_round = load_train_round()
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                raise Conflict("a training round is already running",
                               fix="wait for it to finish; GET /api/status shows progress")
            if not force and self.store.ratings_waiting() == 0:
                return {"started": False, "ratings_waiting": 0,
                        "reason": "nothing new to train on: no ratings since the last round"}
            self._thread = threading.Thread(target=self._run_round, args=(train_round, force),
                                            name="reinf-train", daemon=True)
            self._thread.start()
        return {"started": True, "trigger": "manual", "running": True}

    def _run_round(self, train_round, force: bool) -> None:
        started = time.time()
        try:
            result = train_round(self.config, self.store, trigger="manual", force=force)
            self._last = {"status": result.status, "run_id": result.run_id,
                          "checkpoint_id": result.checkpoint_id, "message": result.message,
                          "seconds": round(time.time() - started, 1)}
            if result.status == "succeeded" and result.checkpoint_id:
                self._swap(result.checkpoint_id)
        except Exception as exc:  # noqa: BLE001 - the job boundary: log, record, live on
            if not isinstance(exc, ReinfError):
                log.exception("training round failed")
            self._last = {"status": "failed", "message": str(exc),
                          "seconds": round(time.time() - started, 1)}

    def training_state(self) -> dict[str, Any]:
        running = self._thread is not None and self._thread.is_alive()
        return {"running": running, "last_result": self._last}

    # --- checkpoints ------------------------------------------------------------------

    def rollback(self, target: str | None) -> dict[str, Any]:
        """Make ``target`` ('base', a checkpoint id, or None = the active one's parent)
        the active adapter."""
        if target is None:
            active = self.store.active_checkpoint()
            if active is None:
                raise Conflict("the base model is already active; nothing to roll back",
                               fix="pick a checkpoint id from GET /api/checkpoints")
            target = active.parent_id or "base"
        if self.daemon is not None:
            return dict(self.daemon.rollback(target))
        checkpoint_id = None if target == "base" else target
        record = self.store.activate_checkpoint(checkpoint_id)
        swapped = self._swap(checkpoint_id, record.path if record else None)
        return {"active_checkpoint": record.id if record else "base", "swap_requested": swapped}

    def _swap(self, checkpoint_id: str | None, path: str | None = None) -> bool:
        if checkpoint_id is not None and path is None:
            record = self.store.activate_checkpoint(checkpoint_id)
            path = record.path if record else None
        if self.engine is None or not hasattr(self.engine, "request_swap"):
            return False
        try:
            self.engine.request_swap(checkpoint_id, path)
        except ReinfError:
            raise
        except Exception as exc:  # noqa: BLE001 - a bad adapter must not take the server down
            log.exception("adapter swap failed")
            raise ReinfError(f"the engine could not load checkpoint {checkpoint_id}: {exc}",
                             status=409, fix="check the checkpoint directory, or roll back "
                                             "to another checkpoint") from None
        return True

    # --- schedule ---------------------------------------------------------------------

    def schedule_info(self) -> dict[str, Any]:
        if self.daemon is not None:
            try:
                info = dict(self.daemon.schedule_info())
            except Exception as exc:  # noqa: BLE001 - status must answer even so
                log.exception("daemon schedule_info failed")
                info = {"running": True, "error": str(exc)}
            info.setdefault("running", True)
            return info
        return {"running": False, "next_run": None,
                "ratings_waiting": self.store.ratings_waiting(),
                "note": "no scheduler in this process; training runs on demand"}

    def notify_rating(self) -> None:
        if self.daemon is not None:
            try:
                self.daemon.notify_rating()
            except Exception:  # noqa: BLE001 - a stored rating stays stored
                log.exception("daemon notify_rating failed")


def load_train_round():
    try:
        from reinf.training.trainer import train_round
    except ImportError as exc:
        if exc.name == "reinf.training.trainer":
            raise NotAvailable("training not available yet",
                               fix="this build has no trainer (reinf.training.trainer)") from None
        raise NotAvailable(f"training cannot start: {exc}",
                           fix="install Reinf's dependencies (pip install -e .)") from None
    return train_round
