"""The WSGI server under connections that never finish a request, and under load.

120 connections that never finished their headers held the server shut (waitress's limit
was 100 and it waited 600 s on each); waitress's "Task queue depth" warning wrote 8,254
lines in 121 s.
"""
from __future__ import annotations

import logging
import socket
import time
import urllib.request

import pytest
from flask import Flask, Response

from webui.server import BackgroundServer, EveryFewSeconds, quiet_queue_warnings


@pytest.fixture
def slow_app():
    app = Flask("slow")

    @app.get("/ping")
    def ping():
        return {"ok": True}

    @app.get("/stream")
    def stream():
        def chunks():
            for i in range(6):  # 3 s in all: longer than the header timeout below
                time.sleep(0.5)
                yield f"chunk {i}\n"
        return Response(chunks(), mimetype="text/plain")
    return app


def get(url: str, timeout: float = 5.0) -> bytes:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as response:
        return response.read()


def closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(0.2)
    try:
        return sock.recv(1) == b""
    except socket.timeout:
        return False
    except OSError:
        return True


def test_half_open_connections_are_closed_and_the_server_accepts_again(slow_app):
    with BackgroundServer(slow_app, header_timeout=1.0, connection_limit=10) as server:
        stuck = []
        for i in range(14):  # more than the limit: half send part of a head, half nothing
            sock = socket.create_connection(("127.0.0.1", server.port))
            if i % 2:
                sock.sendall(b"GET /ping HTTP/1.1\r\nHost: local")
            stuck.append(sock)
        time.sleep(0.5)
        for sock in stuck[::2]:  # a head that trickles in a byte at a time does not help
            sock.sendall(b"G")
        started = time.monotonic()
        assert get(server.url + "/ping", timeout=10) == b'{"ok":true}\n'
        assert time.monotonic() - started < 6  # not channel_timeout (600 s)
        deadline = time.monotonic() + 5
        while not all(closed_by_server(s) for s in stuck) and time.monotonic() < deadline:
            pass
        assert all(closed_by_server(s) for s in stuck)
        for sock in stuck:
            sock.close()


def test_a_streaming_reply_outlives_the_header_timeout(slow_app):
    with BackgroundServer(slow_app, header_timeout=1.0) as server:
        body = get(server.url + "/stream", timeout=10).decode()
        assert body.splitlines() == [f"chunk {i}" for i in range(6)]


def test_the_limits_come_from_the_config(config):
    from reinf.config import load_config

    cfg = load_config(environ={"REINF_HOME": str(config.data_dir),
                               "REINF_CONNECTION_LIMIT": "500",
                               "REINF_REQUEST_HEADER_TIMEOUT_SECONDS": "5"})
    assert (cfg.server.connection_limit, cfg.server.request_header_timeout_seconds) == (500, 5.0)
    from webui.server import create_server
    server = create_server(Flask("x"), host="127.0.0.1", port=0, max_request_bytes=10_000,
                           header_timeout=5.0, connection_limit=500)
    try:
        assert server.adj.connection_limit == 500 and server.header_timeout == 5.0
        assert server.adj.cleanup_interval <= 5
    finally:
        server.close()


def test_the_task_queue_warning_is_rate_limited(caplog, monkeypatch):
    import webui.server

    quiet_queue_warnings()
    quiet_queue_warnings()  # once only
    log = logging.getLogger("waitress.queue")
    [limiter] = [f for f in log.filters if isinstance(f, EveryFewSeconds)]
    clock = [1000.0]
    monkeypatch.setattr(webui.server.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(limiter, "last", float("-inf"))
    monkeypatch.setattr(limiter, "held", 0)  # an earlier test's server may have left a count
    with caplog.at_level(logging.WARNING, logger="waitress.queue"):
        for depth in range(500):
            log.warning("Task queue depth is %d", depth)
        clock[0] += limiter.seconds
        log.warning("Task queue depth is %d", 7)
    lines = [r.getMessage() for r in caplog.records if r.name == "waitress.queue"]
    assert lines == ["Task queue depth is 0",
                     "Task queue depth is 7 (499 more such warnings held back)"]


@pytest.mark.parametrize("request_bytes,reason", [
    (b"get /ping HTTP/1.1\r\nHost: x\r\n\r\n", "Malformed HTTP method"),
    (b"GET\x00 /ping HTTP/1.1\r\nHost: x\r\n\r\n", "Start line is invalid"),
    (b"POST /ping HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", "Content-Length"),
    (b"POST /ping HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
     "chunk"),
])
def test_a_request_waitress_cannot_parse_gets_a_json_error(slow_app, request_bytes, reason):
    """Waitress answers these itself (the app never sees them): the answer is Reinf's JSON
    error, not waitress's plain text, and the server goes on answering."""
    import json

    with BackgroundServer(slow_app) as server:
        with socket.create_connection((server.host, server.port), timeout=5) as sock:
            sock.sendall(request_bytes)
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.split(b"\r\n")[0].endswith(b" 400 Bad Request")
        assert b"Content-Type: application/json" in head
        error = json.loads(body)
        assert error["status"] == 400 and reason in error["error"] and error["fix"]
        assert json.loads(get(server.url + "/ping")) == {"ok": True}


def test_requests_whose_body_never_finishes_are_closed_too(slow_app):
    """Complete headers, then a body that never comes (or trickles): the adversarial pass
    held the server shut for 600 s (waitress's channel_timeout) with 210 of them. They get
    header_timeout between bytes, and 4 x header_timeout in all."""
    head = (b"POST /ping HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{\"force\": ")
    with BackgroundServer(slow_app, header_timeout=1.0, connection_limit=10) as server:
        stuck = []
        for _ in range(12):  # more than the limit
            sock = socket.create_connection(("127.0.0.1", server.port))
            sock.sendall(head)
            stuck.append(sock)
        trickle = socket.create_connection(("127.0.0.1", server.port))
        trickle.sendall(head)
        started = time.monotonic()
        while time.monotonic() - started < 6 and not closed_by_server(trickle):
            trickle.sendall(b" ")  # a byte every 0.2 s: never idle for the timeout
        assert time.monotonic() - started < 6  # closed at 4 x header_timeout
        assert get(server.url + "/ping", timeout=10) == b'{"ok":true}\n'
        assert all(closed_by_server(s) for s in stuck)
        for sock in stuck + [trickle]:
            sock.close()


@pytest.mark.parametrize("request_bytes,reason", [
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
     "Content-Length"),
    (b"get /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", "Malformed HTTP method"),
    (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nContent-Type: a\x00b\r\n\r\n", "header"),
])
def test_a_v1_request_waitress_cannot_parse_gets_openais_error_shape(slow_app, request_bytes,
                                                                     reason):
    import json

    with BackgroundServer(slow_app) as server:
        with socket.create_connection((server.host, server.port), timeout=5) as sock:
            sock.sendall(request_bytes)
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
    error = json.loads(data.partition(b"\r\n\r\n")[2])["error"]
    assert reason in error["message"] and error["code"] == 400
