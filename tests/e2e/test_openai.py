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
    with pytest.raises(openai.BadRequestError, match="'n' must be between 1 and 8"):
        client.chat.completions.create(model="m", n=9, messages=[
            {"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="'seed' must be between 0 and"):
        client.chat.completions.create(model="m", seed=-1, messages=[
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


# --- system messages ----------------------------------------------------------------------

def turn_of(store, completion):
    return store.get_turn(int(completion.id.removeprefix("chatcmpl-")))


def test_system_and_developer_messages_are_the_conversations_system_prompt(client, store):
    done = client.chat.completions.create(model="m", messages=[
        {"role": "system", "content": "You are a pirate."},
        {"role": "developer", "content": [{"type": "text", "text": "Answer briefly."}]},
        {"role": "user", "content": "ahoy"}])
    turn = turn_of(store, done)
    assert turn.system_prompt == "You are a pirate.\n\nAnswer briefly."
    assert store.get_conversation(turn.conversation_id).system_prompt == turn.system_prompt
    # re-sent with the same system messages: the same conversation goes on
    history = [{"role": "system", "content": "You are a pirate."},
               {"role": "developer", "content": "Answer briefly."},
               {"role": "user", "content": "ahoy"},
               {"role": "assistant", "content": done.choices[0].message.content}]
    again = client.chat.completions.create(model="m", messages=history + [
        {"role": "user", "content": "and then?"}])
    assert turn_of(store, again).conversation_id == turn.conversation_id
    # the same history under another system prompt is another conversation (imported)
    other = client.chat.completions.create(model="m", messages=[
        {"role": "system", "content": "You are a poet."}] + history[2:] + [
        {"role": "user", "content": "and then?"}])
    moved = turn_of(store, other)
    assert moved.conversation_id != turn.conversation_id
    assert moved.system_prompt == "You are a poet." and moved.index == 2
    assert store.conversation_turns(moved.conversation_id)[0].model == "client-history"
    # without system messages a matching conversation goes on, whatever its own
    plain = client.chat.completions.create(model="m", messages=history[2:] + [
        {"role": "user", "content": "and then?"},
        {"role": "assistant", "content": again.choices[0].message.content},
        {"role": "user", "content": "third"}])
    assert turn_of(store, plain).conversation_id in (turn.conversation_id,
                                                     moved.conversation_id)
    assert turn_of(store, plain).index == 3 and store.counts()["conversations"] == 2


def test_an_explicit_conversation_keeps_its_system_prompt_once_it_has_turns(client, store):
    empty = store.create_conversation().id
    done = client.chat.completions.create(
        model="m", extra_body={"conversation_id": empty},
        messages=[{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"}])
    assert turn_of(store, done).system_prompt == "Be terse."  # it had no turns: set
    same = client.chat.completions.create(
        model="m", extra_body={"conversation_id": empty},
        messages=[{"role": "system", "content": "Be terse."}, {"role": "user", "content": "x"}])
    assert turn_of(store, same).index == 2
    with pytest.raises(openai.ConflictError, match="system prompt is fixed"):
        client.chat.completions.create(
            model="m", extra_body={"conversation_id": empty},
            messages=[{"role": "system", "content": "Be long."}, {"role": "user", "content": "y"}])
    assert store.get_conversation(empty).system_prompt == "Be terse."
    assert store.get_conversation(empty).turns == 2


def test_without_system_messages_a_new_conversation_takes_the_configs(config, store, daemon):
    from webui import create_app
    from webui_fakes import FakeChatService

    app = create_app(config.replace(system_prompt="Be helpful."), store=store,
                     chat=FakeChatService(store), daemon=daemon)
    client = app.test_client()
    r = client.post("/v1/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.get_json()
    assert store.get_turn(r.get_json()["turn_id"]).system_prompt == "Be helpful."
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": [
        {"role": "system", "content": ""}, {"role": "user", "content": "hi"}]})
    assert store.get_turn(r.get_json()["turn_id"]).system_prompt is None  # an empty one: none
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": [
        {"role": "system", "content": "s" * 20_000}, {"role": "user", "content": "hi"}]})
    assert r.status_code == 413 and "system messages" in r.get_json()["error"]["message"]
