"""Alternatives and pairs through the layers above the store, with a scripted engine (no
model load): ChatService.stream_again / pick, `/again` and `/pick` in the REPL, the HTTP
routes (again, pick, alternatives, pairs, prompts) and /v1 chat completions with n > 1.

``NumberedEngine`` borrows the real Engine's parameter checks and prompt building and
returns a real ReplyStream whose reply names its call: "reply 1.", "reply 2.", ... so that
every alternative differs and each prompt shows which reply it was built on."""
from __future__ import annotations

import itertools

import pytest

from reinf.cli.repl import PICK_PROMPT, RATE_PROMPT, USER_PROMPT, LocalBackend, Repl
from reinf.errors import Conflict, NotFound
from reinf.serving.chat import ChatService
from reinf.serving.engine import Engine, Reply, ReplyStream
from tiny import build_tiny_tokenizer
from webui_fakes import build_daemon, daemon, parse_sse  # noqa: F401 - fixtures

pytestmark = pytest.mark.stack  # see pyproject.toml's markers


class NumberedEngine:
    model_name = "numbered"
    generation_params = Engine.generation_params
    build_prompt = Engine.build_prompt
    active_checkpoint_id = None

    def __init__(self, config):
        self.config = config
        self.tokenizer = build_tiny_tokenizer(max_positions=512)
        self.context_limit = 512
        self.calls = itertools.count(1)
        self.prompts: list[list[int]] = []

    def describe(self):
        return {"model_name": "numbered", "device_in_use": "cpu", "dtype": "float32",
                "active_checkpoint": "base"}

    def stream_prompt(self, prompt_ids, params, *, on_finish=None):
        self.prompts.append(list(prompt_ids))
        pieces = ["reply", f" {next(self.calls)}", "."]

        def run(stream: ReplyStream) -> Reply:
            for piece in pieces:
                stream.emit(piece)
            ids = list(range(100, 100 + len(pieces)))
            return Reply("".join(pieces), list(prompt_ids), ids, [-1.0] * len(ids), None, 1.0,
                         2.0, False, dict(params), "stop")
        return ReplyStream(run, on_finish=on_finish)

    def replies(self, prompts, params):
        return [self.stream_prompt(p, params).wait() for p in prompts]


@pytest.fixture
def engine(config):
    return NumberedEngine(config)


@pytest.fixture
def service(engine, store, config):
    return ChatService(engine, store, config)


# --- ChatService --------------------------------------------------------------------------

def test_again_is_an_alternative_from_the_same_context(service, engine, store):
    first = service.send("q1")
    second = service.send("q2", first.conversation_id)
    alt = service.stream_again(second.id).wait()
    assert (alt.conversation_id, alt.index, alt.user_message) == (first.conversation_id, 2, "q2")
    assert alt.reply == "reply 3." and alt.picked and alt.alternatives == 2
    assert engine.prompts[-1] == engine.prompts[-2]  # the same prompt as the first reply
    assert alt.prompt_ids == second.prompt_ids


def test_the_next_message_continues_from_the_picked_alternative(service, engine, store):
    first = service.send("q")
    alt = service.stream_again(first.id).wait()
    nxt = service.send("next", first.conversation_id)
    assert nxt.prompt_ids == engine.build_prompt([("q", alt.reply)], "next")
    with pytest.raises(Conflict, match="went on"):  # the next turn was built on the other
        service.pick(first.id)
    assert not store.get_turn(first.id).picked
    turn, pairs = service.pick(alt.id)  # the picked one: the preference alone is stored
    assert [(p.a_turn_id, p.b_turn_id, p.outcome) for p in pairs] == [(alt.id, first.id, "a")]


def test_pick_then_the_next_message_holds_the_picked_reply_not_the_other(service, engine,
                                                                         store):
    first = service.send("q")
    alt = service.stream_again(first.id).wait()
    turn, pairs = service.pick(first.id)
    assert turn.picked and [(p.a_turn_id, p.b_turn_id, p.outcome) for p in pairs] == \
        [(first.id, alt.id, "a")]
    nxt = service.send("next", first.conversation_id)
    assert nxt.prompt_ids == engine.build_prompt([("q", "reply 1.")], "next")
    assert nxt.index == 2


def test_again_on_an_earlier_turn_is_a_conflict_and_stores_nothing(service, store):
    first = service.send("q1")
    service.send("q2", first.conversation_id)
    with pytest.raises(Conflict, match="not the last"):
        service.stream_again(first.id)
    with pytest.raises(NotFound):
        service.stream_again(999)
    assert store.counts()["turns"] == 2
    service.send("q3", first.conversation_id)  # the conversation's lock was released


# --- the REPL -------------------------------------------------------------------------------

class Keyboard:
    def __init__(self, *lines):
        self.lines, self.prompts = list(lines), []

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        if not self.lines:
            raise EOFError
        return self.lines.pop(0)


class Screen:
    text = ""

    def write(self, s):
        self.text += s

    def flush(self):
        pass


def run_repl(service, store, *lines):
    keys, screen = Keyboard(*lines), Screen()
    code = Repl(LocalBackend(service, store), read=keys, out=screen).run()
    return code, keys, screen.text


def test_repl_again_shows_another_reply_and_pick_chooses_what_continues(service, engine,
                                                                        store):
    code, keys, out = run_repl(service, store, "hello", "", "/again", "1", "next", "")
    assert code == 0
    assert keys.prompts == [USER_PROMPT, RATE_PROMPT, USER_PROMPT, PICK_PROMPT.format(n=2),
                            USER_PROMPT, RATE_PROMPT, USER_PROMPT]
    assert "bot> reply 1." in out and "bot> reply 2." in out
    assert "[reply 2 of 2, turn 2;" in out
    assert "reply 1 continues the conversation, preferred over 2" in out
    pair, = store.list_pairs()
    assert (pair.source, pair.a_turn_id, pair.b_turn_id, pair.outcome) == \
        ("regenerate", 1, 2, "a")
    assert store.get_turn(3).prompt_ids == engine.build_prompt([("hello", "reply 1.")], "next")


def test_repl_enter_keeps_the_new_reply_and_pick_works_later(service, engine, store):
    code, keys, out = run_repl(service, store, "hello", "", "/again", "", "/again", "",
                               "/pick 3", "/pick 7", "/rate 5")
    assert [t.reply for t in store.alternatives(1)] == ["reply 1.", "reply 2.", "reply 3."]
    assert "reply 3 continues the conversation, preferred over 1, 2" in out
    assert "pick one from 1 to 3" in out
    assert store.get_turn(3).rating.score == 5  # /rate: the picked reply
    assert {(p.a_turn_id, p.b_turn_id, p.outcome) for p in store.list_pairs()} == \
        {(3, 1, "a"), (3, 2, "a")}


def test_repl_again_before_any_message_says_so(service, store):
    code, _, out = run_repl(service, store, "/again", "/pick 1")
    assert "nothing to sample again — send a message first" in out
    assert "nothing to pick yet" in out and store.counts()["turns"] == 0


# --- HTTP -----------------------------------------------------------------------------------

@pytest.fixture
def client(config, store, service, daemon):
    from webui import create_app

    return create_app(config, store=store, chat=service, daemon=daemon).test_client()


def post(client, path, body=None, status=200):
    r = client.post(path, json=body if body is not None else {})
    assert r.status_code == status, r.get_json()
    return r.get_json()


def test_http_again_pick_and_the_conversation_goes_on_from_the_pick(client, engine, store):
    first = post(client, "/api/chat", {"message": "q"})
    alt = post(client, f"/api/turns/{first['turn_id']}/again")
    assert (alt["index"], alt["picked"], alt["alternatives"]) == (1, True, 2)
    r = client.post(f"/api/turns/{first['turn_id']}/again", json={"stream": True})
    events = parse_sse(r.get_data(as_text=True))
    assert events[0][0] == "start" and events[0][1]["alternative_of"] == first["turn_id"]
    done = events[-1][1]
    assert events[-1][0] == "done" and done["reply"] == "reply 3." and done["alternatives"] == 3
    listed = client.get(f"/api/turns/{alt['turn_id']}/alternatives").get_json()["turns"]
    assert [t["reply"] for t in listed] == ["reply 1.", "reply 2.", "reply 3."]
    picked = post(client, f"/api/turns/{alt['turn_id']}/pick")
    assert picked["turn"]["picked"] is True
    assert sorted((p["a"]["turn_id"], p["b"]["turn_id"], p["outcome"], p["source"])
                  for p in picked["pairs"]) == \
        [(alt["turn_id"], first["turn_id"], "a", "regenerate"),
         (alt["turn_id"], done["turn_id"], "a", "regenerate")]
    nxt = post(client, "/api/chat",
               {"message": "next", "conversation_id": first["conversation_id"]})
    assert store.get_turn(nxt["turn_id"]).prompt_ids == \
        engine.build_prompt([("q", "reply 2.")], "next")
    conv = client.get(f"/api/conversations/{first['conversation_id']}").get_json()
    assert [t["reply"] for t in conv["turns"]] == ["reply 2.", "reply 4."]
    pairs = client.get("/api/pairs?source=regenerate").get_json()
    assert pairs["count"] == 2 and pairs["pairs"][0]["prompt"] == "q"
    assert client.get("/api/prompts").get_json()["prompts"][0]["prompt"] == "next"


@pytest.mark.parametrize("method,path,body,status", [
    ("post", "/api/turns/999/again", {}, 404),
    ("post", "/api/turns/999/pick", {}, 404),
    ("get", "/api/turns/999/alternatives", None, 404),
    ("post", "/api/turns/abc/again", {}, 400),
    ("post", "/api/turns/1/again", {"stream": "yes"}, 400),
    ("post", "/api/turns/1/again", {"temperature": 99}, 400),
    ("post", "/api/turns/1/again", {"message": "x"}, 400),
    ("get", "/api/pairs?source=guess", None, 400),
    ("get", "/api/pairs?limit=0", None, 400),
    ("post", "/api/compare/nope/pick", {"winner": "A"}, 404),
    ("get", "/api/compare/nope", None, 404),
    ("post", "/api/compare", {"prompt": "hi"}, 501),  # this app has no engine
    ("post", "/api/compare", {}, 400),
    ("post", "/api/compare", {"prompt": "hi", "turn_id": 1}, 400),
    ("post", "/api/compare", {"turn_id": 999}, 404),
])
def test_http_bad_ids_and_input_are_one_line_json(client, method, path, body, status):
    post(client, "/api/chat", {"message": "q"})
    r = getattr(client, method)(path, **({} if body is None else {"json": body}))
    assert r.status_code == status
    error = r.get_json()["error"]
    assert isinstance(error, str) and "\n" not in error and "Traceback" not in error


def test_http_again_on_an_earlier_turn_is_409(client, store):
    first = post(client, "/api/chat", {"message": "q1"})
    post(client, "/api/chat", {"message": "q2", "conversation_id": first["conversation_id"]})
    r = client.post(f"/api/turns/{first['turn_id']}/again", json={})
    assert r.status_code == 409 and "last" in r.get_json()["error"]
    assert store.counts()["turns"] == 2


# --- /v1 with n > 1 -------------------------------------------------------------------------

def completion(client, status=200, **body):
    r = client.post("/v1/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": "hi"}], **body})
    assert r.status_code == status, r.get_json()
    return r.get_json()


def test_v1_n_choices_are_turns_each_rated_by_its_own_id(client, store):
    done = completion(client, n=2)
    first, second = done["choices"]
    assert (first["index"], second["index"]) == (0, 1)
    assert first["message"]["content"] != second["message"]["content"]
    assert done["id"] == first["id"] == f"chatcmpl-{first['turn_id']}"
    assert second["id"] == f"chatcmpl-{second['turn_id']}" != first["id"]
    assert done["usage"]["completion_tokens"] == 6
    for choice, score in ((first, 5), (second, 2)):
        r = client.put(f"/api/turns/{choice['id']}/rating", json={"score": score})
        assert r.status_code == 200 and r.get_json()["turn_id"] == choice["turn_id"]
    a, b = store.get_turn(first["turn_id"]), store.get_turn(second["turn_id"])
    assert (a.index, a.picked, b.index, b.picked) == (1, True, 1, False)
    assert (a.rating.score, b.rating.score) == (5, 2)


def test_v1_continuing_from_another_choice_picks_it(client, engine, store):
    done = completion(client, n=2)
    second = done["choices"][1]
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": second["message"]["content"]},
                {"role": "user", "content": "and then?"}]
    nxt = completion(client, messages=messages)
    assert nxt["conversation_id"] == done["conversation_id"]
    assert store.get_turn(second["turn_id"]).picked
    assert store.get_turn(nxt["turn_id"]).prompt_ids == \
        engine.build_prompt([("hi", second["message"]["content"])], "and then?")


def test_v1_n_choices_stream_one_after_another(client, store):
    import json

    r = client.post("/v1/chat/completions", json={
        "model": "m", "n": 3, "stream": True, "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hi"}]})
    chunks = [json.loads(line[6:]) for line in r.get_data(as_text=True).splitlines()
              if line.startswith("data: {")]
    assert r.get_data(as_text=True).rstrip().endswith("data: [DONE]")
    text = {i: "" for i in range(3)}
    ends = {}
    for c in chunks:
        for choice in c["choices"]:
            text[choice["index"]] += choice["delta"].get("content") or ""
            if choice["finish_reason"]:
                ends[choice["index"]] = c
    assert set(ends) == {0, 1, 2}
    for index, c in ends.items():
        turn = store.get_turn(c["turn_id"])
        assert c["id"] == f"chatcmpl-{turn.id}" and turn.reply == text[index]
        assert turn.picked == (index == 0)
    assert chunks[-1]["usage"]["completion_tokens"] == 9
    # the provisional id of the first chunks rates the first choice
    r = client.put(f"/api/turns/{chunks[0]['id']}/rating", json={"score": 4})
    assert r.get_json()["turn_id"] == ends[0]["turn_id"]


@pytest.mark.parametrize("n", [0, 9, 2.5, "two"])
def test_v1_n_out_of_range_is_a_400_in_openais_shape(client, store, n):
    body = completion(client, status=400, n=n)
    assert body["error"]["param"] == "n" and "n" in body["error"]["message"]
    assert store.counts()["turns"] == 0


# --- fuzzing the new routes -----------------------------------------------------------------

def json_values():
    from hypothesis import strategies as st

    scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                        st.floats(allow_nan=False), st.text(max_size=12),
                        st.sampled_from(["A", "b", "tie", "both_bad", "last", "chatcmpl-1",
                                         "r0", "base", ""]))
    return st.recursive(scalars, lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
        max_leaves=6)


def test_the_new_routes_never_answer_5xx_to_garbage(config, store, service, daemon):
    """Any JSON body or id on again / pick / alternatives / compare / pairs is a 4xx (501:
    no model for compare in this app) with one line of JSON, and stores nothing odd."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from webui import create_app

    client = create_app(config, store=store, chat=service, daemon=daemon).test_client()
    post(client, "/api/chat", {"message": "q"})
    fields = st.sampled_from(["prompt", "turn_id", "checkpoint", "blind", "winner", "reveal",
                              "stream", "temperature", "top_p", "max_new_tokens", "n", "x"])
    bodies = st.dictionaries(fields, json_values(), max_size=4)
    refs = st.one_of(st.sampled_from(["1", "last", "0", "-1", "chatcmpl-1", "x" * 60, "1.5"]),
                     st.text(alphabet="0123456789abcdef-", min_size=1, max_size=20))
    paths = st.one_of(
        st.builds(lambda r: f"/api/turns/{r}/again", refs),
        st.builds(lambda r: f"/api/turns/{r}/pick", refs),
        st.builds(lambda r: f"/api/compare/{r}/pick", refs),
        st.just("/api/compare"))

    @settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
    @given(path=paths, body=bodies, query=st.dictionaries(
        st.sampled_from(["limit", "source", "outcome", "turn_id", "checkpoint_id", "since"]),
        st.text(max_size=10), max_size=3))
    def run(path, body, query):
        r = client.post(path, json=body)
        assert r.status_code < 500 or r.status_code == 501, (path, body, r.get_json())
        assert isinstance(r.get_json(), dict)
        r = client.get("/api/pairs", query_string=query)
        assert r.status_code < 500, (query, r.get_json())
        r = client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "n": body.get("n")})
        assert r.status_code < 500, r.get_json()
    run()
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall() == []
        # one picked turn per slot, whatever happened
        assert conn.exec_driver_sql(
            "SELECT conversation_id, \"index\" FROM turns GROUP BY 1, 2 "
            "HAVING sum(picked) != 1").fetchall() == []
