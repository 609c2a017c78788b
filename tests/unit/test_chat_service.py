"""ChatService, ReplyStream and the REPL loop, with a scripted engine (no model load).

``ScriptedEngine`` borrows the real Engine's parameter checks and prompt building and
returns a real ReplyStream; only the token source is scripted.
"""
from __future__ import annotations

import threading
import time

import pytest

from reinf.cli.repl import (LEAVE_HINT, MORE_PROMPT, RATE_PROMPT, USER_PROMPT, LocalBackend, Repl,
                            parse_rating)
from reinf.errors import BadInput, ModelError, NotFound
from reinf.serving.chat import ChatService
from reinf.serving.engine import Engine, Reply, ReplyStream
from tiny import build_tiny_tokenizer

pytestmark = pytest.mark.stack  # see pyproject.toml's markers


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


# --- exploring styles (generation.explore_styles) --------------------------------------------

def test_an_explored_reply_is_asked_for_in_a_style_and_stored_under_the_plain_prompt(config,
                                                                                   store):
    from reinf.training.styles import BUILTIN_STYLES

    engine = ScriptedEngine(config)
    service = ChatService(engine, store, config.replace(explore_styles=1.0))
    turn = service.send("What is the weather?", seed=3)
    plain = engine.build_prompt([], "What is the weather?")
    style = turn.gen_params["style"]
    assert style in BUILTIN_STYLES
    sampled = engine.tokenizer.decode(engine.prompts[-1])
    assert "What is the weather?" in sampled and style in sampled  # the model was asked
    assert turn.prompt_ids == plain  # the turn answers what the person wrote
    assert turn.to_dict()["style"] == style
    again = service.stream_again(turn.id, seed=4).wait()  # regenerate explores too
    assert again.gen_params["style"] in BUILTIN_STYLES and again.prompt_ids == plain
    store.rate(turn.id, 5)
    assert [s.styled for s in store.training_samples(10)] == [True]


def test_exploring_by_ratings_asks_more_often_for_the_style_the_person_rated_well(config,
                                                                                   store):
    conv = store.create_conversation().id

    def rated(score: int, **gen_params) -> None:
        turn = store.append_turn(conv, "q", "a", reply_ids=[1], logprobs=[-1],
                                 gen_params=gen_params)
        store.rate(turn.id, score)
    for _ in range(6):
        rated(1)                                      # the usual reply: rated 1
    rated(5, style="Use a bulleted list.")
    rated(4, style="Use a bulleted list.")
    rated(1, style="Be warm and encouraging.")
    seen = store.style_ratings()
    assert sorted(seen.scores) == [1] * 7 + [4, 5]
    assert seen.by_style == {"Use a bulleted list.": (4, 5), "Be warm and encouraging.": (1,)}

    engine = ScriptedEngine(config)
    messages = [f"question {i}" for i in range(48)]

    def lists(**settings) -> int:
        service = ChatService(engine, store, config.replace(explore_styles=1.0, **settings))
        return sum(service.send(m, seed=i).gen_params["style"] == "Use a bulleted list."
                   for i, m in enumerate(messages))
    by_ratings, uniform = lists(), lists(explore_pick="uniform")  # ratings: the default
    assert by_ratings >= 10 and uniform <= 8 and by_ratings > 2 * uniform  # uniform: 3 of 48


def test_a_single_reply_reads_the_ratings_only_when_it_is_styled(config, store, monkeypatch):
    reads = []
    read = store.style_ratings
    monkeypatch.setattr(store, "style_ratings", lambda *a, **kw: (reads.append(1),
                                                                   read(*a, **kw))[1])
    service = ChatService(ScriptedEngine(config), store, config.replace(explore_styles=0.25))
    styled = sum("style" in service.send(f"question {i}", seed=i).gen_params for i in range(24))
    assert 0 < styled < 24 and len(reads) == styled


def test_with_exploring_off_replies_are_plain(service, store):
    turn = service.send("What is the weather?", seed=3)
    assert "style" not in turn.gen_params and turn.to_dict()["style"] is None
    assert service.engine.prompts[-1] == turn.prompt_ids
    store.rate(turn.id, 5)
    assert [s.styled for s in store.training_samples(10)] == [False]


def test_exploring_with_a_bad_styles_file_fails_at_start_naming_the_setting(config, store,
                                                                          tmp_path):
    empty = tmp_path / "styles.txt"
    empty.write_text("# nothing yet\n")
    with pytest.raises(BadInput) as err:
        ChatService(ScriptedEngine(config), store,
                    config.replace(explore_styles=0.5, **{"training.styles_file": str(empty)}))
    assert "training.styles_file" in str(err.value) and err.value.fix


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


@pytest.mark.parametrize("loaded,shown", [
    ("/home/me/.reinf/models/smollm2-135m", "smollm2-135m"),   # a named model, pulled
    ("/home/me/checkout/models/reinf-demo/", "reinf-demo"),    # the demo model
    ("HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),  # hub id
    ("~/models/my-model", "my-model"),
])
def test_a_turn_names_the_model_not_where_it_lives(service, store, loaded, shown):
    """/api/chat and `chat --json` print the stored turn; its model was an absolute path."""
    service.engine.model_name = loaded
    chat = service.stream("hi")
    "".join(chat)
    assert chat.turn.model == shown and chat.turn.to_dict()["model"] == shown


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


def test_a_turn_forgotten_while_its_conversation_generates_is_not_in_the_new_turn(config,
                                                                                 store):
    """Forget races: the first turn goes while the second reply is being generated. The
    second turn's prompt held its text, so it is stored context_forgotten, without its
    prompt ids, and never trained on."""
    svc = ChatService(ScriptedEngine(config, delay=0.1), store, config)
    first = svc.send("my secret is X")
    store.rate(first.id, 5)
    chat = svc.stream("and now a long reply", first.conversation_id)
    next(iter(chat))  # generating
    store.forget_turn(first.id)
    turn = chat.wait(timeout=10)
    assert turn.context_forgotten and turn.prompt_ids == []
    stored = store.get_turn(turn.id)
    assert stored.context_forgotten and stored.prompt_ids == []
    store.rate(turn.id, 4)
    assert store.training_samples(10) == []
    # an untouched context is kept as it was
    again = svc.send("next", first.conversation_id)
    assert not again.context_forgotten and again.prompt_ids


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


def test_repl_says_when_a_reply_was_asked_for_in_a_style(config, store):
    explored = ChatService(ScriptedEngine(config), store, config.replace(explore_styles=1.0))
    _, _, out = run_repl(explored, store, "hello", "", "/quit")
    assert f"[asked for in a style: {store.get_turn(1).gen_params['style']}]" in out
    _, _, out = run_repl(ChatService(ScriptedEngine(config), store, config), store, "hello",
                         "", "/quit")
    assert "asked for in a style" not in out


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


def test_repl_rewrite_stores_the_reply_the_person_wanted(service, store):
    from reinf.storage.store import MAX_REWRITE_CHARS

    code, keys, out = run_repl(
        service, store, "/rewrite too early", "hello", "/rewrite  Rainy, sadly. ",
        "/rewrite", "again", "4", "/rewrite Cloudy.", "/rewrite " + "x" * (MAX_REWRITE_CHARS + 1),
        "/history", "/quit")
    assert code == 0
    # at the rating prompt /rewrite runs, and the rating prompt is over
    assert keys.prompts == [USER_PROMPT, USER_PROMPT, RATE_PROMPT, USER_PROMPT, USER_PROMPT,
                            RATE_PROMPT, USER_PROMPT, USER_PROMPT, USER_PROMPT, USER_PROMPT]
    assert "nothing to rewrite yet — send a message first" in out
    assert "turn 1: rewrite saved (13 characters); the next training round learns from it" in out
    assert "usage: /rewrite TEXT, the reply you wanted to your last message" in out
    assert "turn 2: rewrite saved (7 characters)" in out
    assert f"error: a rewrite holds at most {MAX_REWRITE_CHARS:,} characters" in out
    assert store.get_rewrite(1).text == "Rainy, sadly."
    assert store.get_rewrite(2).text == "Cloudy."  # the too long one replaced nothing
    assert store.get_turn(2).rating.score == 4
    assert "#1 unrated ✎\n" in out and "#2 ★4 ✎\n" in out
    assert "/rewrite TEXT" in run_repl(service, store, "/help")[2]


def test_repl_ctrl_c_during_a_reply_keeps_the_partial_reply(config, store):
    svc = ChatService(ScriptedEngine(config, delay=0.05), store, config)
    backend = LocalBackend(svc, store)

    class CtrlCAfterFirstDelta:  # the person presses Ctrl-C once the reply has started
        def __init__(self, handle):
            self.handle, self.conversation_id = handle, handle.conversation_id

        def __iter__(self):
            yield next(iter(self.handle))
            raise KeyboardInterrupt

        def stop(self, shown=None):
            self.handle.stop(shown)

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


def test_repl_ctrl_c_at_a_prompt_clears_the_line_and_a_second_one_leaves(service, store):
    """As in Python's REPL; it used to leave at once, with exit 0, from either prompt."""
    code, keys, out = run_repl(service, store, KeyboardInterrupt, "hello", KeyboardInterrupt,
                               "4", KeyboardInterrupt, KeyboardInterrupt, "never read")
    assert code == 0
    assert keys.prompts == [USER_PROMPT, USER_PROMPT, RATE_PROMPT, RATE_PROMPT, USER_PROMPT,
                            USER_PROMPT]
    assert out.count(LEAVE_HINT) == 3 and keys.lines == ["never read"]
    assert store.get_turn(1).rating.score == 4
    # Ctrl-D leaves at once, from the rating prompt too
    code, keys, _ = run_repl(service, store, "again")
    assert code == 0 and keys.prompts == [USER_PROMPT, RATE_PROMPT]


def test_paste_and_a_trailing_backslash_send_several_lines_as_one_message(service, store):
    """A pasted text sent only its first line, and the rating prompt read the rest ("'The'
    is not a score")."""
    code, keys, out = run_repl(service, store, "/paste", "The first line", "", "The third",
                               ".", "4", "one\\", "two\\", "three", "",
                               "/paste", "dropped", KeyboardInterrupt, "/quit")
    assert code == 0
    first, second = store.history(limit=None, oldest_first=True)
    assert first.user_message == "The first line\n\nThe third" and first.rating.score == 4
    assert second.user_message == "one\ntwo\nthree" and second.rating is None
    assert keys.prompts.count(MORE_PROMPT) == 2 and "is not a score" not in out
    assert "[message dropped]" in out and store.counts()["turns"] == 2


class TokenEngine(ScriptedEngine):
    """Real token ids, emitted as the engine does (one Detokenizer delta per token), and
    generated ahead of the reader: every token exists before the REPL shows the first."""

    def __init__(self, config, text, hold=False):
        super().__init__(config)
        self.ids = self.tokenizer.encode(text, add_special_tokens=False)
        self.hold = hold  # end only when stopped: the turn is stored after the cut

    def stream_prompt(self, prompt_ids, params, *, on_finish=None):
        from reinf.model.modeling import Detokenizer

        def run(stream: ReplyStream) -> Reply:
            text = Detokenizer(self.tokenizer)
            for token in self.ids:
                delta = text.add(token)
                if delta:
                    stream.emit(delta)
            deadline = time.monotonic() + 5
            while self.hold and not stream.stopped and time.monotonic() < deadline:
                time.sleep(0.01)
            stream.emit(text.flush())
            return Reply(text.text, list(prompt_ids), list(self.ids),
                         [-0.5 - i for i in range(len(self.ids))], None, 1.0, 2.0,
                         stream.stopped, dict(params), "stop")
        return ReplyStream(run, on_finish=on_finish)


def interrupting_backend(backend_cls, *, after: int):
    """A backend whose reply raises KeyboardInterrupt once ``after`` deltas were shown."""
    class Handle:
        def __init__(self, handle):
            self.handle, self.conversation_id = handle, handle.conversation_id

        def __iter__(self):
            deltas = iter(self.handle)
            for _ in range(after):
                yield next(deltas)
            time.sleep(0.2)  # the generator is further along than the screen
            raise KeyboardInterrupt

        def stop(self, shown=None):
            self.handle.stop(shown)

        def result(self):
            return self.handle.result()

    class Interrupting(backend_cls):
        def send_stream(self, message, conversation_id, **extra):
            return Handle(super().send_stream(message, conversation_id, **extra))
    return Interrupting


@pytest.mark.parametrize("after,hold", [(2, False), (3, False), (2, True)])
def test_a_cut_keeps_exactly_the_tokens_whose_text_was_shown(config, store, after, hold):
    """Once 15 tokens were kept with nothing on screen; "the part you saw is kept". The
    reply may have been stored before the cut (hold=False) or after it (hold=True)."""
    engine = TokenEngine(config, "the quick brown fox jumps over the lazy dog again", hold)
    svc = ChatService(engine, store, config)
    keys, screen = Keyboard("story", "2"), Screen()
    Repl(interrupting_backend(LocalBackend, after=after)(svc, store), read=keys,
         out=screen).run()
    turn = store.last_turn()
    shown = screen.text.split("bot> ", 1)[1].split("\n", 1)[0]
    assert turn.reply == shown and 0 < len(turn.reply_ids) < len(engine.ids)
    assert turn.reply_ids == engine.ids[:len(turn.reply_ids)]
    assert engine.tokenizer.decode(turn.reply_ids) == shown
    assert turn.logprobs == [-0.5 - i for i in range(len(turn.reply_ids))]
    assert turn.interrupted and turn.rating.score == 2


@pytest.mark.parametrize("hold", [False, True])
def test_a_cut_before_anything_was_shown_stores_nothing(config, store, hold):
    """It stored a one-token turn ('L', 'In') and asked for a rating."""
    engine = TokenEngine(config, "Let me think about that", hold)
    svc = ChatService(engine, store, config)
    keys, screen = Keyboard("hello", "/history"), Screen()
    code = Repl(interrupting_backend(LocalBackend, after=0)(svc, store), read=keys,
                out=screen).run()
    assert code == 0 and store.counts()["turns"] == 0
    assert "[stopped before any text appeared; nothing kept]" in screen.text
    assert RATE_PROMPT not in keys.prompts


def test_a_cut_before_anything_was_shown_is_forgotten_on_a_server(store):
    """Over HTTP the server stored what it generated: the REPL forgets it."""
    class Handle:
        conversation_id = 1

        def __iter__(self):
            raise KeyboardInterrupt
            yield  # a generator

        def stop(self, shown=None):
            pass

        def result(self):
            return {"turn_id": 9, "reply": "In", "interrupted": True, "reply_tokens": 1}

    class Server:
        forgotten: list[int] = []

        def describe(self):
            return "fake"

        def send_stream(self, message, conversation_id, **extra):
            return Handle()

        def forget(self, turn_id):
            self.forgotten.append(turn_id)
    server = Server()
    keys, screen = Keyboard("hello"), Screen()
    Repl(server, read=keys, out=screen).run()
    assert server.forgotten == [9] and RATE_PROMPT not in keys.prompts
    assert "nothing kept" in screen.text


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


def test_repl_asks_for_a_rewrite_after_the_first_low_score_only(service, store):
    from reinf.cli.repl import REWRITE_TIP

    _, _, out = run_repl(service, store, "hello", "4", "/rate 2", "/rate 1", "again", "1",
                         "/quit")
    assert out.count(REWRITE_TIP) == 1  # once a session, not under every low score
    assert out.index("rated turn 1: 2") < out.index(REWRITE_TIP) < out.index("rated turn 1: 1")
    # a reply rewritten before its low score needs no tip; nor does a score of 3
    _, _, out = run_repl(service, store, "hello", "/rewrite Rainy.", "/rate 1", "/rate 3",
                         "/quit")
    assert "rated turn 3: 1" in out and REWRITE_TIP not in out
    assert store.get_turn(3).rating.score == 3 and store.get_rewrite(3).text == "Rainy."
