"""The production WSGI server (waitress) for the Flask app, and a background variant for
tests and scripts.

Streaming: waitress 3 writes every chunk the app yields to the socket at once
(``send_bytes`` is 1 by default) and uses chunked encoding when a response has no
Content-Length, so each SSE event reaches the client as it is generated. A client
that disconnects makes waitress close the response iterator, which raises
GeneratorExit inside the SSE generator; that is how a browser's Stop ends generation.

Connections: waitress stops accepting at ``connection_limit``, and by default closes a
connection only after ``channel_timeout`` (here 600 s, for slow streaming clients) without
activity. 120 connections that never finished their headers held the server shut. Here a
connection that has no complete request (it is idle, its request head is still arriving,
or its body stalls) is closed after ``header_timeout`` seconds; one whose request is being answered
(a reply streaming) is never cut by that; and the limit is ``server.connection_limit``.
"""
from __future__ import annotations

import errno
import json
import logging
import select
import socket
import threading
import time
import types

from waitress.channel import HTTPChannel
from waitress.parser import HTTPRequestParser
from waitress.task import ErrorTask
from waitress.server import create_server as create_waitress
from waitress.utilities import RequestEntityTooLarge

from reinf.errors import ReinfError

log = logging.getLogger("reinf.webui")

# Waitress buffers a whole request body before the app sees it. It buffers at most
# max_request_bytes + BODY_MARGIN (what the app may read, and a little more so that it can
# tell a chunked body over the limit); a larger body, declared (Content-Length) or found
# while a chunked one arrives, is read and thrown away, up to DRAIN_FACTOR times the limit,
# and the app answers it with its JSON 413 naming max_request_bytes. Beyond that the app
# answers the same JSON 413 at once and the connection closes (never waitress's plain text).
BODY_MARGIN = 65536
DRAIN_FACTOR = 16
HEADER_TIMEOUT_SECONDS = 15.0
BODY_TIMEOUT_FACTOR = 4   # a request body has 4 x header_timeout from the request's first byte
CONNECTION_LIMIT = 200
# Waitress logs "Task queue depth is N" for every request queued behind busy threads: 8,254
# lines in 121 s under load. One line per this many seconds, with a count of the others.
QUEUE_WARNING_SECONDS = 60.0
# select() cannot watch descriptors above 1023; poll() can, so the limit may exceed it.
USE_POLL = hasattr(select, "poll")


class Discarded:
    """A body buffer that keeps nothing: a chunked body over the limit is parsed (to find
    where it ends) and dropped."""

    def __init__(self, size: int = 0):
        self.size = size

    def append(self, data: bytes) -> None:
        self.size += len(data)

    def __len__(self) -> int:
        return self.size


class DrainingParser(HTTPRequestParser):
    """Waitress's request parser, except for a body over the buffering limit: instead of
    answering its own plain-text 413 at once and closing while the client is still sending
    (which Python's urllib and requests see as a connection reset), it reads the body and
    drops it, up to ``drain_limit`` bytes, then hands the app the request with an empty
    body and a Content-Length over the limit (for a chunked body, the bytes it carried).
    The app refuses it from that Content-Length alone (413 with Reinf's JSON error naming
    max_request_bytes), and the connection stays usable. A body past ``drain_limit`` gets
    the same JSON 413 without waiting for the rest, and the connection closes."""

    drain_limit = 0
    _discard = 0
    _draining_chunks = False

    def __init__(self, adj):
        super().__init__(adj)
        self.started = time.time()  # when its first byte arrived: see close_waiting

    def received(self, data: bytes) -> int:
        if self._discard:
            n = min(len(data), self._discard)
            self._discard -= n
            self.completed = self._discard == 0
            return n
        if self._draining_chunks:
            return self._drain_chunks(data)
        n = super().received(data)
        if not (isinstance(self.error, RequestEntityTooLarge) and self.headers_finished):
            return n
        if self.chunked:
            # Over the limit while a chunked body arrives: go on parsing it, keeping nothing.
            self.body_rcv.getbuf().close()
            self.body_rcv.buf = Discarded(self.body_bytes_received)
            self.error, self.completed, self._draining_chunks = None, False, True
            self._check_chunks()
        elif 0 < self.content_length <= self.drain_limit:
            self._refuse_to_app()
            if self.expect_continue:
                # curl and others wait for "100 Continue" before sending a large body:
                # answer now instead, and close, since no body will follow.
                self.expect_continue = False
                self.headers["CONNECTION"] = "close"
            else:
                self._discard, self.completed = self.content_length, False
        else:  # declared far past the limit: answer at once, and close
            self._refuse_to_app(close=True)
        return n

    def _drain_chunks(self, data: bytes) -> int:
        n = self.body_rcv.received(data)
        self.body_bytes_received += n
        self._check_chunks()
        return n

    def _check_chunks(self) -> None:
        """End a dropped chunked body: when it is whole, or bad, or past drain_limit."""
        receiver = self.body_rcv
        if receiver.error is not None:  # garbage in the chunk framing: waitress's 400
            self.error, self.completed, self._draining_chunks = receiver.error, True, False
        elif receiver.completed:
            self._refuse_to_app(length=len(receiver.buf))
        elif self.body_bytes_received > self.drain_limit:
            self._refuse_to_app(length=len(receiver.buf), close=True)

    def _refuse_to_app(self, *, length: int | None = None, close: bool = False) -> None:
        """Hand the app this request with an empty body; its Content-Length (``length``, for
        a chunked body) is over max_request_bytes, so the app answers its JSON 413."""
        if self.body_rcv is not None and not isinstance(getattr(self.body_rcv, "buf", None),
                                                        Discarded):
            self.body_rcv.getbuf().close()
        self.error, self.body_rcv, self.completed = None, None, True
        self._draining_chunks = False
        if length is not None:
            self.headers["CONTENT_LENGTH"] = str(length)
        if close:
            self.expect_continue = False
            self.headers["CONNECTION"] = "close"


class JsonErrorTask(ErrorTask):
    """Waitress's answer to a request it cannot parse (a malformed start line, header,
    Content-Length or chunk; headers too large), in Reinf's JSON error shape instead of
    waitress's plain text: the app never sees such a request, so this is the only place
    that can answer it."""

    def execute(self) -> None:
        error = self.request.error
        message, fix = f"malformed HTTP request: {error.body}", "send a well-formed HTTP/1.1 request"
        path = getattr(self.request, "path", None) or _target(self.request)
        if path == "/v1" or path.startswith("/v1/"):  # OpenAI's shape, as webui/errors.py
            answer = {"error": {"message": message, "type": "invalid_request_error",
                                "code": error.code, "param": None, "fix": fix}}
        else:
            answer = {"error": message, "status": error.code, "fix": fix}
        body = json.dumps(answer).encode("utf-8")
        self.status = f"{error.code} {error.reason}"
        self.response_headers.append(("Content-Type", "application/json"))
        self.set_close_on_finish()
        self.content_length = len(body)
        self.write(body)


def _target(parser) -> str:
    """The request target of a start line waitress refused before it set ``path`` (a
    malformed method, a bad header): its second word, or ""."""
    words = (getattr(parser, "first_line", None) or b"").split()
    return words[1].decode("latin-1") if len(words) > 1 else ""


def _channel_class(drain_limit: int):
    parser = type("ReinfRequestParser", (DrainingParser,), {"drain_limit": drain_limit})
    return type("ReinfChannel", (HTTPChannel,), {"parser_class": parser,
                                                  "error_task_class": JsonErrorTask})


def _bind_error(exc: OSError, host: str, port: int) -> ReinfError:
    if exc.errno == errno.EADDRINUSE:
        return ReinfError(f"port {port} on {host} is already in use",
                          fix="stop the other server (is `reinf serve` already running?) "
                              "or pick another with --port")
    if exc.errno == errno.EADDRNOTAVAIL:
        return ReinfError(f"cannot bind to {host}: no such address on this machine",
                          fix="use 127.0.0.1, or an address this machine has")
    return ReinfError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                      fix="pick another --host/--port")


def check_port(host: str, port: int) -> None:
    """Fail early (before a slow model load) when ``host``:``port`` cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as waitress does
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise _bind_error(exc, host, port) from None


def close_waiting(server, now: float) -> None:
    """Replaces waitress's ``maintenance``: close the connections that have no complete
    request after ``server.header_timeout`` seconds (counted from their last activity when
    idle, from the first byte of a request head still arriving, so a head sent one byte
    at a time cannot hold a connection). A request body still arriving gets the same
    ``header_timeout`` between two of its bytes, and ``BODY_TIMEOUT_FACTOR`` times it from
    the request's first byte in all (a body is at most ``max_request_bytes``; 200 bodies
    that never finished held the server shut for waitress's ``channel_timeout``, 600 s).
    A request being answered is left alone."""
    limit = server.header_timeout
    for channel in list(server.active_channels.values()):
        if channel.requests:
            continue  # being answered: a reply may stream for minutes
        parser = channel.request
        started = getattr(parser, "started", channel.last_activity) if parser is not None \
            else channel.last_activity
        if parser is not None and parser.headers_finished:
            stalled = channel.last_activity < now - limit \
                or started < now - BODY_TIMEOUT_FACTOR * limit
        else:
            stalled = started < now - limit
        if stalled:
            channel.will_close = True


class EveryFewSeconds(logging.Filter):
    """Let one record through per ``seconds``; the next one that passes says how many were
    held back meanwhile."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds
        self.last = float("-inf")
        self.held = 0
        self.lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        with self.lock:
            now = time.monotonic()
            if now - self.last < self.seconds:
                self.held += 1
                return False
            if self.held:
                record.msg = f"{record.msg} ({self.held} more such warnings held back)"
            self.last, self.held = now, 0
            return True


def quiet_queue_warnings(seconds: float = QUEUE_WARNING_SECONDS) -> None:
    queue_log = logging.getLogger("waitress.queue")
    if not any(isinstance(f, EveryFewSeconds) for f in queue_log.filters):
        queue_log.addFilter(EveryFewSeconds(seconds))


def create_server(app, *, host: str, port: int, threads: int = 8, max_request_bytes: int,
                  header_timeout: float = HEADER_TIMEOUT_SECONDS,
                  connection_limit: int = CONNECTION_LIMIT):
    """A bound (not yet running) waitress server. A port in use is a ReinfError."""
    quiet_queue_warnings()
    try:
        server = create_waitress(
            app, host=host, port=port, threads=threads, ident="reinf",
            max_request_body_size=max_request_bytes + BODY_MARGIN,
            # a streamed reply can take a while between tokens on a busy CPU, and a slow
            # client may take a while to read it
            channel_timeout=600, clear_untrusted_proxy_headers=True,
            connection_limit=connection_limit, asyncore_use_poll=USE_POLL,
            # close_waiting runs this often
            cleanup_interval=max(1, min(30, int(header_timeout / 3))))
    except OSError as exc:
        raise _bind_error(exc, host, port) from None
    server.channel_class = _channel_class(max_request_bytes * DRAIN_FACTOR + BODY_MARGIN)
    server.header_timeout = header_timeout
    server.maintenance = types.MethodType(close_waiting, server)
    return server


def format_url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


class BackgroundServer:
    """A waitress server on a thread, stoppable: for tests and the screenshot script."""

    def __init__(self, app, *, host: str = "127.0.0.1", port: int = 0, threads: int = 4,
                 max_request_bytes: int | None = None,
                 header_timeout: float = HEADER_TIMEOUT_SECONDS,
                 connection_limit: int = CONNECTION_LIMIT):
        limit = max_request_bytes or app.config.get("MAX_CONTENT_LENGTH") or 1_000_000
        self.server = create_server(app, host=host, port=port, threads=threads,
                                    max_request_bytes=limit, header_timeout=header_timeout,
                                    connection_limit=connection_limit)
        self.host = host
        self.port = self.server.effective_port
        self.url = format_url(host, self.port).rstrip("/")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="reinf-http", daemon=True)

    def _loop(self) -> None:
        # One poll at a time, so stop() takes effect within a fraction of a second
        # and the sockets are closed by the thread that polls them.
        server = self.server
        while not self._stop.is_set():
            server.asyncore.loop(timeout=0.1, map=server._map, count=1, use_poll=USE_POLL)
        server.task_dispatcher.shutdown(timeout=5)
        server.asyncore.close_all(server._map)

    def start(self) -> "BackgroundServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
