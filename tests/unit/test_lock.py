"""The server's lock file between real processes, and finding and talking to a running
server."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import clean_env
from reinf.daemon.lock import acquire_lock, lock_path
from reinf.daemon.remote import (Unreachable, build_url, fetch_schedule, find_server, locate_server,
                                 notify_rollback, probe_server, request_train)
from reinf.errors import Conflict, ReinfError

HOLDER = textwrap.dedent("""
    import sys
    from reinf.config import load_config
    from reinf.daemon.lock import acquire_lock
    lock = acquire_lock(load_config(), url="http://127.0.0.1:9999/")
    print("locked", flush=True)
    sys.stdin.readline()  # hold it until told (or killed)
    lock.release()
    print("released", flush=True)
""")


def start_holder(home):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=clean_env(home))
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_second_server_is_refused_with_a_clear_message_then_takes_over(config, home):
    proc = start_holder(home)
    try:
        with pytest.raises(Conflict) as err:
            acquire_lock(config)
        message = str(err.value)
        assert f"another reinf serve (pid {proc.pid}, http://127.0.0.1:9999/)" in message
        assert str(config.data_dir) in message
        assert "stop it first, or set REINF_HOME to another directory" in message
        probe = locate_server(config)
        assert probe["running"] is True and probe["pid"] == proc.pid
        assert probe["url"] == "http://127.0.0.1:9999/" and probe["started_at"]
        proc.kill()  # like kill -9: no chance to clean up; the kernel drops the flock
        proc.wait()
        assert locate_server(config)["running"] is False
        lock = acquire_lock(config, host="127.0.0.1", port=8766)
        info = json.loads(lock_path(config).read_text())
        assert info["pid"] == os.getpid() and info["port"] == 8766
        lock.release()
    finally:
        proc.kill()
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()


def test_a_clean_release_lets_the_next_server_start(config, home):
    proc = start_holder(home)
    proc.stdin.write("\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "released"
    proc.wait(10)
    proc.stdin.close()
    proc.stdout.close()
    assert lock_path(config).read_text() == ""
    assert locate_server(config)["running"] is False
    with acquire_lock(config) as lock:
        assert lock.held and locate_server(config)["pid"] == os.getpid()
    assert not lock.held and locate_server(config)["running"] is False


def test_deleting_the_pid_file_does_not_let_a_second_server_run(config, home):
    """`rm reinf.pid` after a crash is a common habit: it let a second `reinf serve` run on
    the same data directory, both scheduling rounds."""
    proc = start_holder(home)
    try:
        lock_path(config).unlink()
        with pytest.raises(Conflict) as err:
            acquire_lock(config)
        assert "its reinf.pid was deleted" in str(err.value)
        assert str(config.data_dir) in str(err.value)
        assert not lock_path(config).exists()  # the refused one left nothing behind
        assert locate_server(config)["running"] is True  # status still sees the server
        proc.kill()
        proc.wait()
        with acquire_lock(config) as lock:  # the directory's lock died with it
            assert lock.held and locate_server(config)["pid"] == os.getpid()
    finally:
        proc.kill()
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()


def test_a_stale_file_of_a_dead_process_is_taken_over(config):
    path = lock_path(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pid": 999999, "url": "http://127.0.0.1:1/"}))
    assert locate_server(config)["running"] is False
    with acquire_lock(config, url="http://127.0.0.1:2/") as lock:
        lock.update(url="http://127.0.0.1:3/", port="8771")  # waitress gives text
        probe = locate_server(config)
        assert probe["url"] == "http://127.0.0.1:3/" and probe["port"] == 8771


def test_no_server_means_none_and_false(config):
    assert request_train(config) is None
    assert notify_rollback(config, "base") is False


class JSONHandler(BaseHTTPRequestHandler):
    """A test server's handler that answers JSON and logs nothing."""

    def answer(self, code: int, data) -> None:
        out = json.dumps(data).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


class Recorder(JSONHandler):
    seen: list = []
    reply = (202, {"started": True, "trigger": "request"})
    statuses: list = []

    def do_GET(self):  # noqa: N802
        Recorder.seen.append((self.path, dict(self.headers), None))
        self.answer(200, Recorder.statuses.pop(0))

    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"] or 0))
        Recorder.seen.append((self.path, dict(self.headers), json.loads(body)))
        self.answer(*Recorder.reply)


@pytest.fixture
def fake_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Recorder.seen = []
    yield server
    server.shutdown()
    server.server_close()


def test_requests_reach_the_running_server_with_its_token(config, fake_server):
    cfg = config.replace(auth_token="s3cret-0123456789abcdef")
    port = fake_server.server_address[1]
    with acquire_lock(cfg, host="0.0.0.0", port=port, url=f"http://0.0.0.0:{port}/"):
        Recorder.reply = (202, {"started": True, "trigger": "request"})
        assert request_train(cfg) == {"started": True, "trigger": "request"}
        Recorder.reply = (200, {"active_checkpoint": "base"})
        assert notify_rollback(cfg, None) is True
        Recorder.reply = (409, {"error": "the engine could not load checkpoint x",
                                 "fix": "the active checkpoint is unchanged"})
        with pytest.raises(ReinfError, match="could not load checkpoint x") as err:
            notify_rollback(cfg, "x")
        assert err.value.status == 409
    (path, headers, body), (path2, _, body2) = Recorder.seen[:2]
    assert path == "/api/train" and body == {}
    assert headers["Authorization"] == "Bearer s3cret-0123456789abcdef"
    assert headers["Content-Type"] == "application/json"
    assert headers["Host"] == f"127.0.0.1:{port}"  # a wildcard bind is reached on loopback
    assert path2 == "/api/rollback" and body2 == {"checkpoint_id": "base"}


def test_reinf_train_can_follow_the_servers_round_to_its_end(config, fake_server):
    port = fake_server.server_address[1]
    old = {"status": "succeeded", "run_id": 1, "finished_at": "2030-01-01T00:00:00"}
    new = {"status": "failed", "run_id": 2, "message": "timed out after 30 s",
           "trigger": "request"}
    other = {"status": "succeeded", "run_id": 3, "trigger": "ratings"}  # not ours
    Recorder.statuses = [{"schedule": {"training": False, "last_result": old}},
                         {"schedule": {"training": True, "last_result": old}},
                         {"schedule": {"training": True, "last_result": other}},
                         {"schedule": {"training": True, "last_result": new}}]
    Recorder.reply = (202, {"started": True, "trigger": "request"})
    with acquire_lock(config, host="127.0.0.1", port=port):
        out = request_train(config, wait=True, poll_seconds=0.01)
    assert out == {"started": True, "trigger": "request", "result": new}
    assert [p for p, _, _ in Recorder.seen] == ["/api/status", "/api/train", "/api/status",
                                                "/api/status", "/api/status"]
    Recorder.statuses = [{"schedule": {"training": True, "last_result": old}}]
    Recorder.reply = (409, {"error": "a round is already running", "status": 409,
                             "started": False, "reason": "a round is already running",
                             "run_id": 7})
    with acquire_lock(config, host="127.0.0.1", port=port):
        busy = request_train(config, wait=True, force=True)
    assert busy["started"] is False and busy["run_id"] == 7
    assert Recorder.seen[-1][0] == "/api/train" and Recorder.seen[-1][2] == {"force": True}
    Recorder.statuses = [{"schedule": {"next_run": "2030-01-01T00:30:00+00:00"}}]
    with acquire_lock(config, host="127.0.0.1", port=port):
        assert fetch_schedule(config) == {"next_run": "2030-01-01T00:30:00+00:00"}
    assert fetch_schedule(config) is None  # no server


def test_a_server_that_holds_the_lock_but_does_not_answer(config):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with acquire_lock(config, host="127.0.0.1", port=port):
        with pytest.raises(Unreachable, match="does not answer") as err:
            request_train(config)
        assert err.value.status == 503
        assert notify_rollback(config, "base") is False  # the store holds the choice


def test_reinf_train_reports_the_servers_round_like_a_foreground_one(config, home, invoke,
                                                                   fake_server):
    """Exit codes and --json of `reinf train` through a (fake) running server."""
    port = fake_server.server_address[1]
    failed = {"status": "failed", "run_id": 4, "trigger": "request", "exit_code": 5,
              "message": "reward hook broken: mapper.py:3: NameError", "error": "hook",
              "metrics": {"seconds": 2.0}, "checkpoint_id": None}
    Recorder.statuses = [{"schedule": {"last_result": None}},
                         {"schedule": {"training": False, "last_result": failed}}]
    Recorder.reply = (202, {"started": True, "trigger": "request"})
    with acquire_lock(config, host="127.0.0.1", port=port):
        result = invoke("train", "--json")
    assert result.exit_code == 5
    out = json.loads(result.stdout)
    assert out["status"] == "failed" and out["error"] == "hook" and out["run_id"] == 4
    assert out["daemon"]["pid"] == os.getpid() and out["daemon"]["swapped"] is False
    good = {"status": "succeeded", "run_id": 5, "trigger": "request", "swapped": True,
            "message": "round 2: checkpoint r0002 is active", "checkpoint_id": "r0002",
            "metrics": {"kl": 0.01}}
    Recorder.statuses = [{"schedule": {"last_result": failed}},
                         {"schedule": {"training": False, "last_result": good}}]
    with acquire_lock(config, host="127.0.0.1", port=port):
        result = invoke("train")
    assert result.exit_code == 0
    assert result.stdout.strip() == good["message"] and "runs there" in result.stderr
    Recorder.statuses = [{"schedule": {"last_result": good}}]
    Recorder.reply = (409, {"error": "nothing new to train on: no ratings since the last "
                             "round", "started": False, "ratings_waiting": 0,
                             "reason": "nothing new to train on: no ratings since the last "
                                       "round"})
    with acquire_lock(config, host="127.0.0.1", port=port):
        result = invoke("train", "--json")
    assert result.exit_code == 4
    assert json.loads(result.stdout)["error"] == "nothing_to_train"
    assert not (home / "train.lock").exists()  # nothing trained here


# --- finding a server ----------------------------------------------------------------------

PING = {"service": "reinf", "version": "0.1", "model": "tiny", "chat": True}


def free_port() -> int:
    """A port nothing listens on: a connection there is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Pinged(JSONHandler):
    body = PING
    seen: list = []

    def do_GET(self):  # noqa: N802 - http.server's name
        Pinged.seen.append((self.path, self.headers.get("Authorization")))
        self.answer(200 if self.path == "/api/ping" else 404, Pinged.body)


@pytest.fixture
def ping_server():
    Pinged.body, Pinged.seen = PING, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Pinged)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("host,port,url", [
    ("127.0.0.1", 8765, "http://127.0.0.1:8765"),
    ("localhost", 8765, "http://localhost:8765"),
    ("0.0.0.0", 8765, "http://127.0.0.1:8765"),  # a wildcard bind is reached on loopback
    ("::", 8765, "http://[::1]:8765"),           # on IPv6's: not every host is dual-stack
    ("::1", 8765, "http://[::1]:8765"),
    ("[::1]", 8765, "http://[::1]:8765"),        # bracketed once
    ("127.0.0.1", 49152, "http://127.0.0.1:49152"),
    ("192.168.1.20", 9000, "http://192.168.1.20:9000"),
])
def test_build_url_gives_an_address_a_client_can_connect_to(host, port, url):
    assert build_url(host, port) == url


def test_probe_is_none_at_once_when_nothing_listens():
    started = time.monotonic()
    assert probe_server(f"http://127.0.0.1:{free_port()}") is None
    assert time.monotonic() - started < 2


@pytest.mark.parametrize("body,found", [(PING, True), ({"service": "other"}, False),
                                        ({"hello": "world"}, False), ([1, 2], False)])
def test_probe_finds_only_a_server_that_answers_like_reinf(ping_server, body, found):
    Pinged.body = body
    answer = probe_server(f"http://127.0.0.1:{ping_server.server_port}/", token="s3cret-0123456789abcdef")
    assert answer == (body if found else None)
    assert Pinged.seen == [("/api/ping", "Bearer s3cret-0123456789abcdef")]


def test_find_server_tries_this_directorys_server_then_the_configured_address(config,
                                                                              ping_server):
    port = ping_server.server_port
    nowhere = config.replace(port=free_port())
    assert find_server(nowhere) is None
    with acquire_lock(nowhere, host="0.0.0.0", port=port):  # the lock says where it is
        assert find_server(nowhere) == f"http://127.0.0.1:{port}"
    configured = config.replace(host="0.0.0.0", port=port, auth_token="s3cret-0123456789abcdef")
    assert find_server(configured) == f"http://127.0.0.1:{port}"
    assert Pinged.seen[-1] == ("/api/ping", "Bearer s3cret-0123456789abcdef")
    given = f"http://127.0.0.1:{port}/"
    assert find_server(nowhere, given) == given
    assert find_server(configured, f"http://127.0.0.1:{free_port()}") is None  # only there


def test_the_train_lock_waits_only_as_long_as_asked(config):
    """One acquire_train_lock for the daemon's worker, `reinf train` and the benchmark:
    ``wait`` is how long it retries while another round holds the lock."""
    from reinf.daemon.lock import acquire_train_lock, train_lock_holder

    held = acquire_train_lock(config, trigger="schedule")
    assert held is not None and train_lock_holder(config) == os.getpid()
    started = time.monotonic()
    assert acquire_train_lock(config, trigger="manual") is None  # no wait: at once
    assert time.monotonic() - started < 0.2
    started = time.monotonic()
    assert acquire_train_lock(config, trigger="manual", wait=0.3) is None
    assert time.monotonic() - started >= 0.3
    release = threading.Timer(0.2, held.release)
    release.start()
    started = time.monotonic()
    lock = acquire_train_lock(config, trigger="manual", wait=5.0)
    release.join()
    assert lock is not None and 0.15 < time.monotonic() - started < 4.0
    assert json.loads((config.data_dir / "train.lock").read_text())["trigger"] == "manual"
    lock.release()
    assert train_lock_holder(config) == "?"  # released: the file is emptied
