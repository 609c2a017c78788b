"""SIGTERM / SIGINT on a real waitress server in a real process: the reply in flight
finishes (or is cut after the grace period), no new connection is taken, the daemon is
shut down, and a second signal exits at once."""
from __future__ import annotations

import http.client
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

SERVER = textwrap.dedent("""
    import sys, threading, time
    from waitress.server import create_server
    from reinf.daemon.shutdown import install_signal_handlers, run_server

    chunks, grace = int(sys.argv[1]), float(sys.argv[2])
    cut = threading.Event()

    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        if environ["PATH_INFO"] != "/slow":
            return [b"ok"]
        def stream():
            for i in range(chunks):
                if cut.is_set():
                    yield b"cut\\n"
                    return
                yield f"{i}\\n".encode()
                time.sleep(0.2)
            yield b"end\\n"
        return stream()

    class Daemon:
        def shutdown(self, timeout):
            print("daemon shutdown", flush=True)
        def kill_child(self):
            print("child killed", flush=True)

    server = create_server(app, host="127.0.0.1", port=0, threads=2)
    daemon = Daemon()
    stop = install_signal_handlers(daemon)
    print("ready", server.effective_port, flush=True)
    run_server(server, stop, daemon=daemon, grace_seconds=grace, stop_replies=cut.set)
    print("stopped", stop.reason, flush=True)
""")


def start(chunks: int, grace: float):
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(chunks), str(grace)],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().split()
    assert line[0] == "ready", line
    return proc, int(line[1])


def stream_in_background(port: int):
    """GET /slow on a thread; returns (first chunk received event, result dict)."""
    first, result = threading.Event(), {}

    def read():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/slow")
        response = conn.getresponse()
        body = response.read1(64)
        first.set()
        while True:
            try:
                more = response.read1(64)
            except http.client.IncompleteRead as exc:
                body += exc.partial
                result["incomplete"] = True
                break
            if not more:
                break
            body += more
        result["body"] = body.decode()
        conn.close()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return first, result, thread


def eventually(check, timeout: float) -> bool:
    """Poll ``check`` until it is true or ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def refused(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return False
    except ConnectionRefusedError:
        return True


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_the_reply_in_flight_finishes_and_new_connections_are_refused(signum):
    proc, port = start(chunks=10, grace=15)
    try:
        first, result, thread = stream_in_background(port)
        assert first.wait(10)
        proc.send_signal(signum)
        assert eventually(lambda: refused(port), 5)  # within a few polls of the serving loop
        thread.join(20)
        assert result["body"].endswith("8\n9\nend\n") and "incomplete" not in result
        out, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0
        assert "daemon shutdown" in out and f"stopped {signal.Signals(signum).name}" in out
    finally:
        proc.kill()
        proc.communicate()


def test_a_reply_longer_than_the_grace_period_is_cut_cleanly():
    proc, port = start(chunks=200, grace=0.5)
    try:
        first, result, thread = stream_in_background(port)
        assert first.wait(10)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        thread.join(20)
        assert result["body"].endswith("cut\n") and "incomplete" not in result
        proc.communicate(timeout=20)
        assert proc.returncode == 0 and time.monotonic() - started < 10
    finally:
        proc.kill()
        proc.communicate()


def test_a_second_signal_exits_at_once_and_kills_the_child():
    proc, port = start(chunks=200, grace=60)
    try:
        first, result, thread = stream_in_background(port)
        assert first.wait(10)
        proc.send_signal(signal.SIGINT)
        assert eventually(lambda: refused(port), 5)  # the first signal was handled ...
        assert proc.poll() is None and thread.is_alive()  # ... and the reply goes on
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=10)
        assert proc.returncode == 128 + signal.SIGINT
        assert "child killed" in out and "stopped" not in out
    finally:
        proc.kill()
        proc.communicate()
