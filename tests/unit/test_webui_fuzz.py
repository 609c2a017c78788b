"""Property-based fuzzing of the JSON API with hypothesis.

Random requests (known routes with random bodies, ids and query strings, plus raw bytes)
go through the whole app. Text includes lone surrogates ("\\ud800", which JSON can
carry but UTF-8 cannot), numbers include integer literals of thousands of digits, and
every field gets values of the wrong type. Properties: never a 5xx; every error is JSON
with a message; a refused request (4xx) changes nothing stored; the database stays
consistent (integrity_check, foreign keys, every stored text UTF-8, no conversation
without turns that no request filled); after a request that changed something, every
read route still answers 200 (a refused one changed nothing, so reads are as before).

Runs are deterministic (derandomize) and bounded: 60 mixed requests, then 25 per route,
about a second each.
"""
from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webui_fakes import (FakeChatService, build_daemon, daemon,  # noqa: F401 - fixtures
                         parse_sse, wait_for)

HUGE_MARK = "\x00huge:"  # json.dumps writes it as "\\u0000huge:N"; encode() puts N digits there
surrogates = st.characters(categories=["Cs"])
texts = st.one_of(st.text(max_size=30),
                  st.tuples(st.text(max_size=8), surrogates, st.text(max_size=8)).map("".join))
huge = st.sampled_from([101, 800, 4301, 6000]).map(lambda n: f"{HUGE_MARK}{n}")
numbers = st.one_of(st.integers(-10, 10**12), st.integers(-10**90, 10**90),
                    st.floats(allow_nan=False, allow_infinity=False), huge)
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(texts, inner, max_size=4)),
    max_leaves=12)
ids = st.one_of(st.integers(-3, 40).map(str), st.just("last"), st.text(max_size=12),
                st.integers(1, 40).map(lambda i: f"chatcmpl-{i}"),
                st.just("99999999999999999999999"), st.just("%ED%A0%80"), st.just("1" * 5000),
                st.just("chatcmpl-stream-%ED%A0%80"))


def encode(body) -> str:
    """JSON text of ``body``, with each HUGE_MARK string replaced by a long integer."""
    return re.sub(r'"\\u0000huge:(\d+)"', lambda m: "9" * int(m.group(1)), json.dumps(body))


def body_with(fields: dict) -> st.SearchStrategy:
    """Objects using the route's real fields (valid-ish or random values) and strays."""
    known = st.fixed_dictionaries({}, optional={k: st.one_of(v, values) for k, v in fields.items()})
    stray = st.dictionaries(st.text(max_size=8), values, max_size=2)
    return st.one_of(known, st.tuples(known, stray).map(lambda p: {**p[0], **p[1]}), values)


valid_chat = st.fixed_dictionaries(
    {"message": st.text(min_size=1, max_size=40).filter(str.strip)},
    optional={"conversation_id": st.integers(1, 6), "stream": st.booleans(),
              "max_new_tokens": st.integers(1, 8)})
valid_rating = st.fixed_dictionaries(
    {"score": st.integers(1, 5)},
    optional={"tags": st.lists(st.sampled_from(["wrong", "too long", "great tone"]), max_size=3),
              "comment": st.text(max_size=30), "critical": st.booleans()})
chat_body = body_with({"message": st.one_of(st.text(min_size=1, max_size=40), texts),
                       "conversation_id": st.integers(-1, 20), "stream": st.booleans(),
                       "temperature": st.floats(0, 6), "top_p": st.floats(0, 1.2),
                       "max_new_tokens": st.integers(-1, 40)})
rating_body = body_with({"score": st.one_of(st.integers(-1, 7), huge),
                         "tags": st.one_of(st.lists(texts, max_size=4),
                                           st.lists(st.text(max_size=70), max_size=25)),
                         "comment": texts, "critical": st.booleans()})
message = st.fixed_dictionaries({"role": st.one_of(st.sampled_from(["user", "assistant",
                                                                    "system", "tool", "x"]),
                                                   st.sampled_from([[], {}, ["user"], 1]),
                                                   values),
                                 "content": st.one_of(texts, values, st.lists(
                                     st.fixed_dictionaries({"type": st.just("text"),
                                                            "text": texts}), max_size=2))})
user_turn = st.fixed_dictionaries({"role": st.just("user"), "content": texts})
plain_turn = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]),
                                    "content": st.text(max_size=10)})
messages = st.one_of(st.lists(message, max_size=4),  # a history ending with the new message
                     st.tuples(st.lists(st.one_of(plain_turn, message), max_size=3),
                               user_turn).map(lambda p: [*p[0], p[1]]))
openai_fields = {"model": st.text(max_size=10), "messages": messages, "stream": st.booleans(),
                 "temperature": st.floats(0, 3),
                 "max_tokens": st.one_of(st.integers(-1, 50), huge),
                 "n": st.integers(0, 3), "user": texts, "conversation_id": st.integers(-1, 20)}
odd_turn = st.fixed_dictionaries({"role": st.one_of(st.sampled_from([[], {}, ["user"], 1, None]),
                                                   values),
                                  "content": st.one_of(st.text(max_size=10), texts)})
near_valid = st.tuples(st.lists(plain_turn, max_size=2), odd_turn, st.just(
    {"role": "user", "content": "hi"})).map(lambda p: [*p[0], p[1], p[2]])
openai_body = st.one_of(
    body_with(openai_fields),
    st.fixed_dictionaries({"messages": messages},
                          optional={k: v for k, v in openai_fields.items() if k != "messages"}),
    near_valid.map(lambda m: {"messages": m}))  # one odd turn in a good request
query = st.one_of(
    st.dictionaries(st.sampled_from(["limit", "min_score", "max_score", "tag", "since",
                                     "until", "rated", "conversation_id", "offset"]),
                    st.one_of(st.text(max_size=12), st.integers(-5, 50).map(str),
                              st.just("2024-01-01"), st.just("2024-01-01T10:00:00Z"),
                              st.just("0001-01-01T00:00:00+14:00"),
                              st.just("9999-12-31T23:59:59-14:00"), st.just("9" * 5000)),
                    max_size=4),
    st.sampled_from(["tag=%ED%A0%80", "conversation_id=%ED%A0%80", "since=%ED%A0%80",
                     "limit=1%00", "tag=%FF%FE", "limit=" + "9" * 5000]))

small_ids = st.integers(1, 12).map(str)
turn_ids = st.one_of(small_ids, ids)
ROUTES = {  # every JSON route: (method, path or (path, query), body)
    "chat": st.tuples(st.just("POST"), st.just("/api/chat"), st.one_of(valid_chat, chat_body)),
    "chat stream": st.tuples(st.just("POST"), st.just("/api/chat"), st.one_of(
        valid_chat, chat_body).map(lambda b: {**b, "stream": True} if isinstance(b, dict)
                                   else b)),
    "stop": st.tuples(st.just("POST"), ids.map(lambda i: f"/api/chat/{i}/stop"),
                      st.one_of(st.none(), values)),
    "rate": st.tuples(st.just("PUT"), turn_ids.map(lambda i: f"/api/turns/{i}/rating"),
                      st.one_of(valid_rating, rating_body)),
    "unrate": st.tuples(st.just("DELETE"), turn_ids.map(lambda i: f"/api/turns/{i}/rating"),
                        st.one_of(st.none(), values)),
    "turn": st.tuples(st.sampled_from(["GET", "DELETE"]), turn_ids.map(lambda i: f"/api/turns/{i}"),
                      st.one_of(st.none(), values)),
    "conversation": st.tuples(st.sampled_from(["GET", "DELETE"]),
                              st.one_of(small_ids, ids).map(lambda i: f"/api/conversations/{i}"),
                              st.none()),
    "history": st.tuples(st.just("GET"), query.map(lambda q: ("/api/history", q)), st.none()),
    "conversations": st.tuples(st.just("GET"), query.map(lambda q: ("/api/conversations", q)),
                               st.none()),
    "rollback": st.tuples(st.just("POST"), st.just("/api/rollback"), st.one_of(
        st.none(), body_with({"checkpoint_id": st.one_of(st.sampled_from(["ckpt-a", "base"]),
                                                         texts, huge)}))),
    "train": st.tuples(st.just("POST"), st.just("/api/train"), st.one_of(
        st.none(), values, body_with({"force": st.booleans()}))),
    "v1": st.tuples(st.just("POST"), st.just("/v1/chat/completions"), openai_body),
    "v1 stream": st.tuples(st.just("POST"), st.just("/v1/chat/completions"), openai_body.map(
        lambda b: {**b, "stream": True} if isinstance(b, dict) else b)),
    "others": st.tuples(st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE"]),
                        st.sampled_from(["/api/status", "/api/checkpoints", "/api/runs",
                                         "/api/stats", "/v1/models", "/v1/models/x",
                                         "/api/ping", "/api/nope", "/v1/x"]),
                        st.one_of(st.none(), values)),
    "raw bytes": st.tuples(st.sampled_from(["POST", "PUT"]),
                           st.sampled_from(["/api/chat", "/api/turns/1/rating", "/api/train",
                                            "/api/rollback", "/v1/chat/completions"]),
                           st.one_of(st.binary(max_size=60), st.sampled_from([
                               b'{"message": "\\ud800"}', b'{"score": 1e999999}',
                               b'{"score": NaN}', b'{"message": "\xed\xa0\x80"}',
                               b'{"score": ' + b"9" * 4400 + b"}", b"[" * 5000]))),
}
requests = st.one_of(*ROUTES.values())
READS = ("/api/history?limit=10000", "/api/conversations?limit=1000", "/api/status",
         "/api/checkpoints", "/api/runs", "/api/stats", "/v1/models")


def snapshot(store) -> tuple:
    """Everything a refused request must leave alone."""
    turns = store.history(limit=None)
    ratings = {t.id: t.rating.to_dict() for t in turns if t.rating}
    active = store.active_checkpoint()
    return store.counts(), ratings, active.id if active else None


def check_consistency(store, seen: set[int]) -> None:
    """The DB after any request. ``seen``: conversations that have held turns; any other
    conversation without turns was left behind by a failed request."""
    assert store.integrity_check() == "ok"
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall() == []
    for turn in store.history(limit=None):
        assert store.get_conversation(turn.conversation_id)
        if turn.rating:
            assert 1 <= turn.rating.score <= 5 and turn.rating.turn_id == turn.id
        json.dumps(turn.to_dict(tokens=True), ensure_ascii=False).encode("utf-8")
    conversations = store.list_conversations(limit=10**6)
    for conv in conversations:
        json.dumps(conv.to_dict(), ensure_ascii=False).encode("utf-8")
    seen |= {c.id for c in conversations if c.turns}
    assert {c.id for c in conversations if not c.turns} <= seen
    assert sum(1 for c in store.list_checkpoints() if c.active) <= 1


def check_reads(client, store) -> None:
    """Every read route still answers, whatever was stored."""
    paths = [*READS, *(f"/api/turns/{t.id}" for t in store.history(limit=2)),
             *(f"/api/conversations/{c.id}" for c in store.list_conversations(limit=2))]
    for path in paths:
        response = client.get(path)
        assert response.status_code == 200, (path, response.get_data(as_text=True))


def stream_errors(response) -> list:
    """Error events of a streamed reply that stand for a 5xx."""
    if response.mimetype != "text/event-stream":
        return []
    out = []
    for _, data in parse_sse(response.get_data(as_text=True)):
        error = data.get("error") if isinstance(data, dict) else None
        status = error.get("code") if isinstance(error, dict) else \
            data.get("status") if error else None
        if isinstance(status, int) and status >= 500:
            out.append(data)
    return out


def exercise(app, store, seen: set[int], request) -> int:
    """Send one fuzzed request and check every property; returns its status."""
    method, target, body = request
    path, params = target if isinstance(target, tuple) else (target, None)
    kwargs = {"query_string": params}
    if isinstance(body, bytes):
        kwargs.update(data=body, content_type="application/json")
    elif body is not None:
        kwargs.update(data=encode(body), content_type="application/json")
    seen |= {c.id for c in store.list_conversations(limit=10**6) if c.turns}
    before = snapshot(store)
    client = app.test_client()
    response = client.open(path, method=method, **kwargs)
    text = response.get_data(as_text=True)
    shown = ascii((method, path, body, text))[:3000]  # lone surrogates would break the report
    assert response.status_code < 500, shown
    assert stream_errors(response) == [], shown
    if response.status_code >= 400:
        assert response.is_json, shown
        error = response.get_json()["error"]
        assert (error["message"] if isinstance(error, dict) else error).strip()
        assert snapshot(store) == before, shown
    daemon = app.extensions["reinf"].daemon
    assert wait_for(lambda: not daemon.schedule_info()["training"], timeout=5)
    check_consistency(store, seen)
    if response.status_code < 400:  # a refused request changed nothing (snapshot above)
        check_reads(client, store)
    return response.status_code


@pytest.fixture
def fuzz_app(config, store, daemon, tmp_path):
    return build_app(config.replace(max_request_bytes=4096), store, daemon, tmp_path)


@pytest.fixture
def roomy_app(config, store, daemon, tmp_path):
    """As fuzz_app, with the default request size limit."""
    return build_app(config, store, daemon, tmp_path)


def build_app(config, store, daemon, tmp_path):
    from reinf.training.checkpoints import REQUIRED
    from webui import create_app

    (tmp_path / "a").mkdir()
    for name in REQUIRED:  # complete, so a rollback to it can succeed
        (tmp_path / "a" / name).write_text("x")
    store.add_checkpoint("ckpt-a", str(tmp_path / "a"))
    conv = store.create_conversation()
    for i in range(3):
        turn = store.append_turn(conv.id, f"q{i}", f"a{i}", reply_ids=[1, 2], logprobs=[-1, -1])
        store.rate(turn.id, i + 2, tags=["wrong"])
    return create_app(config, store=store, chat=FakeChatService(store), daemon=daemon)


@pytest.fixture
def seen() -> set[int]:
    return set()


FUZZ = dict(deadline=None, derandomize=True, database=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@settings(max_examples=60, **FUZZ)
@given(request=requests)
def test_fuzzed_requests_never_5xx_and_keep_the_db_consistent(fuzz_app, store, seen, request):
    """All routes mixed, under a small request size limit (4 KiB)."""
    exercise(fuzz_app, store, seen, request)


@pytest.mark.parametrize("route", sorted(ROUTES))
@settings(max_examples=25, **FUZZ)
@given(data=st.data())
def test_each_json_route_survives_fuzzing(roomy_app, store, seen, route, data):
    """Route by route, under the default size limit, so integers of thousands of digits
    reach the JSON parser."""
    exercise(roomy_app, store, seen, data.draw(ROUTES[route], label=route))


# --- what an adversarial pass found: each a 500 before ------------------------------

HUGE = "1" + "0" * 5000  # past Python's 4,300-digit limit for int()


def error_of(response) -> tuple[str, str | None]:
    """(message, field) of an /api or /v1 error."""
    body = response.get_json()
    if isinstance(body["error"], dict):
        return body["error"]["message"], body["error"]["param"]
    return body["error"], body.get("key")


@pytest.mark.parametrize("method, path, template, key", [
    ("PUT", "/api/turns/1/rating", '{"score": %s}', "score"),
    ("PUT", "/api/turns/1/rating", '{"score": 3, "tags": [%s]}', "tags"),
    ("POST", "/api/chat", '{"message": "hi", "max_new_tokens": %s}', "max_new_tokens"),
    ("POST", "/api/chat", '{"message": "hi", "conversation_id": -%s}', "conversation_id"),
    ("POST", "/v1/chat/completions",
     '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": %s}', "max_tokens"),
    ("POST", "/api/rollback", '{"checkpoint_id": %s}', "checkpoint_id"),
    ("POST", "/api/train", '{"force": %s}', "force"),
    ("POST", "/api/chat/abc/stop", '{"x": %s}', "x"),
])
def test_a_huge_integer_is_a_400_naming_its_field(roomy_app, store, method, path, template,
                                                   key):
    before = snapshot(store)
    r = roomy_app.test_client().open(path, method=method, data=template % HUGE,
                                    content_type="application/json")
    assert r.status_code == 400, r.get_data(as_text=True)
    message, field = error_of(r)
    assert field == key and "5001 digits" in message
    assert snapshot(store) == before


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_json_numbers_are_refused(fuzz_app, literal):
    r = fuzz_app.test_client().put("/api/turns/1/rating", data='{"score": %s}' % literal,
                                   content_type="application/json")
    assert r.status_code == 400 and literal in error_of(r)[0]


@pytest.mark.parametrize("role", [[], {}, ["user"], 1, None, True])
def test_a_role_that_is_not_a_string_is_a_400(fuzz_app, store, role):
    before = snapshot(store)
    r = fuzz_app.test_client().post("/v1/chat/completions",
                                    json={"messages": [{"role": role, "content": "hi"}]})
    assert r.status_code == 400, r.get_data(as_text=True)
    message, field = error_of(r)
    assert field == "messages" and "messages[0].role" in message
    assert snapshot(store) == before


def v1(*contents, **extra):
    roles = ["user", "assistant"] * len(contents)
    return {"messages": [{"role": role, "content": text} for role, text in zip(roles, contents)],
            **extra}


@pytest.mark.parametrize("method, path, body, key, where", [
    ("POST", "/api/chat", {"message": "hi \ud800"}, "message", "message"),
    ("POST", "/api/chat", {"message": "hi \udfff there", "stream": True}, "message", "message"),
    ("POST", "/v1/chat/completions", v1("\ud800"), "messages", "messages[0].content"),
    ("POST", "/v1/chat/completions", v1("hi", "b\udc80", "c"), "messages",
     "messages[1].content"),
    ("POST", "/v1/chat/completions", v1("hi", stream=True, user="\ud800"), "user", "user"),
    ("POST", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]},
     "messages", "messages[0].content[0].text"),
    ("PUT", "/api/turns/1/rating", {"score": 3, "tags": ["ok", "bad \ud800"]}, "tags",
     "tags[1]"),
    ("PUT", "/api/turns/1/rating", {"score": 3, "comment": "\udbff"}, "comment", "comment"),
    ("POST", "/api/rollback", {"checkpoint_id": "ckpt-\ud800"}, "checkpoint_id",
     "checkpoint_id"),
    ("POST", "/api/chat", {"message": "hi", "\ud800": 1}, None, "a field name"),
])
def test_a_lone_surrogate_is_a_400_naming_its_field_and_nothing_is_stored(
        fuzz_app, store, method, path, body, key, where):
    before = snapshot(store)
    client = fuzz_app.test_client()
    r = client.open(path, method=method, data=json.dumps(body), content_type="application/json")
    assert r.status_code == 400, r.get_data(as_text=True)
    message, field = error_of(r)
    assert field == key and where in message and "surrogate" in message
    assert snapshot(store) == before  # no empty conversation left behind either
    for read in ("/api/history", "/api/turns/1", "/api/conversations/1", "/api/conversations"):
        assert client.get(read).status_code == 200, read



@pytest.mark.parametrize("history", [(), ("earlier", "an earlier reply")])
def test_a_completion_refused_by_the_chat_service_leaves_no_conversation(fuzz_app, store,
                                                                         history):
    from reinf.errors import BadInput

    fuzz_app.extensions["reinf"].chat.fail_with = BadInput("too long for the model's context")
    before = snapshot(store)
    r = fuzz_app.test_client().post("/v1/chat/completions", json=v1(*history, "new question"))
    assert r.status_code == 400 and "context" in error_of(r)[0]
    assert snapshot(store) == before


@pytest.mark.parametrize("method, path, body", [
    ("GET", "/api/conversations/" + "1" * 5000, None),
    ("DELETE", "/api/conversations/" + "1" * 5000, None),
    ("GET", "/api/conversations/²", None),
    ("GET", "/api/history?conversation_id=" + "1" * 5000, None),
    ("GET", "/api/history?conversation_id=%C2%B2", None),
    ("POST", "/api/chat", {"message": "hi", "conversation_id": "²"}),
    ("POST", "/v1/chat/completions", v1("hi", conversation_id="1" * 5000)),
])
def test_an_id_that_int_cannot_read_is_a_400(roomy_app, store, method, path, body):
    before = snapshot(store)
    r = roomy_app.test_client().open(path, method=method, json=body)
    assert r.status_code == 400, r.get_data(as_text=True)
    message, field = error_of(r)
    assert field == "conversation_id" and len(message) < 200
    assert snapshot(store) == before


@pytest.mark.parametrize("path", ["/api/x", "/v1/x", "/x"])
def test_an_error_echoing_a_lone_surrogate_can_still_be_sent(fuzz_app, path):
    from webui.errors import render_error

    with fuzz_app.test_request_context(path):
        response = render_error(400, "bad \ud800 text", fix="drop \udfff", key="k\udc80")
        body = response.get_data().decode("utf-8")  # encoded as UTF-8, or it raises
    assert response.status_code == 400 and "ud800 text" in body


@pytest.mark.parametrize("query, key", [
    ("since=0001-01-01T00:00:00%2B14:00", "since"),   # before year 1 in UTC
    ("until=9999-12-31T23:59:59-14:00", "until"),     # after year 9999 in UTC
    ("since=0001-01-01T00:00:00.000001%2B23:59", "since"),
])
def test_a_date_outside_the_utc_range_is_a_400(fuzz_app, query, key):
    r = fuzz_app.test_client().get(f"/api/history?{query}")
    assert r.status_code == 400, r.get_data(as_text=True)
    message, field = error_of(r)
    assert field == key and "out of range" in message and "9999" in message


def test_a_date_at_the_edge_of_the_utc_range_is_read():
    from flask import Flask

    from webui.params import query_datetime

    with Flask(__name__).test_request_context("/?since=0001-01-01T00:00:00-01:00"):
        assert query_datetime("since").isoformat() == "0001-01-01T01:00:00+00:00"


@pytest.mark.parametrize("host", ["a..b", "a b", "\u00e9vil", "[::1"])
@pytest.mark.parametrize("path", ["/", "/history", "/api/ping"])
def test_a_host_the_url_map_cannot_bind_is_a_clean_400(fuzz_app, host, path):
    """werkzeug leaves no URL adapter for such a Host; the HTML error page cannot use
    url_for then, and must not turn the 400 into a plain-text 500."""
    r = fuzz_app.test_client().get(path, headers={"Host": host})
    assert r.status_code == 400, r.get_data(as_text=True)
    body = r.get_data(as_text=True)
    assert "not a valid host name" in body or "not an allowed name" in body
    if path != "/api/ping":
        assert r.mimetype == "text/html" and "<h1>Error 400</h1>" in body
