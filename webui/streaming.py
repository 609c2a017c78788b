"""Streaming replies: the registry of replies in progress and the SSE encoding.

A reply in progress is a ChatStream (reinf.serving.chat): iterating it yields text deltas, the
turn is stored when it ends, and ``.stop()`` ends it early (stored as interrupted).
Each stream gets an id so that ``POST /api/chat/<stream_id>/stop`` can stop it from
another request; a client that simply disconnects stops it too (GeneratorExit).
"""
from __future__ import annotations

import json
import logging
import threading
import uuid
from typing import Any, Callable, Iterator

from reinf.errors import ReinfError

log = logging.getLogger("reinf.webui")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(data: Any, event: str | None = None) -> str:
    """One Server-Sent Event. JSON never contains a raw newline, so one data line."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n"


def new_stream_id() -> str:
    """A stream id: 32 hex digits (the form Store.resolve_turn accepts after chatcmpl-stream-)."""
    return uuid.uuid4().hex


class Streams:
    """Replies being generated, by stream id."""

    def __init__(self):
        self._lock = threading.Lock()
        self._active: dict[str, Any] = {}

    def add(self, stream, stream_id: str | None = None) -> str:
        """Register ``stream``; ``stream_id`` when the caller chose it before it started."""
        stream_id = stream_id or new_stream_id()
        with self._lock:
            self._active[stream_id] = stream
        return stream_id

    def remove(self, stream_id: str) -> None:
        with self._lock:
            self._active.pop(stream_id, None)

    def stop(self, stream_id: str) -> bool:
        with self._lock:
            stream = self._active.get(stream_id)
        if stream is None:
            return False
        stream.stop()
        return True

    def stop_all(self) -> int:
        """Stop every reply in progress (server shutdown); returns how many."""
        with self._lock:
            active = list(self._active.values())
        for stream in active:
            stream.stop()
        return len(active)

    def __len__(self) -> int:
        return len(self._active)


def finish(stream) -> None:
    """Stop a stream whose reader went away, and let it run to its end so the partial
    reply is stored (as interrupted)."""
    try:
        stream.stop()
        for _ in stream:
            pass
    except Exception:  # noqa: BLE001 - the reader is gone; log and move on
        log.exception("could not finish an abandoned reply")


class Relay:
    """The response body of a streamed reply: drives ``stream`` and encodes each part
    with the given functions.

    Generation errors after the response has started cannot change the status code; they
    become an error event. A client that goes away makes the WSGI server close this
    iterable (GeneratorExit inside, then ``close()``), which stops generation; the chat
    service stores the partial reply as interrupted.
    """

    def __init__(self, stream, streams: Streams, stream_id: str, *,
                 start: Callable[[], str | None], delta: Callable[[str], str],
                 done: Callable[[Any], str | list[str]], error: Callable[[dict], str]):
        self.stream, self.streams, self.stream_id = stream, streams, stream_id
        self.encode = {"start": start, "delta": delta, "done": done, "error": error}
        self.finished = False
        self._events = self._run()

    def __iter__(self) -> Iterator[str]:
        return self._events

    def _run(self) -> Iterator[str]:
        encode = self.encode
        try:
            first = encode["start"]()
            if first:
                yield first
            for text in self.stream:
                if text:
                    yield encode["delta"](text)
            self.finished = True
            out = encode["done"](self.stream.turn)
            yield from ([out] if isinstance(out, str) else out)
        except ReinfError as exc:
            self.finished = True
            yield encode["error"](exc.to_dict())
        except GeneratorExit:
            raise
        except Exception as exc:  # noqa: BLE001 - the boundary of a streamed response
            self.finished = True
            log.exception("reply generation failed")
            yield encode["error"]({"error": f"generation failed ({type(exc).__name__}: {exc})",
                                   "status": 500})
        finally:
            self._cleanup()

    def _cleanup(self) -> None:
        self.streams.remove(self.stream_id)
        if not self.finished:
            self.finished = True
            finish(self.stream)

    def close(self) -> None:
        """Called by the WSGI server when the response ends or the client leaves (even
        before the first event was sent)."""
        try:
            self._events.close()
        except ValueError:  # closed from inside its own run: the finally block cleans up
            pass
        self._cleanup()
