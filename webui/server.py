"""The production WSGI server (waitress) for the Flask app, and a background variant for
tests and scripts.

Streaming: waitress 3 writes every chunk the app yields to the socket at once
(``send_bytes`` is 1 by default) and uses chunked encoding when a response has no
Content-Length, so each SSE event reaches the client as it is generated. A client
that disconnects makes waitress close the response iterator, which raises
GeneratorExit inside the SSE generator; that is how a browser's Stop ends generation.
"""
from __future__ import annotations

import errno
import logging
import socket
import threading

from waitress.channel import HTTPChannel
from waitress.parser import HTTPRequestParser
from waitress.server import create_server as create_waitress
from waitress.utilities import RequestEntityTooLarge

from reinf.errors import ReinfError

log = logging.getLogger("reinf.webui")

# Waitress buffers a whole request body before the app sees it. It buffers at most
# max_request_bytes + BODY_MARGIN (what the app may read, and a little more so that it can
# tell a chunked body over the limit); a body declared larger is read and thrown away, up
# to DRAIN_FACTOR times the limit, and the app answers it with its JSON 413. Beyond that
# waitress answers its own plain-text 413 at once and closes.
BODY_MARGIN = 65536
DRAIN_FACTOR = 16


class DrainingParser(HTTPRequestParser):
    """Waitress's request parser, except for a body declared (Content-Length) over the
    buffering limit: instead of answering at once and closing while the client is still
    sending (which Python's urllib and requests see as a connection reset), it reads the
    body and drops it, up to ``drain_limit`` bytes, then hands the app the request with
    an empty body. The app refuses it from its Content-Length alone (413 with Reinf's
    JSON error), and the connection stays usable."""

    drain_limit = 0
    _discard = 0

    def received(self, data: bytes) -> int:
        if self._discard:
            n = min(len(data), self._discard)
            self._discard -= n
            self.completed = self._discard == 0
            return n
        n = super().received(data)
        if (isinstance(self.error, RequestEntityTooLarge) and self.headers_finished
                and not self.chunked and 0 < self.content_length <= self.drain_limit):
            if self.body_rcv is not None:
                self.body_rcv.getbuf().close()
            self.error, self.body_rcv = None, None  # the app sees an empty body
            if self.expect_continue:
                # curl and others wait for "100 Continue" before sending a large body:
                # answer now instead, and close, since no body will follow.
                self.expect_continue = False
                self.headers["CONNECTION"] = "close"
            else:
                self._discard, self.completed = self.content_length, False
        return n


def _channel_class(drain_limit: int):
    parser = type("ReinfRequestParser", (DrainingParser,), {"drain_limit": drain_limit})
    return type("ReinfChannel", (HTTPChannel,), {"parser_class": parser})


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


def create_server(app, *, host: str, port: int, threads: int = 8, max_request_bytes: int):
    """A bound (not yet running) waitress server. A port in use is a ReinfError."""
    try:
        server = create_waitress(
            app, host=host, port=port, threads=threads, ident="reinf",
            max_request_body_size=max_request_bytes + BODY_MARGIN,
            # a streamed reply can take a while between tokens on a busy CPU
            channel_timeout=600, clear_untrusted_proxy_headers=True)
    except OSError as exc:
        raise _bind_error(exc, host, port) from None
    server.channel_class = _channel_class(max_request_bytes * DRAIN_FACTOR + BODY_MARGIN)
    return server


def format_url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


class BackgroundServer:
    """A waitress server on a thread, stoppable: for tests and the screenshot script."""

    def __init__(self, app, *, host: str = "127.0.0.1", port: int = 0, threads: int = 4,
                 max_request_bytes: int | None = None):
        limit = max_request_bytes or app.config.get("MAX_CONTENT_LENGTH") or 1_000_000
        self.server = create_server(app, host=host, port=port, threads=threads,
                                    max_request_bytes=limit)
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
            server.asyncore.loop(timeout=0.1, map=server._map, count=1)
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
