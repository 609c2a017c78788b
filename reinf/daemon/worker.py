"""The child trainer: spawn ``python -m reinf.training.child``, watch it, and say how it ended.

A round runs in its own process so that a crash, an out-of-memory kill or a hung reward
hook never takes the chat down, and so that its memory goes back to the system. The
child:

- runs in its own process group, so Ctrl+C in the terminal reaches only the server (which
  then stops the child in order), and so killing the group also kills a reward-hook
  grandchild;
- is niced to ``train_nice`` for all its threads (set before exec; Linux niceness is per
  thread) and limited to ``train_threads`` through the usual OpenMP/MKL variables;
- dies with the server on Linux (``PR_SET_PDEATHSIG``), so a ``kill -9`` of the server
  never leaves an orphan trainer that later activates a checkpoint behind its back;
- inherits the train lock (reinf.daemon.lock), so a trainer that outlives its server elsewhere
  still keeps a second round from starting.

The child records its own ``training_runs`` row (``pid`` = its pid) and prints its result
as JSON on the last line of stdout. When it cannot (killed, timed out, crashed before it
wrote a row), :meth:`ChildRunner.run` records the failure itself: no run is ever left
``running``.
"""
from __future__ import annotations

import collections
import ctypes
import ctypes.util
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from reinf.daemon.lock import RETRY_SECONDS, acquire_train_lock, train_lock_holder
from reinf.errors import ReinfError
from reinf.training.outcome import RoundOutcome

log = logging.getLogger("reinf.daemon.worker")
child_log = logging.getLogger("reinf.training.child")

PR_SET_PDEATHSIG = 1
STOP_GRACE_SECONDS = 5.0
STDERR_TAIL = 40
Command = Callable[[str, bool], Sequence[str]]


@dataclass
class Outcome:
    """How one round ended, as the scheduler and the API report it."""
    status: str                        # succeeded | rejected | failed | skipped
    message: str
    run_id: int | None = None
    checkpoint_id: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None       # negative: killed by that signal
    seconds: float = 0.0
    pid: int | None = None
    held_by: int | str | None = None  # skipped: the pid holding the train lock
    error: str | None = None           # the trainer's kind: nothing_to_train | hook | model | error

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "message": self.message, "run_id": self.run_id,
                "checkpoint_id": self.checkpoint_id, "metrics": self.metrics,
                "exit_code": self.exit_code, "seconds": round(self.seconds, 2),
                "error": self.error or (RoundOutcome.FAILED.error
                                        if self.status == RoundOutcome.FAILED.status else None)}


def build_command(trigger: str, force: bool = False, *,
                  config_file: str | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "reinf.training.child", "--json", "--no-progress",
           "--trigger", trigger]
    if config_file:
        cmd += ["--config", config_file]
    return cmd + (["--force"] if force else [])


def build_child_env(config, base: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment, pointed at the same data directory and the model it serves,
    thread-limited."""
    env = dict(os.environ if base is None else base)
    env.update(REINF_HOME=str(config.data_dir), PYTHONUNBUFFERED="1")
    # The model the server serves, whatever config.yaml says now: an adapter trained on
    # another base would not load into it (model_path takes effect only after a restart,
    # as `reinf status` says when the file changed).
    env["REINF_MODEL_PATH"] = config.model.model_path
    if config.schedule.train_nice:
        # The niceness is already set for the whole child before exec (all threads); the
        # child need not touch it again.
        env["REINF_TRAIN_NICE"] = "0"
    threads = config.schedule.train_threads
    if threads > 0:
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                     "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS"):
            env[name] = str(threads)
    return env


def describe_seconds(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.4g} minutes"


def describe_signal(signum: int) -> str:
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    text = f"killed by signal {signum} ({name})"
    if signum == signal.SIGKILL:
        text += " — out of memory? (the kernel's OOM killer sends SIGKILL)"
    return text


def _load_prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


def _prepare_child(nice: int, parent: int) -> Callable[[], None]:
    """What runs in the child between fork and exec: no imports, no locks, just syscalls."""
    prctl = _PRCTL

    def prepare() -> None:
        os.setpgid(0, 0)
        if nice:
            os.setpriority(os.PRIO_PROCESS, 0, max(nice, os.getpriority(os.PRIO_PROCESS, 0)))
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:  # the server died before prctl took effect
                os._exit(1)
    return prepare


class ChildRunner:
    """Runs one round at a time in a child process. ``command(trigger, force)`` builds the
    argv (tests pass fake children through this same code)."""

    def __init__(self, config, store, *, command: Command | None = None,
                 timeout_seconds: float | None = None, env: dict[str, str] | None = None,
                 grace_seconds: float = STOP_GRACE_SECONDS):
        self.config = config
        self.store = store
        self.command = command or (lambda trigger, force: build_command(
            trigger, force, config_file=config.source))
        self.timeout = (timeout_seconds if timeout_seconds is not None
                        else config.schedule.train_timeout_minutes * 60.0)
        self.env = env
        self.grace = grace_seconds
        self._proc: subprocess.Popen | None = None
        self._stop_reason: str | None = None
        self._guard = threading.Lock()

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def current_run_id(self) -> int | None:
        """The run row the running child created (found by its pid), if any yet."""
        pid = self.pid
        if pid is None:
            return None
        return next((r.id for r in self.store.list_runs(limit=10)
                     if r.pid == pid and r.status == "running"), None)

    # --- one round ------------------------------------------------------------------

    def run(self, trigger: str, *, force: bool = False) -> Outcome:
        """Spawn, watch and interpret one round. Blocks until the child is gone."""
        started = time.monotonic()
        try:  # the reconcile job holds the lock for microseconds: wait that long
            train_lock = acquire_train_lock(self.config, trigger=trigger, wait=RETRY_SECONDS)
        except ReinfError as exc:  # a full disk: the lock was not kept, the next round may go
            log.error("training round not started: %s", exc)
            return Outcome("failed", f"not started: {exc}",
                           seconds=time.monotonic() - started)
        if train_lock is None:
            other = train_lock_holder(self.config)
            return Outcome("skipped", "another training round is already running (started "
                           f"by pid {other})", held_by=other)
        try:
            return self._run_locked(trigger, force, started, train_lock.fd)
        finally:
            train_lock.release()

    def _run_locked(self, trigger: str, force: bool, started: float, lock_fd: int) -> Outcome:
        argv = list(self.command(trigger, force))
        with self._guard:
            if self._stop_reason is not None:
                return Outcome("skipped", f"not started: {self._stop_reason}")
            try:
                self._proc = proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, env=build_child_env(self.config, self.env),
                    pass_fds=(lock_fd,),
                    preexec_fn=_prepare_child(self.config.schedule.train_nice, os.getpid()))
            except (OSError, subprocess.SubprocessError) as exc:  # no memory to fork, ...
                outcome = Outcome("failed", f"could not start the trainer: {exc}",
                                  seconds=time.monotonic() - started)
                outcome.run_id = self._record_failure(-1, outcome, trigger)
                return outcome
        log.info("training round (%s) started: pid %s", trigger, proc.pid)
        out_lines: list[str] = []
        err_tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL)
        readers = [threading.Thread(target=_read_stdout, args=(proc.stdout, out_lines),
                                    daemon=True, name="reinf-trainer-stdout"),
                   threading.Thread(target=_read_stderr, args=(proc.stderr, err_tail, proc.pid),
                                    daemon=True, name="reinf-trainer-stderr")]
        for t in readers:
            t.start()
        killed = self._watch(proc, started)
        for t in readers:
            t.join(timeout=self.grace)
        with self._guard:
            self._proc = None
        outcome = interpret(proc.returncode, out_lines, list(err_tail), killed)
        outcome.pid, outcome.seconds = proc.pid, time.monotonic() - started
        if outcome.status == "failed":
            outcome.run_id = self._record_failure(proc.pid, outcome, trigger)
        log.log(logging.WARNING if outcome.status == "failed" else logging.INFO,
                "training round (%s) %s after %.1f s: %s", trigger, outcome.status,
                outcome.seconds, outcome.message)
        return outcome

    def _watch(self, proc: subprocess.Popen, started: float) -> str | None:
        """Wait for the child; kill its group on timeout or stop. Returns why we killed it."""
        deadline = started + self.timeout
        while True:
            try:
                proc.wait(timeout=0.2)
                return None
            except subprocess.TimeoutExpired:
                pass
            if self._stop_reason is not None:
                reason = self._stop_reason
            elif time.monotonic() >= deadline:
                reason = (f"timed out after {describe_seconds(self.timeout)}; a reward hook or "
                          "the model may hang (train_timeout_minutes)")
            else:
                continue
            self._terminate(proc)
            return reason

    def _terminate(self, proc: subprocess.Popen) -> None:
        """SIGTERM to the child's group, then SIGKILL after the grace period."""
        _kill_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=self.grace)
        except subprocess.TimeoutExpired:
            pass
        _kill_group(proc.pid, signal.SIGKILL)  # also reaps grandchildren left in the group
        proc.wait()

    def stop(self, reason: str = "stopped at shutdown") -> None:
        """Stop the running child (if any) from another thread; ``run`` records ``reason``.
        Also refuses rounds that have not started yet."""
        with self._guard:
            self._stop_reason = reason

    def kill_now(self) -> None:
        """SIGKILL the child's group at once (a second Ctrl+C)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            _kill_group(proc.pid, signal.SIGKILL)

    # --- the run row ----------------------------------------------------------------

    def _record_failure(self, pid: int, outcome: Outcome, trigger: str) -> int | None:
        """Finish the child's run row as failed (it could not), or create one: a failure
        the person never sees is worse than an extra row."""
        if outcome.run_id is not None:
            run = self.store.get_run(outcome.run_id)
        else:  # the row this child created; an old row of a reused pid is finished already
            run = next((r for r in self.store.list_runs(limit=20)
                        if r.pid == pid and r.status == "running"), None)
        if run is None:
            run = self.store.start_run(trigger, pid=pid if pid > 0 else None)
        if run.status == "running":
            self.store.finish_run(run.id, "failed", error=outcome.message,
                                  metrics={"seconds": round(outcome.seconds, 2)})
        return run.id


def interpret(returncode: int, out_lines: list[str], err_tail: list[str],
              killed: str | None) -> Outcome:
    """Turn an exit status, the child's stdout and its last stderr lines into an Outcome."""
    payload = _last_json(out_lines)
    if killed is not None:
        return Outcome("failed", killed, exit_code=returncode,
                       run_id=payload.get("run_id") if payload else None)
    if returncode < 0:
        return Outcome("failed", describe_signal(-returncode), exit_code=returncode)
    if payload is not None and payload.get("status") in ("succeeded", "rejected", "failed",
                                                         "skipped"):
        ended = RoundOutcome.of(payload["status"], payload.get("error"))
        if ended is RoundOutcome.SUCCEEDED and returncode != ended.exit_code:
            ended = RoundOutcome.FAILED  # a result line that the exit code contradicts
        return Outcome(ended.status, str(payload.get("message") or ended.status),
                       run_id=payload.get("run_id"), checkpoint_id=payload.get("checkpoint_id"),
                       metrics=dict(payload.get("metrics") or {}), exit_code=returncode,
                       error=ended.error)
    last = next((line for line in reversed(err_tail) if line.strip()), "")
    reason = f"the trainer exited with code {returncode} and no result"
    return Outcome("failed", f"{reason}: {last.strip()[:300]}" if last else reason,
                   exit_code=returncode)


def _last_json(lines: list[str]) -> dict | None:
    for line in reversed(lines):
        line = line.strip()
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except ValueError:
                return None
            return data if isinstance(data, dict) else None
        if line:
            return None
    return None


def _read_stdout(stream, lines: list[str]) -> None:
    with stream:
        for raw in stream:
            lines.append(raw.decode("utf-8", "replace"))


def _read_stderr(stream, tail: collections.deque, pid: int) -> None:
    """Every stderr line of the child goes to the log (and the last few to the reason)."""
    with stream:
        for raw in stream:
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                tail.append(line)
                child_log.info("[pid %s] %s", pid, line)


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
