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

from waitress.server import create_server as create_waitress

from reinf.errors import ReinfError

log = logging.getLogger("reinf.webui")

# Waitress buffers a whole request body before the app sees it; it refuses bodies far
# beyond Flask's own limit itself, so a huge upload never fills the disk.
WAITRESS_BODY_SLACK = 4


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
        return create_waitress(
            app, host=host, port=port, threads=threads, ident="reinf",
            max_request_body_size=max_request_bytes * WAITRESS_BODY_SLACK + 65536,
            # a streamed reply can take a while between tokens on a busy CPU
            channel_timeout=600, clear_untrusted_proxy_headers=True)
    except OSError as exc:
        raise _bind_error(exc, host, port) from None


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
