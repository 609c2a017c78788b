"""The OpenAI-compatible API with the official openai client, pointed at a real server on
a loopback port: streaming and non-streaming, models, rating a completion by its id, and
how `messages` map onto stored conversations."""
from __future__ import annotations

import pytest
import requests

from webui_fakes import app, build_daemon, daemon, fake_chat, live  # noqa: F401 - fixtures

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.e2e


@pytest.fixture
def client(live):
    return openai.OpenAI(base_url=live.url + "/v1", api_key="not-needed", max_retries=0,
                         timeout=20)


def rate(live, completion_id, score):
    return requests.put(f"{live.url}/api/turns/{completion_id}/rating", json={"score": score},
                        timeout=10)


def test_models(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["reinf-demo"]
    assert client.models.retrieve("reinf-demo").owned_by == "reinf"


def test_non_streaming_completion_is_a_rateable_turn(client, live, store):
    completion = client.chat.completions.create(
        model="anything", messages=[{"role": "system", "content": "be brief"},
                                    {"role": "user", "content": "hello model"}],
        temperature=0, max_tokens=50)
    assert completion.choices[0].message.content == "echo: hello model"
    assert completion.choices[0].finish_reason == "stop"
    turn_id = int(completion.id.removeprefix("chatcmpl-"))
    turn = store.get_turn(turn_id)
    assert turn.reply == "echo: hello model" and turn.gen_params["temperature"] == 0.01
    assert completion.usage.completion_tokens == len(turn.reply_ids)
    r = rate(live, completion.id, 5)
    assert r.status_code == 200 and store.get_turn(turn_id).rating.score == 5


def test_streaming_completion_ends_with_done_and_is_rateable(client, live, store):
    stream = client.chat.completions.create(
        model="reinf-demo", messages=[{"role": "user", "content": "stream this please"}],
        stream=True, stream_options={"include_usage": True})
    chunks = list(stream)  # the client stops at data: [DONE]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "echo: stream this please"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "stop"
    assert chunks[-1].usage.completion_tokens == 4
    turn_id = int(finals[0].id.removeprefix("chatcmpl-"))
    assert store.get_turn(turn_id).reply == text
    # the provisional id of the earlier chunks rates the same turn
    assert chunks[0].id.startswith("chatcmpl-stream-")
    assert rate(live, chunks[0].id, 2).json()["turn_id"] == turn_id
    assert rate(live, finals[0].id, 4).json()["score"] == 4


def test_raw_stream_format(live):
    r = requests.post(live.url + "/v1/chat/completions", timeout=10, json={
        "model": "reinf-demo", "stream": True, "messages": [{"role": "user", "content": "x"}]})
    lines = [line for line in r.text.split("\n") if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"


def test_resent_history_continues_the_same_conversation(client, store):
    first = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "first question"}])
    reply = first.choices[0].message.content
    second = client.chat.completions.create(model="m", messages=[
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "follow-up"}])
    a = store.get_turn(int(first.id.removeprefix("chatcmpl-")))
    b = store.get_turn(int(second.id.removeprefix("chatcmpl-")))
    assert b.conversation_id == a.conversation_id and b.index == 2
    assert store.counts()["conversations"] == 1


def test_unknown_history_is_imported_into_a_new_conversation(client, store):
    completion = client.chat.completions.create(model="m", user="alice", messages=[
        {"role": "user", "content": "earlier q"},
        {"role": "assistant", "content": "earlier a"},
        {"role": "user", "content": "now"}])
    turn = store.get_turn(int(completion.id.removeprefix("chatcmpl-")))
    turns = store.conversation_turns(turn.conversation_id)
    assert [(t.user_message, t.reply, t.model) for t in turns] == [
        ("earlier q", "earlier a", "client-history"), ("now", "echo: now", "fake-echo")]
    assert turns[0].reply_ids == [] and turn.user_id == "alice"


def test_errors_reach_the_client_as_openai_errors(client):
    with pytest.raises(openai.BadRequestError, match="last message must be a non-empty user"):
        client.chat.completions.create(model="m", messages=[
            {"role": "assistant", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="n=1"):
        client.chat.completions.create(model="m", n=2, messages=[
            {"role": "user", "content": "hi"}])
    with pytest.raises(openai.NotFoundError, match="no conversation"):
        client.chat.completions.create(model="m", extra_body={"conversation_id": 4242},
                                       messages=[{"role": "user", "content": "hi"}])


def test_an_auth_token_is_the_api_key(config, store, daemon):
    from webui import create_app
    from webui.server import BackgroundServer
    from webui_fakes import FakeChatService

    app = create_app(config.replace(auth_token="key-42"), store=store,
                     chat=FakeChatService(store), daemon=daemon)
    with BackgroundServer(app) as server:
        wrong = openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
        right = openai.OpenAI(base_url=server.url + "/v1", api_key="key-42", max_retries=0)
        out = right.chat.completions.create(model="m", messages=[{"role": "user",
                                                                   "content": "ok"}])
    assert out.choices[0].message.content == "echo: ok"
