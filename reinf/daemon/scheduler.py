"""When training rounds run: every ``train_interval_minutes``, or as soon as
``train_after_ratings`` new ratings have arrived, whichever comes first; one at a time.

``Scheduler`` owns one APScheduler 3.x ``BackgroundScheduler`` with two jobs that call the
same round function:

- ``interval``: an interval trigger (none when ``train_interval_minutes`` is 0). A tick
  with no new rating since the last round is skipped without starting a child;
- ``train``: a one-off date trigger for "now", added by the ratings trigger and by
  :meth:`Scheduler.request` ("Train now", ``reinf train`` while a server runs).

Both use ``max_instances=1`` and ``coalesce=True``; the single worker thread and a
non-blocking round lock make sure two rounds never overlap, whichever job fires. The
misfire grace is as long as a round may take, so a tick delayed by a running round still
runs once afterwards instead of being dropped.

The ratings trigger counts ratings as the API reports them and re-checks
``store.ratings_waiting()`` (the store's exact count) before it fires. Ratings that other
processes store (``reinf rate``, a standalone ``reinf chat``) are noticed by
:meth:`Scheduler.poll_ratings`, which the daemon runs every few seconds. After a *failed*
round it waits for ``train_after_ratings`` further ratings, so a broken reward hook does
not restart a doomed round on every click.

Every job time is read from the injected clock (``now``), not from APScheduler's own:
with the real clock nothing changes, and a test that injects a clock ahead of real time
finds that APScheduler's thread never starts a job. It moves the clock itself and runs
what is due with :meth:`Scheduler.run_due`, so "nothing ran" is a fact, not a timing.
"""
from __future__ import annotations

import logging
import math
import threading
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import STATE_STOPPED

from reinf.training.pairs import pairs_waiting

log = logging.getLogger("reinf.daemon.scheduler")
# APScheduler's own messages; reinf.logs keeps them at WARNING unless --debug.
jobs_log = logging.getLogger("reinf.daemon.scheduler.jobs")
ROUND_JOBS = ("interval", "train")


class QuietHousekeeping(logging.Filter):
    """Drop "skipped: maximum number of running instances" for housekeeping jobs: they
    wait behind every long round by design (one worker), every few seconds."""

    def filter(self, record: logging.LogRecord) -> bool:
        job = record.args[0] if isinstance(record.args, tuple) and record.args else None
        return not ("maximum number of running instances" in str(record.msg)
                    and getattr(job, "id", ROUND_JOBS[0]) not in ROUND_JOBS)


jobs_log.addFilter(QuietHousekeeping())

BUSY = "a round is already running"
# Round: (trigger, force) -> result dict with at least "status" and "message".
Round = Callable[[str, bool], dict]


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def iso(ts: datetime | None) -> str | None:
    return ts.isoformat(timespec="seconds") if ts else None


def run_job(trigger: str, *, force: bool, round_fn: Round, store, now: Callable[[], datetime],
            min_waiting: int = 0, picks_count: bool = False) -> dict[str, Any]:
    """One scheduled round, huey style: the clock and the dependencies are arguments.

    Skipped without a child when fewer than ``min_waiting`` ratings wait (a timer tick
    with nothing new, or a ratings job that an earlier round made moot), unless
    ``picks_count`` and a pick (compare, regenerate) or a rewrite is new since the last
    round: the timer trains on those alone too. The job boundary: whatever goes wrong is caught,
    logged and returned as a failed result, so the scheduler lives on.
    """
    started = now()
    if min_waiting and not force:
        waiting = store.ratings_waiting()
        if waiting < min_waiting and not (picks_count and pairs_waiting(store)):
            return {"status": "skipped", "trigger": trigger, "started_at": iso(started),
                    "finished_at": iso(now()),
                    "message": f"nothing to do: {waiting} new rating(s), {min_waiting} needed"}
    try:
        result = dict(round_fn(trigger, force))
    except Exception as exc:  # noqa: BLE001 - the job boundary
        log.exception("training round (%s) crashed in the server", trigger)
        result = {"status": "failed", "message": f"the round could not run: "
                                                 f"{type(exc).__name__}: {exc}"}
    result.update(trigger=trigger, started_at=iso(started), finished_at=iso(now()))
    return result


class _Aps(BackgroundScheduler):
    """APScheduler's BackgroundScheduler, less one race at shutdown. ``shutdown()`` marks the
    scheduler stopped before it takes the job-store lock, and a stopped scheduler's
    ``remove_job`` looks only among jobs not yet added; so when a one-off job (``train``)
    has just been handed to the worker, its thread's removal of it fails and that thread
    dies with a traceback. Every job goes at shutdown anyway: that failure is ignored
    there, and only there."""

    def remove_job(self, job_id, jobstore=None):
        try:
            super().remove_job(job_id, jobstore)
        except JobLookupError:
            if self.state != STATE_STOPPED:
                raise


class Scheduler:
    """The training schedule of one server. ``round_fn(trigger, force)`` runs a round."""

    def __init__(self, config, store, round_fn: Round, *, enabled: bool = True,
                 now: Callable[[], datetime] = utcnow,
                 current_run_id: Callable[[], int | None] = lambda: None):
        self.config = config
        self.current_run_id = current_run_id
        self.store = store
        self.round_fn = round_fn
        self.enabled = enabled           # False: --no-train (explicit requests still run)
        self.now = now
        timeout = config.schedule.train_timeout_minutes * 60
        self.job_defaults = {"max_instances": 1, "coalesce": True,
                             "misfire_grace_time": int(timeout) + 300}
        self._aps = _Aps(
            timezone=timezone.utc, executors={"default": ThreadPoolExecutor(max_workers=1)},
            job_defaults=self.job_defaults, logger=jobs_log)
        self._round = threading.Lock()   # held while a round runs
        self._state = threading.Lock()   # guards the fields below
        self._pending: str | None = None
        self._current: dict[str, Any] | None = None
        self._since_failure = math.inf   # ratings notified since the last failed round
        self._waiting_seen = 0           # store.ratings_waiting() at the last poll
        self._notified = 0               # API notifications since the last poll
        self._stopping = False
        self.last_result: dict[str, Any] | None = None

    # --- life ------------------------------------------------------------------------

    def start(self) -> None:
        runs = self.store.list_runs(limit=1)
        if runs and runs[0].status == "failed":
            self._since_failure = 0
        self._waiting_seen = self.store.ratings_waiting()
        self._aps.start()
        minutes = self.config.schedule.train_interval_minutes
        if self.enabled and minutes > 0:
            self._aps.add_job(self._job, "interval", minutes=minutes, id="interval",
                              args=["interval", False], replace_existing=True,
                              next_run_time=self.now() + timedelta(minutes=minutes))
        log.info("scheduler started (interval %s min, after %s ratings%s)", minutes,
                 self.config.schedule.train_after_ratings, "" if self.enabled else ", off")

    def add_every(self, job_id: str, seconds: float, func: Callable[[], None]) -> None:
        """A periodic housekeeping job on the same single worker as the rounds, so it
        never runs during one. Its failures are logged; the schedule lives on."""
        def job() -> None:
            try:
                func()
            except Exception:  # noqa: BLE001 - the job boundary
                log.exception("%s job failed", job_id)
        self._aps.add_job(job, "interval", seconds=seconds, id=job_id, name=job_id,
                          replace_existing=True,
                          next_run_time=self.now() + timedelta(seconds=seconds))

    def shutdown(self) -> None:
        """Stop scheduling; a round in progress is stopped by its runner, not here."""
        with self._state:
            self._stopping = True
        if self._aps.running:
            self._aps.shutdown(wait=False)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no round runs; False on timeout."""
        if self._round.acquire(timeout=max(timeout, 0)):
            self._round.release()
            return True
        return False

    @property
    def busy(self) -> bool:
        return self._round.locked()

    @property
    def active(self) -> bool:
        """A round runs, or one is queued to start."""
        return self.busy or self._pending is not None

    def run_due(self) -> list[str]:
        """Run, on the calling thread, every job due by the injected clock, as APScheduler's
        thread does when it wakes (a job late several times runs once; one later than its
        misfire grace is dropped), then the rounds those jobs queued for now. Returns the
        ids run, in order. For tests whose clock only they move; the server never calls it.
        """
        ran: list[str] = []
        for _ in range(100):  # a job that queues itself for now again would loop forever
            now = self.now()
            due = [j for j in self._aps.get_jobs() if j.next_run_time and j.next_run_time <= now]
            if not self._aps.running or not due:
                return ran
            for job in due:
                last = upcoming = job.next_run_time
                while upcoming and upcoming <= now:
                    last, upcoming = upcoming, job.trigger.get_next_fire_time(upcoming, now)
                if upcoming:
                    job.modify(next_run_time=upcoming)
                else:
                    job.remove()
                grace = job.misfire_grace_time
                if grace is None or (now - last).total_seconds() <= grace:
                    job.func(*job.args, **job.kwargs)
                    ran.append(job.id)
        raise RuntimeError(f"jobs keep coming due at {iso(self.now())}: ...{ran[-6:]}")

    # --- triggers --------------------------------------------------------------------

    def request(self, trigger: str = "request", *, force: bool = False) -> dict[str, Any]:
        """Start a round now (one-off ``train`` job); refused while one runs or is queued."""
        with self._state:
            if self._stopping:
                return {"started": False, "reason": "the server is shutting down"}
            if self._round.locked() or self._pending:
                return {"started": False, "reason": BUSY, "run_id": self.current_run_id(),
                        "trigger": (self._current or {}).get("trigger") or self._pending}
            self._pending = trigger
        self._aps.add_job(self._job, "date", run_date=self.now(), id="train",
                          args=[trigger, force], replace_existing=True)
        return {"started": True, "trigger": trigger, "running": True}

    def notify_rating(self) -> None:
        """A rating was stored: count it and start a round once enough are waiting."""
        with self._state:
            self._since_failure += 1
            self._notified += 1
        self._check_ratings()

    def poll_ratings(self) -> None:
        """Let ratings stored by other processes count too. The rise of the store's
        waiting count since the last poll, less what the API notified meanwhile, counts as
        new ratings (a re-rating of a turn already waiting does not raise it; after a
        successful round the count drops and only the threshold check matters)."""
        if not self.enabled or self.config.schedule.train_after_ratings <= 0:
            return
        waiting = self.store.ratings_waiting()
        with self._state:
            external = max(0, waiting - self._waiting_seen - self._notified)
            self._waiting_seen, self._notified = waiting, 0
            self._since_failure += external
        if external:
            log.info("%s rating(s) stored by another process", external)
        self._check_ratings()

    def _check_ratings(self) -> None:
        needed = self.config.schedule.train_after_ratings
        if not self.enabled or needed <= 0 or self._stopping:
            return
        if self._round.locked() or self._pending or self._since_failure < needed:
            return  # a round running now re-checks when it ends
        waiting = self.store.ratings_waiting()
        if waiting >= needed:
            log.info("%s ratings waiting (threshold %s): training now", waiting, needed)
            self.request("ratings")

    # --- the job ---------------------------------------------------------------------

    def _job(self, trigger: str, force: bool) -> None:
        if not self._round.acquire(blocking=False):
            log.info("%s round skipped: %s", trigger, BUSY)
            return
        try:
            with self._state:
                if trigger != "interval":
                    self._pending = None
                if self._stopping:
                    return
                self._current = {"trigger": trigger, "started_at": iso(self.now())}
            needed = {"interval": 1, "ratings": self.config.schedule.train_after_ratings}
            result = run_job(trigger, force=force, round_fn=self.round_fn, store=self.store,
                             now=self.now, min_waiting=needed.get(trigger, 0),
                             picks_count=trigger == "interval")
            with self._state:
                if result["status"] != "skipped" or trigger not in needed:
                    self.last_result = result
                if result["status"] == "failed":
                    self._since_failure = 0
                elif result["status"] in ("succeeded", "rejected"):
                    self._since_failure = math.inf
            if result["status"] == "failed":
                # Ratings stored before the failure (by other processes, not yet polled)
                # are not new after it: the poll counts from here.
                waiting = self.store.ratings_waiting()
                with self._state:
                    self._waiting_seen, self._notified = waiting, 0
        except Exception:  # noqa: BLE001 - never let a job kill the worker thread
            log.exception("training job (%s) failed", trigger)
        finally:
            with self._state:
                self._current = None
            self._round.release()
        try:
            self._check_ratings()  # ratings that arrived while the round ran
        except Exception:  # noqa: BLE001
            log.exception("ratings check after a round failed")

    # --- what status shows -----------------------------------------------------------

    def info(self) -> dict[str, Any]:
        jobs = [j for j in self._aps.get_jobs() if j.id in ROUND_JOBS
                and j.next_run_time] if self._aps.running else []
        interval = next((j for j in jobs if j.id == "interval"), None)
        current = self._current
        training = self.busy or self._pending is not None
        return {
            "scheduling": self.enabled,
            "training": training,
            "current_trigger": (current or {}).get("trigger") or self._pending,
            "round_started_at": (current or {}).get("started_at"),
            "current_run_id": self.current_run_id() if self.busy else None,
            "next_run": iso(min((j.next_run_time for j in jobs), default=None)),
            "next_interval_run": iso(interval.next_run_time) if interval else None,
            "train_interval_minutes": self.config.schedule.train_interval_minutes,
            "ratings_waiting": self.store.ratings_waiting(),
            "train_after_ratings": self.config.schedule.train_after_ratings,
            "ratings_since_failure": None if math.isinf(self._since_failure)
            else int(self._since_failure),
            "last_result": self.last_result,
        }
