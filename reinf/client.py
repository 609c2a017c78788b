"""The HTTP client of a running ``reinf serve``: the REPL backend behind ``reinf chat``
when a daemon answers, so the terminal and the browser share one model and one DB.

``HttpBackend(url, config)`` implements ``reinf.cli.repl.Backend`` over the JSON API
(docs/api.md): replies stream as Server-Sent Events from ``POST /api/chat``; Stop is
``POST /api/chat/<stream_id>/stop``, after which the server still sends the stored,
interrupted turn. Every request goes through reinf.daemon.remote.send_request (standard library
only, never through a proxy: the daemon is local). Errors from the server arrive as
ReinfError with its message, fix and status.
"""
from __future__ import annotations

import json
import queue
import threading
from typing import Any, Iterator

from reinf.daemon.remote import send_request
from reinf.errors import ReinfError

REPLY_TIMEOUT_SECONDS = 600.0   # longest silence between two events of a streamed reply
CALL_TIMEOUT_SECONDS = 30.0
GENERATION_FIELDS = ("temperature", "top_p", "max_new_tokens")  # what POST /api/chat takes


class HttpBackend:
    """``reinf.cli.repl.Backend`` over HTTP."""

    def __init__(self, url: str, config=None, *, token: str | None = None,
                 generation: dict[str, Any] | None = None):
        self.url = url.rstrip("/")
        self.token = token if token is not None else (
            config.server.auth_token if config is not None else None)
        # generation settings sent with every message (e.g. the --temperature flag);
        # without them the server's own config applies
        self.generation = {k: v for k, v in (generation or {}).items()
                           if k in GENERATION_FIELDS and v is not None}

    # --- plumbing ----------------------------------------------------------------------

    def request(self, method: str, path: str, body: dict | None = None, *,
                timeout: float = CALL_TIMEOUT_SECONDS, stream: bool = False):
        """``reinf.daemon.remote.send_request`` to this server: its JSON answer, or the open event
        stream; no answer at all is a ReinfError (503) that says so."""
        try:
            return send_request(self.url, path, body, method=method, token=self.token,
                                timeout=timeout, stream=stream)
        except OSError as exc:  # urllib's URLError is an OSError
            reason = getattr(exc, "reason", exc)
            raise ReinfError(f"cannot reach reinf serve at {self.url}: {reason}", status=503,
                             fix="is it still running? `reinf status` tells") from None

    # --- the Backend protocol ----------------------------------------------------------

    def describe(self) -> str:
        status = self.request("GET", "/api/status")
        model = status.get("model", {})
        name = model.get("model_name") or model.get("model_path", "?")
        return f"{name} via {self.url}, checkpoint {status.get('active_checkpoint', 'base')}"

    def send_stream(self, message: str, conversation_id: int | None, *,
                    system_prompt: str | None = None) -> "HttpReply":
        body: dict[str, Any] = {"message": message, "stream": True, **self.generation}
        if conversation_id is not None:
            body["conversation_id"] = conversation_id
        if system_prompt is not None:
            body["system_prompt"] = system_prompt
        response = self.request("POST", "/api/chat", body, stream=True,
                                timeout=REPLY_TIMEOUT_SECONDS)
        return HttpReply(self, response)

    def rate(self, turn_id: int, score: int, tags: list[str]) -> dict:
        return self.request("PUT", f"/api/turns/{int(turn_id)}/rating",
                            {"score": score, "tags": list(tags)})

    def undo(self, turn_id: int | None = None) -> dict | None:
        ref = "last" if turn_id is None else str(int(turn_id))
        return self.request("DELETE", f"/api/turns/{ref}/rating")["removed"]

    def rewrite(self, turn_id: int, text: str) -> dict:
        return self.request("PUT", f"/api/turns/{int(turn_id)}/rewrite", {"text": text})

    def history(self, conversation_id: int, limit: int = 20) -> list[dict]:
        data = self.request("GET", f"/api/conversations/{int(conversation_id)}")
        return data["turns"][-limit:]

    def conversation(self, conversation_id: int) -> dict:
        """The conversation (``ConversationRecord.to_dict()``: turns, system_prompt, ...)."""
        return self.request("GET", f"/api/conversations/{int(conversation_id)}")["conversation"]

    def new_conversation(self) -> int | None:
        return None  # the server creates it with its first message

    def forget(self, turn_id: int) -> None:
        self.request("DELETE", f"/api/turns/{int(turn_id)}")

    def send_again(self, turn_id: int) -> "HttpReply":
        response = self.request("POST", f"/api/turns/{int(turn_id)}/again",
                                {"stream": True, **self.generation}, stream=True,
                                timeout=REPLY_TIMEOUT_SECONDS)
        return HttpReply(self, response)

    def pick(self, turn_id: int) -> dict:
        return self.request("POST", f"/api/turns/{int(turn_id)}/pick", {})

    # --- reinf compare -----------------------------------------------------------------

    def compare(self, prompt: str, *, checkpoint: str | None = None, blind: bool = True) -> dict:
        """``POST /api/compare``: the comparison (compare_id, replies by slot, blind)."""
        body: dict[str, Any] = {"prompt": prompt, "blind": blind, **self.generation}
        if checkpoint is not None:
            body["checkpoint"] = checkpoint
        return self.request("POST", "/api/compare", body, timeout=REPLY_TIMEOUT_SECONDS)

    def pick_compare(self, compare_id: str, winner: str) -> dict:
        """``POST /api/compare/<id>/pick``: the comparison revealed, with its stored pairs."""
        return self.request("POST", f"/api/compare/{compare_id}/pick",
                            {"winner": winner, "reveal": True})


class HttpReply:
    """A reply streaming from the server (``reinf.cli.repl.ReplyHandle``).

    A thread reads the event stream into a queue, so Ctrl-C in the terminal interrupts
    only the waiting, never the reading: after ``stop()`` the server still sends the
    stored (interrupted) turn and ``result()`` gets it.
    """

    _END = object()

    def __init__(self, backend: HttpBackend, response):
        self.backend = backend
        self.response = response
        self.stream_id: str | None = None
        self.done: dict | None = None
        self.error: ReinfError | None = None
        self.shown: str | None = None   # what the person saw, when stop() was told
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._read, name="reinf-http-reply",
                                        daemon=True)
        self._thread.start()
        start = self._next()  # the conversation id is known up front
        if start is None or start[0] != "start":
            self.close()
            raise self.error or ReinfError("reinf serve sent no reply", status=502)
        self.conversation_id = start[1]["conversation_id"]
        self.stream_id = start[1].get("stream_id")

    def _read(self) -> None:
        event, data = "message", []
        try:
            for raw in self.response:
                line = raw.decode("utf-8").rstrip("\r\n")
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip(" "))
                elif not line and data:
                    payload = json.loads("\n".join(data))
                    if event == "done":
                        self.done = payload
                    elif event == "error":
                        self.error = ReinfError(payload.get("error", "the reply failed"),
                                                fix=payload.get("fix"),
                                                status=payload.get("status") or 500)
                    self._queue.put((event, payload))
                    event, data = "message", []
        except (OSError, ValueError) as exc:
            self.error = ReinfError(f"the connection to reinf serve broke: {exc}", status=502)
        finally:
            self.close()
            self._ended.set()
            self._queue.put(self._END)

    def _next(self) -> tuple[str, dict] | None:
        while True:
            try:  # a timeout keeps the wait interruptible by Ctrl-C everywhere
                item = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            if item is self._END:
                self._queue.put(self._END)  # stay ended for later callers
                return None
            return item

    def __iter__(self) -> Iterator[str]:
        while (item := self._next()) is not None:
            event, payload = item
            if event == "message" and isinstance(payload.get("delta"), str):
                yield payload["delta"]
            elif event == "error":
                raise self.error

    def stop(self, shown: str | None = None) -> None:
        """End the reply early. ``shown``: the text the person saw; the server generates
        ahead of the screen, so once the turn is stored ``result()`` cuts it to that text
        (``POST /api/turns/<id>/cut``), as the local backend does."""
        if shown is not None:
            self.shown = shown
        if self.done is not None or self.stream_id is None or self._ended.is_set():
            return
        try:
            self.backend.request("POST", f"/api/chat/{self.stream_id}/stop")
        except ReinfError as exc:
            if exc.status != 404:  # 404: it finished in the meantime
                raise

    def result(self) -> dict:
        """The stored turn (``TurnRecord.to_dict()``), once the reply has ended."""
        while not self._ended.wait(0.1):
            pass
        if self.done is None:
            raise self.error or ReinfError("the reply ended without being stored", status=502)
        turn_id = self.done["turn_id"]
        if self.shown is not None and self.shown != self.done.get("reply"):
            turn = self.backend.request("POST", f"/api/turns/{turn_id}/cut",
                                        {"shown": self.shown})["turn"]
            return turn if turn is not None else {**self.done, "reply": "", "forgotten": True}
        try:
            return self.backend.request("GET", f"/api/turns/{turn_id}")
        except ReinfError:
            return dict(self.done)  # the done event carries the same core fields

    def close(self) -> None:
        try:
            self.response.close()
        except OSError:
            pass

