"""Property-based fuzzing of the JSON API with hypothesis.

Random requests (known routes with random bodies, ids and query strings, plus raw bytes)
go through the whole app. Properties: never a 5xx; every error is JSON with a message;
a refused request (4xx) changes nothing stored; the database stays consistent.
"""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webui_fakes import FakeChatService, build_daemon, daemon, wait_for  # noqa: F401 - fixtures

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**12),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=30))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=12)
ids = st.one_of(st.integers(-3, 40).map(str), st.just("last"), st.text(max_size=12),
                st.integers(1, 40).map(lambda i: f"chatcmpl-{i}"),
                st.just("99999999999999999999999"))


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
chat_body = body_with({"message": st.text(min_size=1, max_size=40),
                       "conversation_id": st.integers(-1, 20), "stream": st.booleans(),
                       "temperature": st.floats(0, 6), "top_p": st.floats(0, 1.2),
                       "max_new_tokens": st.integers(-1, 40)})
rating_body = body_with({"score": st.integers(-1, 7), "tags": st.lists(st.text(max_size=70),
                                                                       max_size=25),
                         "comment": st.text(max_size=50), "critical": st.booleans()})
message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system",
                                                          "tool", "x"]),
                                 "content": st.one_of(st.text(max_size=20), values)})
openai_body = body_with({"model": st.text(max_size=10), "messages": st.lists(message, max_size=4),
                         "stream": st.booleans(), "temperature": st.floats(0, 3),
                         "max_tokens": st.integers(-1, 50), "n": st.integers(0, 3),
                         "user": st.text(max_size=5)})
query = st.dictionaries(st.sampled_from(["limit", "min_score", "max_score", "tag", "since",
                                         "until", "rated", "conversation_id", "offset"]),
                        st.one_of(st.text(max_size=12), st.integers(-5, 50).map(str),
                                  st.just("2024-01-01"), st.just("2024-01-01T10:00:00Z")),
                        max_size=4)

small_ids = st.integers(1, 12).map(str)
requests = st.one_of(
    st.tuples(st.just("POST"), st.just("/api/chat"), st.one_of(valid_chat, chat_body)),
    st.tuples(st.just("PUT"), st.one_of(small_ids, ids).map(lambda i: f"/api/turns/{i}/rating"),
              st.one_of(valid_rating, rating_body)),
    st.tuples(st.just("DELETE"), ids.map(lambda i: f"/api/turns/{i}/rating"), st.none()),
    st.tuples(st.just("DELETE"), ids.map(lambda i: f"/api/turns/{i}"), st.none()),
    st.tuples(st.just("GET"), ids.map(lambda i: f"/api/turns/{i}"), st.none()),
    st.tuples(st.sampled_from(["GET", "DELETE"]), ids.map(lambda i: f"/api/conversations/{i}"),
              st.none()),
    st.tuples(st.just("GET"), query.map(lambda q: ("/api/history", q)), st.none()),
    st.tuples(st.just("GET"), query.map(lambda q: ("/api/conversations", q)), st.none()),
    st.tuples(st.just("POST"), st.just("/api/rollback"), body_with({"checkpoint_id": st.text()})),
    st.tuples(st.just("POST"), st.just("/api/train"), st.one_of(st.none(), values)),
    st.tuples(st.just("POST"), ids.map(lambda i: f"/api/chat/{i}/stop"), st.none()),
    st.tuples(st.just("POST"), st.just("/v1/chat/completions"), openai_body),
    st.tuples(st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE"]),
              st.sampled_from(["/api/status", "/api/checkpoints", "/api/runs", "/api/stats",
                               "/v1/models", "/api/ping", "/api/nope", "/v1/x"]),
              st.one_of(st.none(), values)),
    st.tuples(st.sampled_from(["POST", "PUT"]),
              st.sampled_from(["/api/chat", "/api/turns/1/rating", "/v1/chat/completions"]),
              st.binary(max_size=60)),
)


def snapshot(store) -> tuple:
    """Everything a refused request must leave alone."""
    turns = store.history(limit=None)
    ratings = {t.id: t.rating.to_dict() for t in turns if t.rating}
    active = store.active_checkpoint()
    return store.counts(), ratings, active.id if active else None


def check_consistency(store) -> None:
    assert store.integrity_check() == "ok"
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall() == []
    for turn in store.history(limit=None):
        assert store.get_conversation(turn.conversation_id)
        if turn.rating:
            assert 1 <= turn.rating.score <= 5 and turn.rating.turn_id == turn.id
    assert sum(1 for c in store.list_checkpoints() if c.active) <= 1


@pytest.fixture
def fuzz_app(config, store, daemon, tmp_path):
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
    return create_app(config.replace(max_request_bytes=4096), store=store,
                      chat=FakeChatService(store), daemon=daemon)


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(request=requests)
def test_fuzzed_requests_never_5xx_and_keep_the_db_consistent(fuzz_app, store, request):
    method, target, body = request
    path, params = target if isinstance(target, tuple) else (target, None)
    kwargs = {"query_string": params}
    if isinstance(body, bytes):
        kwargs.update(data=body, content_type="application/json")
    elif body is not None:
        kwargs.update(data=json.dumps(body), content_type="application/json")
    before = snapshot(store)
    client = fuzz_app.test_client()
    response = client.open(path, method=method, **kwargs)
    text = response.get_data(as_text=True)
    assert response.status_code < 500, (method, path, body, text)
    if response.status_code >= 400:
        assert response.is_json, text
        error = response.get_json()["error"]
        assert (error["message"] if isinstance(error, dict) else error).strip()
        assert snapshot(store) == before, (method, path, body, text)
    daemon = fuzz_app.extensions["reinf"].daemon
    assert wait_for(lambda: not daemon.schedule_info()["training"], timeout=5)
    check_consistency(store)
