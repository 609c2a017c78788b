"""Test doubles and fixtures for the web tests.

FakeChatService implements reinf.serving.chat.ChatService's interface (stream / send / stream_again
/ pick, ChatStream with .conversation_id up front, iteration over text deltas, .stop(),
.wait(), .turn) and stores every turn through the real Store, so the web layer runs the same
code path as with the real engine. Its reply echoes the message word by word ("echo:
<message>"), which lets tests check streaming, stored text and escaping exactly; another
reply to the same message (``stream_again``, stored as an alternative in its slot) is
numbered by its place in the slot ("echo #2: <message>"), so alternatives differ.

Training and rollback go through a real reinf.daemon.background.Daemon, as under ``reinf serve``;
only its round runner is FakeRunner (reinf.daemon.worker.ChildRunner's interface, no child
process), so "Train now", the schedule and rollbacks run the production code.
"""
from __future__ import annotations

import threading
import time

import pytest


class FakeStream:
    def __init__(self, service, message: str, conversation_id: int, gen: dict,
                 stream_id: str | None = None, *, slot: int | None = None,
                 picked: bool = True, context_turn_ids: list[int] | None = None,
                 prefix: str = "echo: "):
        self.service = service
        self.message = message
        self.conversation_id = conversation_id
        self.gen = gen
        self.stream_id = stream_id
        self.slot, self.picked = slot, picked  # as ChatStream: an alternative's slot
        self.context_turn_ids = list(context_turn_ids or [])
        self.prefix = prefix
        self.turn = None
        self._stop = threading.Event()
        self._iter = self._generate()

    def __iter__(self):
        return self

    def __next__(self) -> str:
        return next(self._iter)

    def stop(self) -> None:
        self._stop.set()

    def wait(self, timeout: float | None = None):
        """Run the reply to its end (as ChatStream.wait) and give the stored turn."""
        for _ in self:
            pass
        return self.turn

    def _generate(self):
        service = self.service
        started = time.perf_counter()
        ttft = None
        deltas: list[str] = []
        interrupted = False
        pieces = service.reply_pieces(self.message, self.gen, prefix=self.prefix)
        for i, piece in enumerate(pieces):
            if self._stop.is_set():
                interrupted = True
                break
            if i == 1 and service.gate is not None:
                # hold generation until the test has seen the first delta (or stopped us)
                service.first_sent.set()
                while not service.gate.wait(0.02):
                    if self._stop.is_set():
                        break
                if self._stop.is_set():
                    interrupted = True
                    break
            if service.delay:
                time.sleep(service.delay)
            if ttft is None:
                ttft = (time.perf_counter() - started) * 1000
            deltas.append(piece)
            yield piece
        if service.fail_with is not None:
            raise service.fail_with
        reply = "".join(deltas)
        n = len(deltas)
        self.turn = service.store.append_turn(
            self.conversation_id, self.message, reply,
            prompt_ids=list(range(1, len(self.message.split()) + 3)),
            reply_ids=list(range(100, 100 + n)), logprobs=[-0.5] * n,
            checkpoint_id=service.checkpoint_id, model="fake-echo",
            gen_params={"temperature": 0.8, **self.gen,
                        **({"stream_id": self.stream_id} if self.stream_id else {}),
                        **({"style": service.style} if service.style else {})},
            ttft_ms=ttft,
            latency_ms=(time.perf_counter() - started) * 1000, interrupted=interrupted,
            context_turn_ids=self.context_turn_ids, slot=self.slot, picked=self.picked)
        service.finished.append(self.turn)


class FakeChatService:
    """ChatService's interface over the real Store, with an echo 'model'."""

    def __init__(self, store, *, delay: float = 0.0):
        self.store = store
        self.delay = delay
        self.gate: threading.Event | None = None
        self.first_sent = threading.Event()
        self.fail_with: Exception | None = None
        self.checkpoint_id: str | None = None
        self.style: str | None = None  # as explore_styles stores it (gen_params["style"])
        self.finished: list = []
        self.calls: list[tuple[str, int | None, dict]] = []
        self.system_prompts: list[str | None] = []   # as given to each stream()

    def reply_pieces(self, message: str, gen: dict, prefix: str = "echo: ") -> list[str]:
        words = (prefix + message).split(" ")
        pieces = [w + " " for w in words[:-1]] + [words[-1]]
        limit = gen.get("max_new_tokens")
        return pieces[:limit] if limit else pieces

    def stream(self, message: str, conversation_id: int | None = None, *,
               system_prompt: str | None = None, stream_id: str | None = None,
               **gen) -> FakeStream:
        self.calls.append((message, conversation_id, gen))
        self.system_prompts.append(system_prompt)
        if conversation_id is None:  # as ChatService, less the config's default
            conversation_id = self.store.create_conversation(system_prompt=system_prompt).id
        else:
            conv = self.store.get_conversation(conversation_id)
            if system_prompt is not None and (system_prompt.strip() or None) != \
                    conv.system_prompt:  # Conflict once it has turns
                self.store.update_conversation(conversation_id, system_prompt=system_prompt)
        return FakeStream(self, message, conversation_id, gen, stream_id)

    def stream_again(self, turn_id: int, *, picked: bool = True, stream_id: str | None = None,
                     **gen) -> FakeStream:
        """Another reply to the message of ``turn_id``, stored as an alternative in its slot,
        as ChatService.stream_again: NotFound for an unknown turn, Conflict when the
        conversation went on after it."""
        from reinf.errors import Conflict

        turn = self.store.get_turn(turn_id)
        path = self.store.conversation_turns(turn.conversation_id)
        if path and path[-1].index > turn.index:
            raise Conflict(f"turn {turn_id} is not the last of its conversation; only the "
                           "last reply can be sampled again (later turns continue from it)",
                           fix="regenerate the last reply of the conversation")
        self.calls.append((turn.user_message, turn.conversation_id, gen))
        number = len(self.store.alternatives(turn_id)) + 1
        return FakeStream(self, turn.user_message, turn.conversation_id, gen, stream_id,
                          slot=turn.index, picked=picked, prefix=f"echo #{number}: ",
                          context_turn_ids=[t.id for t in path
                                            if t.index < turn.index and t.reply])

    def pick(self, turn_id: int):
        """As ChatService.pick: the store picks it and records the preference pairs."""
        return self.store.pick_alternative(turn_id)

    def update_conversation(self, conversation_id: int, *, system_prompt: str | None):
        return self.store.update_conversation(conversation_id, system_prompt=system_prompt)

    def send(self, message: str, conversation_id: int | None = None, **gen):
        stream = self.stream(message, conversation_id, **gen)
        for _ in stream:
            pass
        return stream.turn


class FakeRunner:
    """ChildRunner's interface without the child: each round records its trigger, waits
    for ``gate`` (set by default; clear it to hold a round) and ends with ``outcome``,
    a failed round that wrote no rows unless a test gives another."""

    def __init__(self, outcome=None):
        from reinf.daemon.worker import Outcome

        self.outcome = outcome or Outcome("failed", "nothing to learn")
        self.gate = threading.Event()
        self.gate.set()
        self.calls: list[str] = []
        self.pid: int | None = None
        self.stop_reason: str | None = None

    def current_run_id(self) -> int | None:
        return None

    def run(self, trigger: str, *, force: bool = False):
        self.calls.append(trigger)
        self.gate.wait(30)
        return self.outcome

    def stop(self, reason: str = "stopped at shutdown") -> None:
        self.stop_reason = reason
        self.gate.set()

    def kill_now(self) -> None:
        self.stop("killed")


@pytest.fixture
def build_daemon(config, store):
    """``build_daemon(engine=None, *, runner=None, config=<the test's>)``: a started Daemon
    over the test's store with a FakeRunner, scheduling off (``reinf serve --no-train``:
    "Train now" still runs), shut down after the test. One per test: it holds the data
    directory's server lock, as under ``reinf serve``."""
    from reinf.daemon.background import Daemon

    made = []

    def build(engine=None, *, runner=None, config=config):
        daemon = Daemon(config, store, engine, runner=runner or FakeRunner(), schedule=False)
        made.append(daemon)
        return daemon.start()
    yield build
    for daemon in made:
        daemon.shutdown(timeout=5)


@pytest.fixture
def daemon(build_daemon):
    return build_daemon()


@pytest.fixture
def fake_chat(store):
    return FakeChatService(store)


@pytest.fixture
def app(config, store, fake_chat, daemon):
    from webui import create_app

    return create_app(config, store=store, chat=fake_chat, daemon=daemon)


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def live(app):
    """The app on a real waitress server on a random loopback port."""
    from webui.server import BackgroundServer

    with BackgroundServer(app, threads=4) as server:
        yield server


def wait_for(condition, timeout: float = 10.0) -> bool:
    """Poll ``condition`` until it is true or ``timeout`` seconds pass; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return bool(condition())


def parse_sse(text: str) -> list[tuple[str, dict | str]]:
    """[(event, data)] of an SSE body; data is JSON-decoded when it can be."""
    import json

    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        if not block.strip():
            continue
        event, data = "message", []
        for line in block.split("\n"):
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
        raw = "\n".join(data)
        try:
            events.append((event, json.loads(raw)))
        except ValueError:
            events.append((event, raw))
    return events
