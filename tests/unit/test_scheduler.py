"""The daemon's schedule, swaps and rollbacks, with a fake round runner and a fake engine.

The scheduler is the real APScheduler and the store a real SQLite database; only the
child process (reinf.daemon.worker) and the model (reinf.serving.engine) are replaced, by fakes that
write the same rows a real round writes.

A test that asserts that something did *not* happen injects a ``FakeClock``: the schedule
then only moves when the test advances the clock and runs what is due
(``Scheduler.run_due``, the check APScheduler's thread makes), so "nothing ran" holds
however slow the machine is, with no sleep.
"""
from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from reinf.daemon.background import INTERRUPTED, Daemon
from reinf.daemon.lock import acquire_train_lock
from reinf.daemon.scheduler import BUSY, iso, run_job
from reinf.daemon.worker import Outcome
from reinf.errors import BadInput, Conflict, NotFound
from reinf.training.checkpoints import REQUIRED
from webui_fakes import wait_for



class FakeClock:
    """The scheduler's clock, moved only by the test. It starts far ahead of real time, so
    APScheduler's own thread, which reads the real clock, never finds a job due."""

    def __init__(self):
        self.t = datetime(2100, 1, 1, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.t

    def advance(self, **delta) -> None:
        self.t += timedelta(**delta)


def rate_new_turn(store, score: int = 4) -> int:
    conv = store.create_conversation("t").id
    turn = store.append_turn(conv, "question", "reply", prompt_ids=[1, 2], reply_ids=[3, 4],
                             logprobs=[-0.5, -0.7])
    store.rate(turn.id, score)
    return turn.id


def make_checkpoint(store, home: Path, checkpoint_id: str, *, parent: str | None = None,
                    complete: bool = True, activate: bool = False) -> str:
    path = home / "checkpoints" / checkpoint_id
    path.mkdir(parents=True)
    for name in REQUIRED if complete else REQUIRED[:-1]:
        (path / name).write_text("x")
    store.add_checkpoint(checkpoint_id, str(path), parent_id=parent)
    if activate:
        store.activate_checkpoint(checkpoint_id)
    return str(path)


class FakeEngine:
    def __init__(self, fail_on: set[str] | None = None):
        self.active_checkpoint_id: str | None = None
        self.swaps: list[tuple[str | None, str | None]] = []
        self.fail_on = fail_on or set()

    def request_swap(self, checkpoint_id, path=None):
        if checkpoint_id in self.fail_on:
            raise RuntimeError(f"broken adapter {checkpoint_id}")
        self.swaps.append((checkpoint_id, path))
        self.active_checkpoint_id = checkpoint_id
        return 1.5


class FakeRunner:
    """Writes the rows a real round writes; ``script`` says what each round does."""

    def __init__(self, store, home: Path, script=None):
        self.store, self.home = store, home
        self.script = list(script or [])
        self.calls: list[str] = []
        self.release = threading.Event()
        self.release.set()
        self.entered = threading.Event()
        self.active = 0
        self.most_active = 0
        self.run_id: int | None = None
        self.stop_reason: str | None = None

    def current_run_id(self):
        return self.run_id

    def stop(self, reason="stopped at shutdown"):
        self.stop_reason = reason
        self.release.set()

    def kill_now(self):
        self.stop("killed")

    def run(self, trigger, *, force=False):
        self.calls.append(trigger)
        self.active += 1
        self.most_active = max(self.most_active, self.active)
        try:
            action = self.script.pop(0) if self.script else "succeed"
            if action == "raise":
                raise RuntimeError("boom in the runner")
            run = self.store.start_run(trigger, pid=12345)
            self.run_id = run.id
            self.entered.set()
            self.release.wait(30)
            if self.stop_reason:
                self.store.finish_run(run.id, "failed", error=self.stop_reason)
                return Outcome("failed", self.stop_reason, run_id=run.id)
            if action == "fail":
                self.store.finish_run(run.id, "failed", error="reward hook broken")
                return Outcome("failed", "reward hook broken", run_id=run.id, exit_code=5)
            ckpt = f"r{len(self.calls):04d}"
            parent = self.store.active_checkpoint()
            make_checkpoint(self.store, self.home, ckpt, parent=parent.id if parent else None)
            self.store.activate_checkpoint(ckpt)
            self.store.finish_run(run.id, "succeeded", checkpoint_id=ckpt)
            return Outcome("succeeded", f"checkpoint {ckpt} is active", run_id=run.id,
                           checkpoint_id=ckpt, exit_code=0)
        finally:
            self.run_id = None
            self.active -= 1


@pytest.fixture
def build(config, store, home):
    made = []

    def make(script=None, engine=None, schedule=True, clock=None, **settings):
        cfg = config.replace(**{"train_interval_minutes": 0, "train_after_ratings": 3,
                                **settings})
        runner = FakeRunner(store, home, script)
        daemon = Daemon(cfg, store, engine if engine is not None else FakeEngine(),
                        runner=runner, schedule=schedule, **({"now": clock} if clock else {}))
        made.append(daemon)
        return daemon, runner
    yield make
    for daemon in made:
        daemon.shutdown(timeout=5)


def test_ratings_threshold_starts_a_round_counted_exactly(build, store):
    clock = FakeClock()
    daemon, runner = build(clock=clock)
    daemon.start()
    first = rate_new_turn(store)
    daemon.notify_rating()
    rate_new_turn(store)
    daemon.notify_rating()
    store.rate(first, 2)  # a re-rate: three notifications, still two waiting ratings
    daemon.notify_rating()
    clock.advance(seconds=daemon.reconcile_seconds)  # the ratings poll looks again too
    assert sorted(daemon.scheduler.run_due()) == ["ratings-poll", "reconcile"]
    assert runner.calls == [] and daemon.schedule_info()["training"] is False
    assert daemon.schedule_info()["ratings_waiting"] == 2
    rate_new_turn(store)
    daemon.notify_rating()
    assert daemon.schedule_info()["current_trigger"] == "ratings"  # queued for now
    assert daemon.scheduler.run_due() == ["train"]
    assert daemon.schedule_info()["last_result"] is not None
    assert runner.calls == ["ratings"]
    assert daemon.schedule_info()["last_result"]["status"] == "succeeded"
    assert store.ratings_waiting() == 0


def test_interval_ticks_train_only_when_ratings_wait(build, store):
    clock = FakeClock()
    daemon, runner = build(clock=clock, train_interval_minutes=30, train_after_ratings=0)
    daemon.start()
    assert daemon.schedule_info()["next_run"] == iso(clock() + timedelta(minutes=30))
    for _ in range(3):  # three ticks with nothing to train on
        clock.advance(minutes=30)
        assert "interval" in daemon.scheduler.run_due()
    assert runner.calls == [] and daemon.schedule_info()["last_result"] is None
    clock.advance(minutes=29)
    rate_new_turn(store)
    assert "interval" not in daemon.scheduler.run_due()  # not yet time
    clock.advance(minutes=1)
    assert "interval" in daemon.scheduler.run_due()
    assert runner.calls == ["interval"]
    assert daemon.schedule_info()["last_result"]["status"] == "succeeded"
    for _ in range(3):  # the round consumed the rating: later ticks skip again
        clock.advance(minutes=30)
        assert "interval" in daemon.scheduler.run_due()
    assert runner.calls == ["interval"]



def test_a_pick_alone_is_something_to_train_on_for_the_timer_and_train_now(build, store):
    """Picks (compare, regenerate) teach the rating model: the timer and Train now run a
    round for a new pick with no new rating; the round consumes it like a rating."""
    clock = FakeClock()
    daemon, runner = build(clock=clock, train_interval_minutes=30, train_after_ratings=0)
    daemon.start()
    rate_new_turn(store)
    clock.advance(minutes=30)
    daemon.scheduler.run_due()
    assert runner.calls == ["interval"] and store.ratings_waiting() == 0
    assert daemon.train_now()["started"] is False          # nothing new: refused
    clock.advance(minutes=30)
    daemon.scheduler.run_due()
    assert runner.calls == ["interval"]                    # and the timer skips
    store.add_pair("which is better?", "a", a_text="one", b_text="two")
    clock.advance(minutes=30)
    daemon.scheduler.run_due()
    assert runner.calls == ["interval", "interval"]        # the pick alone trains
    clock.advance(minutes=30)
    daemon.scheduler.run_due()
    assert runner.calls == ["interval", "interval"]        # ... once
    store.add_pair("and now?", "b", a_text="one", b_text="two")
    assert daemon.train_now()["started"] is True
    daemon.scheduler.run_due()
    assert runner.calls == ["interval", "interval", "request"]


def test_the_interval_timer_fires_on_the_real_clock(build, store):
    daemon, runner = build(train_interval_minutes=0.005, train_after_ratings=0)
    rate_new_turn(store)
    daemon.start()
    assert wait_for(lambda: runner.calls == ["interval"], timeout=5)
    assert wait_for(lambda: daemon.schedule_info()["last_result"] is not None)


def test_one_round_at_a_time_and_ratings_during_a_round_train_next(build, store):
    clock = FakeClock()
    daemon, runner = build(clock=clock)
    daemon.start()
    rate_new_turn(store)
    runner.release.clear()
    assert daemon.train_now()["started"] is True
    worker = threading.Thread(target=daemon.scheduler.run_due)  # the round, held open
    worker.start()
    assert runner.entered.wait(5)
    busy = daemon.train_now()
    assert busy == {"started": False, "reason": BUSY, "run_id": runner.run_id,
                    "trigger": "request"}
    assert daemon.schedule_info()["training"] is True
    for _ in range(3):  # enough for the ratings trigger, but a round is running
        rate_new_turn(store)
        daemon.notify_rating()
    clock.advance(seconds=1)
    assert daemon.scheduler.run_due() == []  # nothing queued behind the round
    assert runner.calls == ["request"]
    runner.release.set()
    worker.join(10)
    assert not worker.is_alive()
    assert runner.calls == ["request", "ratings"]  # the round's end re-checked the ratings
    assert not daemon.schedule_info()["training"]
    assert runner.most_active == 1


def test_a_failed_round_is_recorded_and_the_scheduler_lives_on(build, store):
    clock = FakeClock()
    daemon, runner = build(clock=clock, script=["raise", "fail", "succeed"],
                           train_after_ratings=2)
    daemon.start()
    rate_new_turn(store)
    assert daemon.train_now()["started"]
    assert daemon.scheduler.run_due() == ["train"]
    last = daemon.schedule_info()["last_result"]
    assert last["status"] == "failed" and "boom in the runner" in last["message"]
    assert daemon.train_now()["started"]
    assert daemon.scheduler.run_due() == ["train"]
    assert len(runner.calls) == 2 and not daemon.scheduler.busy
    assert store.list_runs()[0].status == "failed"
    assert store.list_runs()[0].error == "reward hook broken"
    # After a failure the ratings trigger waits for train_after_ratings *new* ratings,
    # though the old ones still wait (a broken hook must not retry on every click). The
    # first rating reached the store without the API (as `reinf rate` does): the ratings
    # poll that runs now must not count it as new either.
    rate_new_turn(store)
    daemon.notify_rating()
    clock.advance(seconds=daemon.reconcile_seconds)
    assert "train" not in daemon.scheduler.run_due()
    assert len(runner.calls) == 2 and store.ratings_waiting() == 2
    rate_new_turn(store)
    daemon.notify_rating()
    assert daemon.scheduler.run_due() == ["train"]
    assert len(runner.calls) == 3
    assert daemon.schedule_info()["last_result"]["status"] == "succeeded"


def test_a_successful_round_is_swapped_in(build, store):
    engine = FakeEngine()
    daemon, runner = build(engine=engine)
    daemon.start()
    rate_new_turn(store)
    daemon.train_now()
    assert wait_for(lambda: engine.swaps)
    ckpt = runner.store.active_checkpoint()
    assert engine.swaps == [(ckpt.id, ckpt.path)]
    assert wait_for(lambda: daemon.schedule_info()["last_result"] is not None)
    info = daemon.schedule_info()
    assert info["last_result"]["swapped"] is True
    assert info["active_checkpoint"] == ckpt.id


def test_a_checkpoint_the_engine_cannot_load_is_not_left_active(build, store, home):
    make_checkpoint(store, home, "good", activate=True)
    engine = FakeEngine(fail_on={"r0001"})
    daemon, runner = build(engine=engine)
    daemon.start()
    rate_new_turn(store)
    daemon.train_now()
    assert wait_for(lambda: daemon.schedule_info()["last_result"] is not None)
    result = daemon.schedule_info()["last_result"]
    assert result["status"] == "succeeded" and result["swapped"] is False
    assert "r0001" in result["swap_error"]
    assert store.active_checkpoint().id == "good" == engine.active_checkpoint_id
    assert any("r0001" in w for w in daemon.schedule_info()["warnings"])


def test_rollback_switches_store_and_engine_and_survives_a_restart(build, store, home):
    c1 = make_checkpoint(store, home, "c1")
    make_checkpoint(store, home, "c2", parent="c1", activate=True)
    make_checkpoint(store, home, "half", complete=False)
    engine = FakeEngine()
    daemon, _ = build(engine=engine)
    daemon.start()
    assert engine.active_checkpoint_id == "c2"
    out = daemon.rollback(None)  # no target: the parent
    assert out["active_checkpoint"] == "c1" and out["previous_checkpoint"] == "c2"
    assert engine.swaps[-1] == ("c1", c1)
    with pytest.raises(NotFound):
        daemon.rollback("nope")
    with pytest.raises(Conflict, match="incomplete"):
        daemon.rollback("half")
    assert store.active_checkpoint().id == "c1" == engine.active_checkpoint_id
    daemon.shutdown(timeout=5)

    restarted_engine = FakeEngine()
    again, _ = build(engine=restarted_engine)
    again.start()
    assert restarted_engine.swaps == [("c1", c1)]
    assert again.rollback("base")["active_checkpoint"] == "base"
    assert store.active_checkpoint() is None and restarted_engine.active_checkpoint_id is None
    store.set_checkpoint_status("c2", "rejected")
    with pytest.raises(BadInput):
        again.rollback("c2")


def test_rollback_during_a_round_wins_over_the_rounds_checkpoint(build, store, home):
    make_checkpoint(store, home, "c1", activate=True)
    engine = FakeEngine()
    daemon, runner = build(engine=engine)
    daemon.start()
    rate_new_turn(store)
    runner.release.clear()
    daemon.train_now()
    assert runner.entered.wait(5)
    daemon.rollback("base")
    runner.release.set()
    assert wait_for(lambda: daemon.schedule_info()["last_result"] is not None)
    result = daemon.schedule_info()["last_result"]
    assert result["status"] == "succeeded" and result["swapped"] is False
    assert store.active_checkpoint() is None and engine.active_checkpoint_id is None
    assert store.get_checkpoint(result["checkpoint_id"]).status == "promoted"


def test_start_marks_interrupted_runs_and_skips_a_broken_checkpoint(build, store, home):
    left = store.start_run("ratings", pid=999999)
    c1 = make_checkpoint(store, home, "c1")
    make_checkpoint(store, home, "c2", parent="c1", complete=False, activate=True)
    engine = FakeEngine()
    daemon, _ = build(engine=engine)
    daemon.start()
    run = store.get_run(left.id)
    assert run.status == "failed" and run.error == INTERRUPTED
    assert store.active_checkpoint().id == "c1"
    assert engine.swaps == [("c1", c1)]
    assert any("c2" in w and "serving c1" in w for w in daemon.schedule_info()["warnings"])


def test_a_round_of_another_process_is_left_alone_then_followed(build, store, config, home):
    """A foreground `reinf train` (or a trainer that outlived a crashed server) holds the
    train lock: its row stays running, and what it activates is served when it ends."""
    live = store.start_run("manual", pid=4242)
    held = acquire_train_lock(config, trigger="manual")
    engine = FakeEngine()
    clock = FakeClock()
    daemon, _ = build(engine=engine, clock=clock)
    try:
        daemon.start()
        assert store.get_run(live.id).status == "running"
        make_checkpoint(store, home, "theirs", activate=True)
        store.finish_run(live.id, "succeeded", checkpoint_id="theirs")
        clock.advance(seconds=daemon.reconcile_seconds)
        assert "reconcile" in daemon.scheduler.run_due()
        assert engine.active_checkpoint_id is None  # not while their round runs
    finally:
        held.release()
    clock.advance(seconds=daemon.reconcile_seconds)
    assert "reconcile" in daemon.scheduler.run_due()
    assert engine.active_checkpoint_id == "theirs"
    assert store.get_run(live.id).status == "succeeded"


def test_a_second_daemon_on_the_same_data_dir_is_refused(build):
    first, _ = build()
    first.start()
    second, _ = build()
    with pytest.raises(Conflict, match="another reinf serve"):
        second.start()


def test_shutdown_stops_the_round_and_records_why(build, store):
    daemon, runner = build()
    daemon.start()
    rate_new_turn(store)
    runner.release.clear()
    daemon.train_now()
    assert runner.entered.wait(30)  # generous: both return as soon as done (a loaded machine)
    assert daemon.shutdown(timeout=30) is True
    assert store.list_runs()[0].status == "failed"
    assert store.list_runs()[0].error == "stopped at shutdown"
    assert daemon.train_now()["started"] is False
    assert daemon.schedule_info()["running"] is False


def test_changes_made_by_other_processes_reach_the_engine(build, store, home):
    """`reinf rollback` without a reachable server, or a foreground `reinf train`, change
    the store; the reconcile job brings the engine (and orphaned rows) in line."""
    c1 = make_checkpoint(store, home, "c1")
    engine = FakeEngine()
    daemon, _ = build(engine=engine, schedule=False)
    daemon.reconcile_seconds = 0.1
    daemon.start()
    assert daemon.schedule_info()["next_run"] is None  # housekeeping is not a round
    store.activate_checkpoint("c1")
    assert wait_for(lambda: engine.swaps == [("c1", c1)])
    orphan = store.start_run("ratings", pid=999999)  # its trainer died with no one to tell
    assert wait_for(lambda: store.get_run(orphan.id).status == "failed")
    assert store.get_run(orphan.id).error == INTERRUPTED
    assert engine.swaps == [("c1", c1)]


def test_ratings_stored_by_other_processes_reach_the_trigger(build, store):
    """`reinf rate` writes to the store, not through the API: the poll notices it, and
    counts it toward the new ratings a failed round waits for."""
    clock = FakeClock()
    daemon, runner = build(clock=clock, script=["fail", "succeed"], train_after_ratings=2)
    daemon.start()

    def poll():
        clock.advance(seconds=daemon.reconcile_seconds)
        ran = daemon.scheduler.run_due()
        assert "ratings-poll" in ran
        return ran
    first = rate_new_turn(store)
    store.rate(first, 1)  # a re-rating: still one waiting
    assert "train" not in poll()
    assert runner.calls == []
    rate_new_turn(store)
    assert "train" in poll()  # the poll noticed it and the round ran
    assert runner.calls == ["ratings"]
    assert daemon.schedule_info()["last_result"]["status"] == "failed"
    assert daemon.schedule_info()["ratings_since_failure"] == 0
    rate_new_turn(store)  # one new rating after the failure: not yet
    assert "train" not in poll()
    assert runner.calls == ["ratings"] and daemon.schedule_info()["ratings_since_failure"] == 1
    rate_new_turn(store)
    daemon.notify_rating()  # the second, through the API: two new ratings in all
    assert daemon.scheduler.run_due() == ["train"]
    assert runner.calls == ["ratings", "ratings"]
    assert daemon.schedule_info()["last_result"]["status"] == "succeeded"


def test_no_train_turns_scheduling_off_but_train_now_works(build, store):
    clock = FakeClock()
    daemon, runner = build(clock=clock, schedule=False, train_interval_minutes=30,
                           train_after_ratings=1)
    daemon.start()
    assert daemon.schedule_info()["next_run"] is None
    rate_new_turn(store)
    daemon.notify_rating()
    clock.advance(minutes=90)  # three intervals, and many ratings polls
    assert sorted(daemon.scheduler.run_due()) == ["ratings-poll", "reconcile"]
    assert runner.calls == [] and daemon.schedule_info()["training"] is False
    assert daemon.train_now()["started"] is True
    assert daemon.scheduler.run_due() == ["train"]
    assert runner.calls == ["request"]


def test_train_now_with_nothing_new_says_so(build):
    daemon, runner = build()
    daemon.start()
    out = daemon.train_now()
    assert out["started"] is False and "nothing new" in out["reason"]
    assert daemon.train_now(force=True)["started"] is True
    assert wait_for(lambda: runner.calls == ["request"])


def test_run_job_is_the_job_boundary(store):
    clock = iter([f"2030-01-01T00:00:0{i}" for i in range(9)])

    def now():
        from datetime import datetime
        return datetime.fromisoformat(next(clock))

    def crash(trigger, force):
        raise ValueError("bad")

    result = run_job("ratings", force=False, round_fn=crash, store=store, now=now)
    assert result["status"] == "failed" and "ValueError: bad" in result["message"]
    assert result["started_at"] == "2030-01-01T00:00:00"
    assert result["finished_at"] == "2030-01-01T00:00:01"
    skipped = run_job("interval", force=False, round_fn=crash, store=store, now=now,
                      min_waiting=1)
    assert skipped["status"] == "skipped" and "0 new rating" in skipped["message"]


def test_a_one_off_job_ending_during_shutdown_leaves_no_traceback():
    """APScheduler 3.x marks itself stopped before it takes the job-store lock, so a one-off
    job handed to the worker just then cannot be removed by its thread: with the plain
    BackgroundScheduler that thread dies with JobLookupError. Made to happen every time
    here: the job's removal waits until shutdown has begun."""
    import time

    from apscheduler.jobstores.base import JobLookupError
    from apscheduler.schedulers.background import BackgroundScheduler

    from reinf.daemon.scheduler import _Aps

    def race(cls) -> list[BaseException]:
        errors: list[BaseException] = []
        stopping, ran = threading.Event(), threading.Event()

        class Racing(cls):
            def remove_job(self, job_id, jobstore=None):
                if job_id == "once" and threading.current_thread() is self._thread:
                    assert stopping.wait(10)
                    while self.running:  # shutdown has marked it stopped
                        time.sleep(0.01)
                try:
                    super().remove_job(job_id, jobstore)
                except BaseException as exc:
                    errors.append(exc)
                    raise
        aps = Racing(timezone=timezone.utc)
        aps.start()
        aps.add_job(ran.set, "date", run_date=datetime.now(timezone.utc), id="once")
        assert ran.wait(10)
        stopping.set()
        aps.shutdown(wait=True)
        return errors

    died: list = []
    hook, threading.excepthook = threading.excepthook, died.append  # the plain one's death
    try:
        plain = race(BackgroundScheduler)
    finally:
        threading.excepthook = hook
    assert len(plain) == 1 and isinstance(plain[0], JobLookupError)  # the race is real
    assert [d.exc_type for d in died] == [JobLookupError]
    assert race(_Aps) == []
    aps = _Aps(timezone=timezone.utc)
    aps.start()
    with pytest.raises(JobLookupError):  # while running, an unknown job is still an error
        aps.remove_job("no-such-job")
    aps.shutdown()


def test_the_timer_trains_on_a_new_rewrite_as_on_a_new_pick(store):
    """A rewrite is no rating, so the ratings trigger does not count it; the timer's job
    (picks_count) runs a round for it, once there are ratings, and not again after."""
    from datetime import datetime

    calls = []

    def round_fn(trigger, force):
        calls.append(trigger)
        run = store.start_run(trigger)
        store.finish_run(run.id, "succeeded")
        return {"status": "succeeded"}

    def job():
        return run_job("interval", force=False, round_fn=round_fn, store=store,
                       now=lambda: datetime.now(timezone.utc), min_waiting=1,
                       picks_count=True)

    conv = store.create_conversation("c").id
    turn = store.append_turn(conv, "q", "a", prompt_ids=[1], reply_ids=[2], logprobs=[-1.0])
    store.rewrite(turn.id, "wanted")
    assert job()["status"] == "skipped" and calls == []  # no rating yet: nothing to train
    store.rate(turn.id, 2)
    assert job()["status"] == "succeeded" and calls == ["interval"]
    assert job()["status"] == "skipped"  # nothing new since that round
    store.rewrite(turn.id, "wanted, written again")
    assert job()["status"] == "succeeded" and calls == ["interval"] * 2
