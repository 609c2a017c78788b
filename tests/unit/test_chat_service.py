"""ChatService, ReplyStream and the REPL loop, with a scripted engine (no model load).

``ScriptedEngine`` borrows the real Engine's parameter checks and prompt building and
returns a real ReplyStream; only the token source is scripted.
"""
from __future__ import annotations

import threading
import time

import pytest

from reinf.chat import ChatService
from reinf.engine import Engine, Reply, ReplyStream
from reinf.errors import BadInput, ModelError, NotFound
from reinf.repl import RATE_PROMPT, USER_PROMPT, LocalBackend, Repl, parse_rating
from tiny import build_tiny_tokenizer


class ScriptedEngine:
    model_name = "scripted"
    generation_params = Engine.generation_params
    build_prompt = Engine.build_prompt

    def __init__(self, config, pieces=("Sun", "ny", " today", "."), delay=0.0, fail=False):
        self.config = config
        self.tokenizer = build_tiny_tokenizer(max_positions=512)
        self.context_limit = 512
        self.pieces, self.delay, self.fail = pieces, delay, fail
        self.prompts: list[list[int]] = []

    def describe(self):
        return {"model_name": "scripted", "device_in_use": "cpu", "dtype": "float32",
                "active_checkpoint": "ckpt-7"}

    def stream_prompt(self, prompt_ids, params, *, on_finish=None):
        self.prompts.append(list(prompt_ids))

        def run(stream: ReplyStream) -> Reply:
            if self.fail:
                raise ModelError("out of memory while generating on cpu")
            ids, text = [], ""
            for i, piece in enumerate(self.pieces[:params["max_new_tokens"]]):
                if stream.stopped:
                    break
                time.sleep(self.delay)
                ids.append(100 + i)
                text += piece
                stream.emit(piece)
            stopped = len(ids) < min(len(self.pieces), params["max_new_tokens"])
            return Reply(text, list(prompt_ids), ids, [-1.0 - i for i in range(len(ids))],
                         "ckpt-7", 1.5, 9.0, stopped, dict(params),
                         "interrupted" if stopped else "stop")
        return ReplyStream(run, on_finish=on_finish)


@pytest.fixture
def service(config, store):
    return ChatService(ScriptedEngine(config), store, config)


# --- ChatService ----------------------------------------------------------------------------

def test_a_message_becomes_a_stored_turn(service, store):
    chat = service.stream("What is the weather?", temperature=0.5)
    assert chat.conversation_id == store.list_conversations()[0].id
    assert "".join(chat) == "Sunny today."
    turn = chat.turn
    assert store.get_turn(turn.id) == turn
    assert (turn.user_message, turn.reply, turn.interrupted) == \
        ("What is the weather?", "Sunny today.", False)
    assert turn.prompt_ids == service.engine.build_prompt([], "What is the weather?")
    assert turn.reply_ids == [100, 101, 102, 103]
    assert turn.logprobs == [-1.0, -2.0, -3.0, -4.0]
    assert (turn.checkpoint_id, turn.model, turn.ttft_ms, turn.latency_ms) == \
        ("ckpt-7", "scripted", 1.5, 9.0)
    assert turn.gen_params == {"temperature": 0.5, "top_p": 0.95, "max_new_tokens": 128}


def test_a_stream_id_given_up_front_is_stored_and_names_the_turn(service, store):
    """An OpenAI client sees chatcmpl-stream-<hex> before the turn exists; the turn keeps the
    hex so that the id rates it later, after a restart too."""
    stream_id = "0123456789abcdef" * 2
    turn = service.stream("hello", stream_id=stream_id, temperature=0.5).turn
    assert turn.gen_params == {"temperature": 0.5, "top_p": 0.95, "max_new_tokens": 128,
                               "stream_id": stream_id}
    assert store.resolve_turn("chatcmpl-stream-" + stream_id) == turn.id


def test_the_next_message_carries_the_conversation_so_far(service, store):
    first = service.send("First question")
    second = service.send("Second question", first.conversation_id, max_new_tokens=2)
    assert (second.conversation_id, second.index) == (first.conversation_id, 2)
    assert second.reply == "Sunny"
    expected = service.engine.build_prompt([("First question", "Sunny today.")],
                                           "Second question", max_new_tokens=2)
    assert second.prompt_ids == expected


@pytest.mark.parametrize("message", ["", "   \n", None, 42])
def test_empty_or_non_text_messages_are_refused(service, store, message):
    with pytest.raises(BadInput, match="empty"):
        service.stream(message)
    assert store.counts()["conversations"] == 0


def test_too_long_messages_are_refused(config, store):
    cfg = config.replace(max_message_chars=10)
    svc = ChatService(ScriptedEngine(cfg), store, cfg)
    with pytest.raises(BadInput, match="11 characters; the limit is 10"):
        svc.send("x" * 11)
    assert svc.send("x" * 10).reply == "Sunny today."


def test_bad_requests_store_nothing(service, store):
    with pytest.raises(BadInput, match="temperature"):
        service.send("hi", temperature=0)
    with pytest.raises(BadInput, match="unknown generation setting 'top_k'"):
        service.send("hi", top_k=5)
    with pytest.raises(BadInput, match="message too long"):
        service.send("word " * 600)
    with pytest.raises(NotFound):
        service.send("hi", conversation_id=999)
    assert store.counts()["conversations"] == store.counts()["turns"] == 0


def test_a_stopped_reply_is_stored_as_interrupted(config, store):
    svc = ChatService(ScriptedEngine(config, delay=0.05), store, config)
    chat = svc.stream("Tell me a story")
    first = next(iter(chat))
    chat.stop()
    turn = chat.wait(timeout=5)
    assert turn.interrupted and first == "Sun"
    assert 1 <= len(turn.reply_ids) < 4 and turn.reply.startswith("Sun")
    assert store.get_turn(turn.id).interrupted


def test_a_reply_nobody_reads_is_still_stored(service, store):
    service.stream("fire and forget")
    deadline = time.time() + 5
    while store.counts()["turns"] == 0 and time.time() < deadline:
        time.sleep(0.01)
    assert store.last_turn().reply == "Sunny today."


def test_history_skips_empty_replies_but_keeps_partial_ones(service, store):
    conv = store.create_conversation().id
    store.append_turn(conv, "stopped at once", "", interrupted=True)
    store.append_turn(conv, "stopped midway", "Half a", interrupted=True)
    assert service.history(conv) == [("stopped midway", "Half a")]


def test_engine_errors_reach_the_caller_and_store_nothing(config, store):
    svc = ChatService(ScriptedEngine(config, fail=True), store, config)
    conv = store.create_conversation().id
    with pytest.raises(ModelError, match="out of memory"):
        svc.send("hi", conv)
    svc.engine.fail = False
    assert svc.send("again", conv).index == 1  # the conversation is not left locked


def test_messages_to_one_conversation_are_handled_in_order(config, store):
    svc = ChatService(ScriptedEngine(config, delay=0.005), store, config)
    conv = svc.send("message 0").conversation_id
    errors = []

    def send(i):
        try:
            svc.send(f"message {i}", conv)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
    threads = [threading.Thread(target=send, args=(i,)) for i in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert errors == []
    turns = store.conversation_turns(conv)
    assert [t.index for t in turns] == [1, 2, 3, 4, 5]
    for k, turn in enumerate(turns):  # each prompt holds every earlier turn of the conversation
        history = [(t.user_message, t.reply) for t in turns[:k]]
        assert turn.prompt_ids == svc.engine.build_prompt(history, turn.user_message)


# --- the REPL loop ----------------------------------------------------------------------------

class Keyboard:
    """Feeds scripted lines to the REPL; a KeyboardInterrupt item raises it."""

    def __init__(self, *lines):
        self.lines = list(lines)
        self.prompts: list[str] = []

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        if not self.lines:
            raise EOFError
        item = self.lines.pop(0)
        if isinstance(item, type) and issubclass(item, BaseException):
            raise item
        return item


class Screen:
    def __init__(self):
        self.text = ""

    def write(self, s):
        self.text += s

    def flush(self):
        pass


def run_repl(service, store, *lines):
    keys, screen = Keyboard(*lines), Screen()
    code = Repl(LocalBackend(service, store), read=keys, out=screen).run()
    return code, keys, screen.text


def test_repl_chats_rates_with_tags_and_undoes(service, store):
    code, keys, out = run_repl(service, store, "hello", "4 too long, wrong", "/undo", "/quit")
    assert code == 0
    assert keys.prompts == [USER_PROMPT, RATE_PROMPT, USER_PROMPT, USER_PROMPT]
    assert "bot> Sunny today.\n" in out
    assert "rated turn 1: 4 [too long, wrong]" in out
    assert "removed rating 4 from turn 1" in out
    assert store.get_turn(1).rating is None


def test_repl_reprompts_on_a_bad_rating(service, store):
    code, keys, out = run_repl(service, store, "hello", "great", "9", "5 ", "")
    assert keys.prompts.count(RATE_PROMPT) == 3
    assert "'great' is not a score" in out and "from 1 to 5" in out
    assert store.get_turn(1).rating.score == 5


def test_repl_enter_skips_and_slash_rate_rates_later(service, store):
    code, _, out = run_repl(service, store, "hello", "", "/rate 2 wrong", "/history")
    rating = store.get_turn(1).rating
    assert (rating.score, rating.tags) == (2, ["wrong"])
    assert "#1 ★2 [wrong]" in out and "you: hello" in out


def test_repl_ctrl_c_during_a_reply_keeps_the_partial_reply(config, store):
    svc = ChatService(ScriptedEngine(config, delay=0.05), store, config)
    backend = LocalBackend(svc, store)

    class CtrlCAfterFirstDelta:  # the person presses Ctrl-C once the reply has started
        def __init__(self, handle):
            self.handle, self.conversation_id = handle, handle.conversation_id

        def __iter__(self):
            yield next(iter(self.handle))
            raise KeyboardInterrupt

        def stop(self):
            self.handle.stop()

        def result(self):
            return self.handle.result()

    class Interrupting(LocalBackend):
        def send_stream(self, message, conversation_id):
            return CtrlCAfterFirstDelta(backend.send_stream(message, conversation_id))
    keys, screen = Keyboard("story", "1", KeyboardInterrupt), Screen()
    code = Repl(Interrupting(svc, store), read=keys, out=screen).run()
    turn = store.last_turn()
    assert code == 0 and turn.interrupted and turn.rating.score == 1
    assert f"kept as turn {turn.id}, marked interrupted" in screen.text


def test_repl_new_starts_another_conversation_and_undo_is_per_session(service, store):
    code, _, out = run_repl(service, store, "one", "3", "/new", "two", "", "/undo", "/undo")
    a, b = store.get_turn(1), store.get_turn(2)
    assert a.conversation_id != b.conversation_id
    assert "no rating to undo in this session" in out and a.rating is None


def test_parse_rating():
    assert parse_rating("4 too long,wrong") == (4, ["too long", "wrong"])
    assert parse_rating(" 1 ") == (1, [])
    for bad in ("0", "6", "4.5", "x", "-1"):
        with pytest.raises(BadInput):
            parse_rating(bad)
