"""Real ``reinf serve`` processes for the daemon's end-to-end tests.

``Server`` starts ``python -m reinf serve --port N`` on a free loopback port, with the
test's REINF_HOME and a scrubbed environment (conftest.clean_env), in its own session
so that a ``kill -9`` reaches only the server (the child trainer dies with it through its
parent-death signal, which the tests check). It waits for ``GET /api/status``; every wait
is bounded. The ``servers`` fixture stops what a test started (SIGTERM, then SIGKILL) and
prints each server's output and log file: pytest shows them when the test fails.

The demo model (models/reinf-demo) serves and trains: it is small enough that a round
takes a few seconds on two busy cores.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import requests
import yaml

from conftest import REPO, clean_env

DEMO = REPO / "models" / "reinf-demo"
needs_demo = pytest.mark.skipif(not (DEMO / "config.json").exists(),
                                reason="the demo model (models/reinf-demo) is not built")

# Fast and quiet defaults: one training thread (two cores are shared with the server),
# a short reply, no timer.
BASE_CONFIG: dict[str, Any] = {
    "model": {"model_path": "reinf-demo", "device": "cpu"},
    "generation": {"max_new_tokens": 24},
    "ppo": {"batch_size": 8, "ppo_epochs": 2},
    "schedule": {"train_interval_minutes": 0, "train_after_ratings": 0, "train_threads": 1,
                 "train_nice": 10, "train_timeout_minutes": 5},
}


# A reward hook that holds the round in its reward phase until the test creates
# <data_dir>/gate: "a round is running" for exactly as long as a test needs it. Only the
# trainer's calls wait (the hook runs in a child of the process that calls it); the
# server's own check of the hook (GET /api/status) does not.
GATE_HOOK = """
import os, pathlib, time

def reward_mapper(score, metadata):
    caller = pathlib.Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    gate = pathlib.Path(os.environ["REINF_HOME"], "gate")
    while b"reinf.training.child" in caller and not gate.exists():
        time.sleep(0.02)
    return (score - 3) / 2
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def merge(base: dict, extra: dict) -> dict:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for section, values in extra.items():
        if isinstance(values, dict):
            out.setdefault(section, {}).update(values)
        else:
            out[section] = values
    return out


def write_config(home: Path, **sections: dict) -> Path:
    """config.yaml in the data directory (the server and its child trainer read it)."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / "config.yaml"
    path.write_text(yaml.safe_dump(merge(BASE_CONFIG, sections)))
    return path


def write_gated_config(home: Path, **sections: dict) -> Path:
    """write_config with GATE_HOOK as the reward mapper; open it with ``open_gate``."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "gate_hook.py").write_text(GATE_HOOK)
    rewards = {"reward_mapper": "gate_hook.py:reward_mapper", "hook_timeout_seconds": 120,
               **sections.pop("rewards", {})}
    return write_config(home, rewards=rewards, **sections)


def open_gate(home: Path) -> None:
    (home / "gate").touch()


def wait_for(predicate: Callable[[], Any], timeout: float, what: str,
             interval: float = 0.1) -> Any:
    """Poll until ``predicate()`` is truthy; its value, or AssertionError after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def is_alive(pid: int) -> bool:
    """Running (not a zombie waiting to be reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return not os.path.exists("/proc")


def parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[-1].split()[1])
    except OSError:
        return None


class Server:
    """One ``reinf serve`` process."""

    def __init__(self, home: Path, *args: str, env: dict[str, str] | None = None):
        self.home = home
        self.args = args
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = clean_env(home, OMP_WAIT_POLICY="PASSIVE", **(env or {}))
        self.proc: subprocess.Popen | None = None
        self.out_path = home / f"serve-{self.port}.out"
        self.http = requests.Session()
        self.http.trust_env = False  # never through a proxy

    # --- life ------------------------------------------------------------------------

    def start(self, timeout: float = 120) -> "Server":
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.out_path, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "reinf", "serve", "--port", str(self.port), *self.args],
                env=self.env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(self._ready, timeout, f"reinf serve on port {self.port}")
        return self

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"reinf serve exited with {self.proc.returncode}:\n"
                                 f"{self.output()[-3000:]}")
        try:
            return self.http.get(self.url + "/api/status", timeout=5).status_code == 200
        except requests.RequestException:
            return False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM and wait; SIGKILL if it does not stop in time (then AssertionError)."""
        if self.proc.poll() is not None:
            return self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"reinf serve did not stop within {timeout} s of SIGTERM")

    def kill(self) -> None:
        """kill -9, and reap it."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def output(self) -> str:
        try:
            return self.out_path.read_text(errors="replace")
        except OSError:
            return ""

    def report(self) -> str:
        log = self.home / "logs" / "reinf.log"
        text = log.read_text(errors="replace") if log.exists() else "(no log file)"
        return (f"--- reinf serve :{self.port} output ---\n{self.output()[-6000:]}\n"
                f"--- {log} (tail) ---\n{text[-8000:]}")

    # --- HTTP ------------------------------------------------------------------------

    def call(self, method: str, path: str, body: Any = None, *, ok=(200,),
             timeout: float = 60) -> dict:
        response = self.http.request(method, self.url + path, json=body, timeout=timeout)
        assert response.status_code in ok, (method, path, response.status_code, response.text)
        return response.json()

    def status(self) -> dict:
        return self.call("GET", "/api/status")

    def schedule(self) -> dict:
        return self.status()["schedule"]

    def runs(self) -> list[dict]:
        return self.call("GET", "/api/runs")["runs"]

    def chat(self, message: str, **params: Any) -> dict:
        return self.call("POST", "/api/chat", {"message": message, **params})

    def rate(self, turn_id: int, score: int, **extra: Any) -> dict:
        return self.call("PUT", f"/api/turns/{turn_id}/rating", {"score": score, **extra})

    def chat_and_rate(self, n: int, score: int = 5, prefix: str = "question") -> list[int]:
        turns = [self.chat(f"{prefix} {i}: what is {i} plus {i}?")["turn_id"] for i in range(n)]
        for turn_id in turns:
            self.rate(turn_id, score)
        return turns

    def train_rounds(self, n: int) -> list[str]:
        """``n`` rounds through the API, each on two fresh 5-star ratings; their checkpoints."""
        ids = []
        for i in range(n):
            self.chat_and_rate(2, prefix=f"round {i}")
            before = self.schedule()["last_result"]
            self.call("POST", "/api/train", ok=(202,))
            result = self.wait_result(120, after=before, trigger="request")
            assert result["status"] == "succeeded", result
            ids.append(result["checkpoint_id"])
        return ids

    def served_checkpoint(self) -> str:
        """What the engine serves now ("base" or a checkpoint id)."""
        return self.status()["model"]["active_checkpoint"]

    def wait_result(self, timeout: float, *, after: dict | None = None,
                    trigger: str | None = None) -> dict:
        """The next round result (other than ``after``), once no round runs."""
        def done():
            schedule = self.schedule()
            result = schedule.get("last_result")
            if not result or result == after or schedule["training"]:
                return None
            return result if trigger is None or result.get("trigger") == trigger else None
        return wait_for(done, timeout, "the training round's result", interval=0.2)

    def wait_running_run(self, timeout: float) -> dict:
        """The run row of the round in progress, once its child has created it."""
        def running():
            return next((r for r in self.runs() if r["status"] == "running"), None)
        return wait_for(running, timeout, "a running training run", interval=0.05)


class Servers:
    """What a test started; all stopped, and their output printed, at teardown."""

    def __init__(self) -> None:
        self.started: list[Server] = []

    def start(self, home: Path, *args: str, **kwargs: Any) -> Server:
        server = Server(home, *args, **kwargs)
        self.started.append(server)
        return server.start()

    def close(self) -> None:
        for server in self.started:
            if server.proc is not None and server.proc.poll() is None:
                try:
                    server.stop(timeout=30)
                except AssertionError as exc:
                    print(exc)
            print(server.report())


@pytest.fixture
def servers():
    group = Servers()
    yield group
    group.close()


def read_db(home: Path) -> dict[str, Any]:
    """Straight from the SQLite file, with no server running: integrity, ratings, runs."""
    conn = sqlite3.connect(home / "reinf.db")
    try:
        integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
        ratings = dict(conn.execute("SELECT turn_id, score FROM ratings").fetchall())
        runs = [dict(zip(("id", "status", "error", "pid", "checkpoint_id"), row))
                for row in conn.execute("SELECT id, status, error, pid, checkpoint_id "
                                        "FROM training_runs ORDER BY id")]
        checkpoints = [dict(zip(("id", "run_id", "status", "active", "path"), row))
                       for row in conn.execute("SELECT id, run_id, status, active, path "
                                               "FROM checkpoints ORDER BY created_at")]
    finally:
        conn.close()
    active = [c["id"] for c in checkpoints if c["active"]]
    return {"integrity": integrity, "ratings": ratings, "runs": runs,
            "checkpoints": checkpoints, "active": active[0] if active else None}


def reinf(home: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run a ``reinf`` command in a subprocess, as a person would."""
    return subprocess.run([sys.executable, "-m", "reinf", *args], cwd=REPO,
                          env=clean_env(home, OMP_WAIT_POLICY="PASSIVE"),
                          capture_output=True, text=True, timeout=timeout)


def last_json(text: str) -> dict:
    return json.loads(text)
