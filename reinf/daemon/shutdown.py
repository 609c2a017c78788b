"""Graceful stop of ``reinf serve`` on SIGTERM or SIGINT.

The signal handler only records the request (a handler runs between two bytecodes of the
main thread, so it must not take locks or join threads). The serving loop
(:func:`run_server`, waitress's own event loop driven one poll at a time) sees it within
``poll`` seconds and then, in order:

1. closes the listening sockets: no new connection is accepted;
2. starts the daemon's shutdown on a thread: the scheduler stops and the child trainer
   gets SIGTERM (SIGKILL after a grace period) at once, so the CPU goes to the replies;
3. keeps the event loop running until the requests in flight are answered (a streamed
   reply finishes) or ``grace_seconds`` pass; then ``stop_replies()`` cuts the replies
   still streaming (the chat service stores them ``interrupted``), and their last bytes
   are flushed;
4. stops waitress's worker threads, closes every socket, and waits for the daemon.

A second signal means "now": the child trainer's process group is killed and the process
exits at once (status 128 + signal). The lock file is released by the kernel either way.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Callable

log = logging.getLogger("reinf.daemon.shutdown")

SIGNALS = (signal.SIGTERM, signal.SIGINT)
FLUSH_SECONDS = 5.0


class Stop:
    """A request to stop: set by a signal handler or by code (tests, the UI)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.count = 0
        self._event = threading.Event()

    def request(self, signum: int | None = None) -> None:
        if self.signum is None:
            self.signum = signum
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    @property
    def reason(self) -> str:
        return signal.Signals(self.signum).name if self.signum else "requested"


def install_signal_handlers(daemon=None, *, signals=SIGNALS) -> Stop:
    """SIGTERM/SIGINT -> a graceful stop (see the module docstring); call from the main
    thread. Returns the Stop that :func:`run_server` watches."""
    stop = Stop()

    def handle(signum, frame) -> None:
        stop.count += 1
        if stop.count == 1:
            stop.request(signum)
            return
        # Second signal: the person wants out now. The trainer runs in its own process
        # group, so it would survive us; kill it first.
        if daemon is not None:
            daemon.kill_child()
        os._exit(128 + signum)

    for signum in signals:
        signal.signal(signum, handle)
    return stop


def run_server(server, stop: Stop, *, daemon=None, grace_seconds: float = 10.0,
               stop_replies: Callable[[], None] | None = None,
               shutdown_timeout: float = 30.0, poll: float = 0.2) -> None:
    """Serve a bound waitress server (``waitress.server.create_server``) until ``stop``;
    then stop gracefully (module docstring). Returns when everything is down."""
    from waitress import wasyncore
    from waitress.channel import HTTPChannel
    from waitress.server import BaseWSGIServer

    socket_map = getattr(server, "_map", None)
    if socket_map is None:
        socket_map = server.map  # MultiSocketServer (several listening sockets)

    def step() -> None:
        wasyncore.loop(timeout=poll, map=socket_map, count=1,  # poll: past 1023 descriptors
                       use_poll=getattr(getattr(server, "adj", None), "asyncore_use_poll",
                                        False))

    def in_flight() -> bool:
        return any(isinstance(ch, HTTPChannel) and (ch.requests or ch.total_outbufs_len)
                   for ch in list(socket_map.values()))

    def drain(seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while in_flight() and time.monotonic() < deadline:
            step()
        return not in_flight()

    try:
        while not stop.is_set():
            step()
    except KeyboardInterrupt:  # no handlers installed: Ctrl+C still stops gracefully
        stop.request(signal.SIGINT)
    log.info("stopping (%s): finishing replies in flight", stop.reason)
    stopper = None
    if daemon is not None:
        stopper = threading.Thread(target=daemon.shutdown, args=(shutdown_timeout,),
                                   name="reinf-daemon-stop", daemon=True)
        stopper.start()
    for listener in [d for d in socket_map.values() if isinstance(d, BaseWSGIServer)]:
        wasyncore.dispatcher.close(listener)  # keeps waitress's trigger for the workers
    if not drain(grace_seconds) and stop_replies is not None:
        log.warning("replies still running after %.0f s: cutting them", grace_seconds)
        stop_replies()
        drain(FLUSH_SECONDS)
    server.task_dispatcher.shutdown(timeout=FLUSH_SECONDS)
    wasyncore.close_all(socket_map)
    if stopper is not None:
        stopper.join(shutdown_timeout + FLUSH_SECONDS)
    log.info("server stopped")
