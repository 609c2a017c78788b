"""The JSON API against a real waitress server on a loopback port: chat, streaming, rate,
re-rate, undo, history and every error case, over real HTTP.

The chat service is FakeChatService (tests/webui_fakes.py), which stores turns through
the real Store; tests/e2e/test_api_engine.py repeats the core path with the real engine.
"""
from __future__ import annotations

import json
import socket
import threading
import time

import pytest
import requests

from webui_fakes import app, build_daemon, daemon, fake_chat, live, parse_sse  # noqa: F401

pytestmark = pytest.mark.e2e


def post(live, path, body=None, **kw):
    return requests.post(live.url + path, json=body, timeout=10, **kw)


def read_events(response):
    """Yield (event, data) from a streamed SSE response as the bytes arrive."""
    event, data = "message", []
    for line in response.iter_lines(chunk_size=1, decode_unicode=True):
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
        elif not line and data:
            yield event, json.loads("\n".join(data))
            event, data = "message", []


def wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


# --- chat ----------------------------------------------------------------------------

def test_chat_json_and_sse(live, store):
    r = post(live, "/api/chat", {"message": "hello there"})
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/json"
    turn = r.json()
    assert turn["reply"] == "echo: hello there" and store.get_turn(turn["turn_id"])
    r = post(live, "/api/chat", {"message": "go on", "stream": True,
                                 "conversation_id": turn["conversation_id"]})
    assert r.headers["Content-Type"].startswith("text/event-stream")
    assert r.headers.get("Transfer-Encoding") == "chunked"  # not buffered into one body
    events = parse_sse(r.text)
    assert [e for e, _ in events] == ["start", "message", "message", "message", "done"]
    done = events[-1][1]
    assert done["conversation_id"] == turn["conversation_id"] and done["reply"] == "echo: go on"
    assert store.get_turn(done["turn_id"]).index == 2


def test_tokens_reach_the_client_before_generation_ends(live, fake_chat):
    """The fake holds generation after the first token until the test has seen it."""
    fake_chat.gate = threading.Event()
    with requests.post(live.url + "/api/chat", json={"message": "a b c d", "stream": True},
                       stream=True, timeout=10) as r:
        events = read_events(r)
        assert next(events)[0] == "start"
        first = next(events)
        assert first == ("message", {"delta": "echo: "})
        # generation cannot end before the gate opens: the token came while it ran
        assert not fake_chat.gate.is_set() and not fake_chat.finished
        assert fake_chat.first_sent.wait(5)  # the fake is waiting at the gate
        fake_chat.gate.set()
        rest = list(events)
    assert rest[-1][0] == "done" and rest[-1][1]["reply"] == "echo: a b c d"


def test_client_disconnect_stops_generation_and_keeps_the_partial_reply(app, live, fake_chat,
                                                                       store):
    fake_chat.gate = threading.Event()
    fake_chat.delay = 0.02
    words = " ".join(f"w{i}" for i in range(200))
    body = json.dumps({"message": words, "stream": True}).encode()
    sock = socket.create_connection(("127.0.0.1", live.port), timeout=10)
    sock.sendall(b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (len(body), body))
    received = b""
    while b"delta" not in received:
        received += sock.recv(4096)
    assert received.startswith(b"HTTP/1.1 200")
    sock.close()  # the browser's Stop: the connection goes away mid-reply
    fake_chat.gate.set()
    turn = wait_for(lambda: fake_chat.finished and fake_chat.finished[-1])
    assert turn.interrupted
    full = "echo: " + words
    assert full.startswith(turn.reply) and len(turn.reply) < len(full)
    assert store.get_turn(turn.id).interrupted
    assert len(app.extensions["reinf"].streams) == 0


def test_stop_route_ends_the_reply_with_a_stored_interrupted_turn(live, fake_chat, store):
    fake_chat.gate = threading.Event()
    with requests.post(live.url + "/api/chat",
                       json={"message": "one two three four five", "stream": True},
                       stream=True, timeout=10) as r:
        events = read_events(r)
        start = next(events)[1]
        next(events)  # the first delta
        stopped = post(live, f"/api/chat/{start['stream_id']}/stop")
        assert stopped.status_code == 200 and stopped.json()["stopped"] is True
        rest = list(events)
    done = rest[-1][1]
    assert rest[-1][0] == "done" and done["interrupted"] is True
    assert done["reply"] == "echo: " and store.get_turn(done["turn_id"]).interrupted
    assert post(live, f"/api/chat/{start['stream_id']}/stop").status_code == 404


# --- rating and history --------------------------------------------------------------

def test_rate_rerate_undo_and_history(live, store):
    tid = post(live, "/api/chat", {"message": "rate me"}).json()["turn_id"]
    url = f"{live.url}/api/turns/{tid}/rating"
    r = requests.put(url, json={"score": 4, "tags": ["great tone"], "comment": "nice"},
                     timeout=10)
    assert r.status_code == 200 and r.json()["score"] == 4
    history = requests.get(live.url + "/api/history", timeout=10).json()
    row = history["turns"][0]
    assert row["turn_id"] == tid and row["rating"]["tags"] == ["great tone"]
    assert isinstance(row["reward"], float)
    r = requests.put(url, json={"score": 1, "tags": ["wrong"], "critical": True}, timeout=10)
    assert r.json()["score"] == 1 and store.get_turn(tid).rating.critical is True
    low = requests.get(live.url + "/api/history?max_score=2&tag=wrong", timeout=10).json()
    assert [t["turn_id"] for t in low["turns"]] == [tid]
    worse = requests.get(live.url + "/api/history", timeout=10).json()["turns"][0]["reward"]
    assert worse < row["reward"]  # the mapper gives a 1 less than a 4
    r = requests.delete(url, timeout=10)
    assert r.json()["removed"]["score"] == 1 and store.get_turn(tid).rating is None
    assert requests.get(live.url + "/api/history?rated=true", timeout=10).json()["turns"] == []


# --- every error case over HTTP ------------------------------------------------------

@pytest.mark.parametrize("method, path, body, status, needle", [
    ("PUT", "/api/turns/{tid}/rating", {"score": 6}, 400, "score must be a whole number"),
    ("PUT", "/api/turns/{tid}/rating", {"score": "x"}, 400, "score must be"),
    ("PUT", "/api/turns/{tid}/rating", {"score": 3, "tags": {"a": 1}}, 400, "tags must be"),
    ("PUT", "/api/turns/{tid}/rating", {"scor": 3}, 400, "unknown field(s): scor"),
    ("PUT", "/api/turns/999999/rating", {"score": 3}, 404, "no turn 999999"),
    ("DELETE", "/api/turns/999999/rating", None, 404, "no turn 999999"),
    ("PUT", "/api/turns/nope/rating", {"score": 3}, 400, "not a turn: 'nope'"),
    ("DELETE", "/api/turns/999999", None, 404, "no turn 999999"),
    ("GET", "/api/conversations/999999", None, 404, "no conversation 999999"),
    ("POST", "/api/chat", {"message": "x", "conversation_id": 999999}, 404, "no conversation"),
    ("POST", "/api/chat", {"message": "   "}, 400, "empty"),
    ("POST", "/api/chat", {"message": "x", "top_p": 0}, 400, "top_p"),
    ("GET", "/api/history?since=not-a-date", None, 400, "'since' must be a date"),
    ("POST", "/api/rollback", {"checkpoint_id": "nope"}, 404, "no checkpoint nope"),
    ("GET", "/api/unknown", None, 404, "no such page or route: GET /api/unknown"),
    ("PUT", "/api/history", {}, 405, "method PUT is not allowed"),
])
def test_error_cases_are_4xx_json_with_a_message(live, store, method, path, body, status,
                                                 needle):
    tid = store.append_turn(store.create_conversation().id, "q", "a").id
    store.rate(tid, 5)
    r = requests.request(method, live.url + path.format(tid=tid), json=body, timeout=10)
    assert r.status_code == status and r.headers["Content-Type"] == "application/json"
    assert needle in r.json()["error"]
    assert store.get_turn(tid).rating.score == 5  # nothing stored was lost


@pytest.mark.parametrize("raw", [b"{not json", b"[]", b'"just a string"', b"\xff\xfe\x00",
                                 b'{"message": "x"', b""])
def test_malformed_json_is_400(live, raw):
    r = requests.post(live.url + "/api/chat", data=raw, timeout=10,
                      headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]


def test_oversize_bodies_are_413(config, store, fake_chat, daemon):
    from webui import create_app
    from webui.server import BackgroundServer

    app = create_app(config.replace(max_request_bytes=4096), store=store, chat=fake_chat,
                     daemon=daemon)
    with BackgroundServer(app) as server:
        big = {"message": "x" * 10_000}
        r = requests.post(server.url + "/api/chat", json=big, timeout=10)
        assert r.status_code == 413 and "limit is 4096 bytes" in r.json()["error"]

        def chunks():  # no Content-Length: chunked transfer encoding
            for _ in range(10):
                yield b'{"message": "' + b"y" * 1000

        r = requests.post(server.url + "/api/chat", data=chunks(), timeout=10,
                          headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and "limit is 4096 bytes" in r.json()["error"]
        # far past the limit, answered before the rest is read (then closed): JSON still
        r = requests.post(server.url + "/api/chat", data=b"z" * 200_000, timeout=10,
                          headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and r.json()["key"] == "max_request_bytes"
        assert r.headers["Connection"].lower() == "close"
    assert store.counts()["turns"] == 0


def test_long_messages_are_413_with_the_setting_named(config, store, fake_chat, daemon):
    from webui import create_app
    from webui.server import BackgroundServer

    app = create_app(config.replace(max_message_chars=50), store=store, chat=fake_chat,
                     daemon=daemon)
    with BackgroundServer(app) as server:
        r = requests.post(server.url + "/api/chat", json={"message": "m" * 51}, timeout=10)
    assert r.status_code == 413 and r.json()["key"] == "max_message_chars"


def test_status_checkpoints_runs_and_train(live, store, daemon):
    gate = daemon.runner.gate
    gate.clear()
    assert requests.get(live.url + "/api/status", timeout=10).json()["counts"]["turns"] == 0
    assert requests.get(live.url + "/api/checkpoints", timeout=10).json() == {
        "checkpoints": [], "active_checkpoint": "base"}
    assert post(live, "/api/train").status_code == 409  # nothing rated yet
    assert post(live, "/api/train", {"force": True}).status_code == 202
    busy = post(live, "/api/train")
    assert busy.status_code == 409 and "already running" in busy.json()["error"]
    gate.set()
    wait_for(lambda: not requests.get(live.url + "/api/status", timeout=10)
             .json()["training"]["running"])
    assert requests.get(live.url + "/api/runs", timeout=10).json() == {"runs": []}


def test_a_client_of_another_data_directory_refuses_the_server(live, config, tmp_path):
    """A server on the default port serves data directory A; `REINF_HOME=B reinf chat`
    found it there and stored B's chats in A's history. The server names its data
    directory by a random id in /api/ping; a client of B refuses it, in one line."""
    from urllib.parse import urlsplit

    from reinf.config import load_config
    from reinf.errors import ReinfError
    from reinf.daemon.remote import find_server, read_instance_id

    port = urlsplit(live.url).port
    ping = requests.get(live.url + "/api/ping", timeout=10).json()
    assert ping["instance"] == read_instance_id(config.data_dir)
    assert str(config.data_dir) not in json.dumps(ping)  # an id, not the path
    other_home = tmp_path / "other-home"
    other = load_config(environ={"REINF_HOME": str(other_home), "REINF_PORT": str(port)})
    with pytest.raises(ReinfError) as err:
        find_server(other)
    assert f"serves another data directory, not {other_home}" in err.value.message
    assert "--url" in err.value.fix and "REINF_PORT" in err.value.fix
    assert find_server(other, live.url) == live.url  # asked for by name: taken as asked
