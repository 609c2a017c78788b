"""The web API with the real engine and ChatService on a tiny random Qwen2 (tests/tiny.py):
SSE streaming, the OpenAI client, `reinf chat` over HTTP (reinf.client), and `reinf serve`
as a real process."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import requests

from conftest import clean_env
from enginekit import hold_after_first_token
from webui_fakes import build_daemon  # noqa: F401 - fixture

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("model") / "tiny", seed=3)


@pytest.fixture(scope="module")
def engine(tiny_model, tmp_path_factory):
    from reinf.config import load_config
    from reinf.serving.engine import Engine

    cfg = load_config(environ={"REINF_HOME": str(tmp_path_factory.mktemp("engine-home"))},
                      overrides={"model_path": str(tiny_model), "max_new_tokens": 24})
    return Engine.load(cfg)


@pytest.fixture
def server(engine, config, store, build_daemon):
    from reinf.serving.chat import ChatService
    from webui import create_app
    from webui.server import BackgroundServer

    cfg = config.replace(model_path=engine.config.model.model_path, max_new_tokens=24)
    app = create_app(cfg, store=store, chat=ChatService(engine, store, cfg), engine=engine,
                     daemon=build_daemon(engine, config=cfg))
    with BackgroundServer(app) as running:
        yield running


def sse_events(text: str) -> list[tuple[str, dict]]:
    from webui_fakes import parse_sse

    return parse_sse(text)


def test_streamed_reply_is_stored_with_its_tokens(server, store):
    r = requests.post(server.url + "/api/chat", json={"message": "Hello, how are you?",
                                                      "stream": True}, timeout=60)
    events = sse_events(r.text)
    assert events[0][0] == "start" and events[-1][0] == "done"
    streamed = "".join(d["delta"] for e, d in events if e == "message")
    done = events[-1][1]
    turn = store.get_turn(done["turn_id"])
    assert streamed == done["reply"] == turn.reply
    assert len(turn.reply_ids) == len(turn.logprobs) == done["reply_tokens"] > 0
    assert turn.prompt_ids and all(lp <= 0 for lp in turn.logprobs)
    assert turn.model and done["ttft_ms"] > 0
    r = requests.put(f"{server.url}/api/turns/{turn.id}/rating", json={"score": 5}, timeout=10)
    assert r.status_code == 200
    row = requests.get(server.url + "/api/history", timeout=10).json()["turns"][0]
    assert row["rating"]["score"] == 5 and row["reward"] > 0


def test_an_explored_reply_names_its_style_in_the_stream_and_the_turn(engine, config, store,
                                                                     build_daemon):
    """``explore_styles`` 1: every reply is asked for in a style; the stream's ``done`` and
    the stored turn name it, and the turn keeps the plain prompt."""
    from reinf.serving.chat import ChatService
    from reinf.training.styles import BUILTIN_STYLES
    from webui import create_app
    from webui.server import BackgroundServer

    cfg = config.replace(model_path=engine.config.model.model_path, max_new_tokens=24,
                         explore_styles=1.0)
    app = create_app(cfg, store=store, chat=ChatService(engine, store, cfg), engine=engine,
                     daemon=build_daemon(engine, config=cfg))
    with BackgroundServer(app) as server:
        r = requests.post(server.url + "/api/chat", json={"message": "Hello, how are you?",
                                                          "stream": True}, timeout=60)
        done = sse_events(r.text)[-1][1]
        turn = requests.get(f"{server.url}/api/turns/{done['turn_id']}", timeout=10).json()
        # an OpenAI client is told too: each choice, and a stream's last chunk
        body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "n": 2}
        completion = requests.post(server.url + "/v1/chat/completions", json=body,
                                   timeout=60).json()
        streamed = requests.post(server.url + "/v1/chat/completions",
                                 json={**body, "n": 1, "stream": True}, timeout=60).text
    assert done["style"] in BUILTIN_STYLES and turn["style"] == done["style"]
    assert all(c["style"] in BUILTIN_STYLES for c in completion["choices"])
    last = [json.loads(line[6:]) for line in streamed.splitlines()
            if line.startswith("data: {")][-1]
    assert last["style"] in BUILTIN_STYLES and last["turn_id"]
    stored = store.get_turn(done["turn_id"])
    assert stored.prompt_ids == engine.build_prompt([], "Hello, how are you?",
                                                    max_new_tokens=24)


def test_openai_client_with_the_real_engine(server, store):
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)
    done = client.chat.completions.create(model="m", max_tokens=8,
                                          messages=[{"role": "user", "content": "Why?"}])
    turn = store.get_turn(int(done.id.removeprefix("chatcmpl-")))
    assert done.choices[0].message.content == turn.reply
    assert done.usage.completion_tokens == len(turn.reply_ids) <= 8
    chunks = list(client.chat.completions.create(
        model="m", stream=True, messages=[{"role": "user", "content": "Tell me more"}]))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    turn_id = int(chunks[-1].id.removeprefix("chatcmpl-"))
    assert store.get_turn(turn_id).reply == text
    # the first chunk's id, which clients such as `llm` log, names the same stored turn
    r = requests.put(f"{server.url}/api/turns/{chunks[0].id}/rating", json={"score": 4},
                     timeout=10)
    assert chunks[0].id.startswith("chatcmpl-stream-") and r.json()["turn_id"] == turn_id


def test_reinf_chat_backend_over_http(server, store, engine, monkeypatch):
    from reinf.client import HttpBackend
    from reinf.daemon.remote import probe_server

    assert probe_server(server.url)["service"] == "reinf"
    assert probe_server("http://127.0.0.1:9") is None
    backend = HttpBackend(server.url)
    assert "via " + server.url in backend.describe()
    handle = backend.send_stream("The quick brown fox", None)
    text = "".join(handle)
    turn = handle.result()
    assert turn["reply"] == text == store.get_turn(turn["turn_id"]).reply
    assert turn["conversation_id"] == handle.conversation_id
    assert backend.rate(turn["turn_id"], 4, ["too long"])["score"] == 4
    assert [t["turn_id"] for t in backend.history(handle.conversation_id)] == [turn["turn_id"]]
    assert backend.undo(turn["turn_id"])["score"] == 4
    assert store.get_turn(turn["turn_id"]).rating is None
    # a stopped reply is still stored, marked interrupted
    gate, held = hold_after_first_token(engine, monkeypatch)  # and never samples EOS
    slow = HttpBackend(server.url, generation={"max_new_tokens": 200})
    handle = slow.send_stream("Write a list", handle.conversation_id)
    # wait on the engine, not on a first delta: the detokenizer may hold a token's text
    # back until the next one, which the gate blocks
    assert held.wait(30)
    handle.stop()
    gate.set()
    stopped = handle.result()
    assert stopped["interrupted"] is True and stopped["reply_tokens"] < 200
    from reinf.errors import ReinfError

    with pytest.raises(ReinfError, match="no conversation 4242"):
        backend.send_stream("hi", 4242)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_reinf_serve_process_and_reinf_chat_through_it(tiny_model, home, tmp_path):
    port = free_port()
    env = clean_env(home, REINF_MODEL_PATH=str(tiny_model), REINF_MAX_NEW_TOKENS="16")
    proc = subprocess.Popen([sys.executable, "-m", "reinf", "serve", "--port", str(port),
                             "--no-train"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "Reinf is serving" in line:
                break
        assert any(f"http://127.0.0.1:{port}/" in ln for ln in lines), "".join(lines)
        url = f"http://127.0.0.1:{port}"
        assert requests.get(url + "/api/ping", timeout=10).json()["service"] == "reinf"
        assert requests.get(url + "/", timeout=10).status_code == 200
        out = subprocess.run([sys.executable, "-m", "reinf", "chat", "--once", "Hello there",
                              "--json"], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        reply = json.loads(out.stdout)
        assert "loading" not in out.stderr  # it used the daemon, not a model of its own
        history = requests.get(url + "/api/history", timeout=10).json()["turns"]
        assert [t["turn_id"] for t in history] == [reply["turn_id"]]
        assert history[0]["reply"] == reply["reply"]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        rest = proc.stdout.read()
        proc.stdout.close()
    assert code == 0, rest


def test_reinf_serve_refuses_an_open_host_without_a_token(home, tiny_model):
    env = clean_env(home, REINF_MODEL_PATH=str(tiny_model))
    out = subprocess.run([sys.executable, "-m", "reinf", "serve", "--host", "0.0.0.0"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "auth_token" in out.stderr and "Traceback" not in out.stderr
    assert os.environ.get("REINF_AUTH_TOKEN") is None


def test_reinf_serve_names_a_bad_styles_file_when_exploring(home, tiny_model, tmp_path):
    env = clean_env(home, REINF_MODEL_PATH=str(tiny_model), REINF_EXPLORE_STYLES="0.5",
                    REINF_TRAINING_STYLES_FILE=str(tmp_path / "missing.txt"))
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    out = subprocess.run([sys.executable, "-m", "reinf", "serve", "--port", str(port)],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "training.styles_file" in out.stderr and "Traceback" not in out.stderr
    assert "loading" not in out.stderr  # found before the slow model load


def test_reinf_serve_reports_a_busy_port_before_loading_the_model(home, tiny_model):
    env = clean_env(home, REINF_MODEL_PATH=str(tiny_model))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "reinf", "serve", "--port", str(port)],
                             env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and f"port {port} on 127.0.0.1 is already in use" in out.stderr
    assert "loading" not in out.stderr


def test_a_cut_over_http_keeps_exactly_what_was_shown(server, store, engine, monkeypatch):
    """The server generates ahead of the screen. A terminal that stops a reply keeps only
    the tokens whose text it displayed (POST /api/turns/<id>/cut), and nothing at all when
    nothing was displayed, as the local backend does."""
    from reinf.client import HttpBackend
    from reinf.model.modeling import Detokenizer

    # the random model may end a reply after a token or two; this test needs a long one
    monkeypatch.setattr(engine, "eos_ids", set())
    backend = HttpBackend(server.url, generation={"max_new_tokens": 24})
    handle = backend.send_stream("Tell me a story", None)
    deltas = list(handle)           # the server finished and stored all of it ...
    assert len(deltas) >= 3
    shown = "".join(deltas[:2])     # ... while the screen had shown two deltas
    handle.stop(shown=shown)
    turn = handle.result()
    stored = store.get_turn(turn["turn_id"])
    assert turn["reply"] == stored.reply == shown and stored.interrupted
    assert len(stored.reply_ids) == len(stored.logprobs) < len("".join(deltas))
    text = Detokenizer(engine.tokenizer)
    for token in stored.reply_ids:
        text.add(token)
    assert text.text == shown  # the kept tokens are those of the text shown, no more

    gate, held = hold_after_first_token(engine, monkeypatch)
    handle = backend.send_stream("And another", turn["conversation_id"])
    assert held.wait(30)
    handle.stop(shown="")           # Ctrl-C before any text appeared
    gate.set()
    gone = handle.result()
    assert gone.get("forgotten") is True
    assert [t.id for t in store.history(limit=None)] == [stored.id]

    r = requests.post(f"{server.url}/api/turns/{stored.id}/cut",
                      json={"shown": "not how it starts"}, timeout=10)
    assert r.status_code == 400 and "not the start" in r.json()["error"]
