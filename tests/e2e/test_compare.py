"""Compare with the real engine on a tiny random Qwen2 (tests/tiny.py) and random LoRA
checkpoints: borrowed adapters give exactly the replies of the adapter they name and leave
the active one in place; /api/compare + pick stores the right winner and loser checkpoints;
predicted scores come from the active checkpoint's rating model; `reinf compare` stores a
pair without a server (the model in-process)."""
from __future__ import annotations

import socket
import threading

import pytest
import requests

from tiny import make_adapter, make_tiny_model
from webui_fakes import build_daemon  # noqa: F401 - fixture

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("compare") / "tiny", seed=5)


@pytest.fixture(scope="module")
def engine(tiny, tmp_path_factory):
    from reinf.config import load_config
    from reinf.serving.engine import Engine

    cfg = load_config(environ={"REINF_HOME": str(tmp_path_factory.mktemp("engine-home"))},
                      overrides={"model_path": str(tiny), "max_new_tokens": 12})
    return Engine.load(cfg)


def add_checkpoint(store, tiny, root, checkpoint_id: str, seed: int, *,
                   rating_model: bool = False):
    """A checkpoint directory as a round writes it (the adapter, the other files as
    placeholders), recorded in the store."""
    from reinf.training.checkpoints import REQUIRED

    path = make_adapter(tiny, root / checkpoint_id, seed=seed)
    for name in REQUIRED:
        if not (path / name).exists():
            (path / name).write_text("{}")
    store.add_checkpoint(checkpoint_id, str(path))
    return path


def write_rating_model(engine, path) -> None:
    """A rating model that fits the tiny model's features (4 x hidden + 1)."""
    import torch
    from safetensors.torch import save_file

    from reinf.training.rating_model import fit_rating_model

    features = engine.rating_features([([1, 2, 3], [4, 5]), ([1, 2], [6, 7, 8]),
                                       ([3, 4], [9]), ([5], [10, 11])])
    model = fit_rating_model(features, [1, 3, 4, 5], heads=3, cross_validate=False)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              str(path / "rating_model.safetensors"))
    assert torch.isfinite(model.predict(features)[0]).all()


@pytest.fixture
def served(engine, store, tiny, tmp_path):
    """The store's active checkpoint r0001 (with a rating model), served by the engine;
    r0002 another checkpoint. The engine goes back to the base after the test."""
    path = add_checkpoint(store, tiny, tmp_path, "r0001-test", seed=1)
    add_checkpoint(store, tiny, tmp_path, "r0002-test", seed=2)
    write_rating_model(engine, path)
    store.activate_checkpoint("r0001-test")
    engine.request_swap("r0001-test", path)
    yield engine
    engine.request_swap(None, None)


def sample(engine, prompt, adapter=None, seed=7):
    params = engine.generation_params(seed=seed)
    return engine.stream_prompt(prompt, params, adapter=adapter).wait()


def test_a_borrowed_adapter_serves_one_reply_and_the_active_one_stays(served, store, tmp_path):
    engine = served
    prompt = engine.build_prompt([], "Tell me about the sea")
    active = sample(engine, prompt)
    base = sample(engine, prompt, engine.borrow(None))
    other = sample(engine, prompt, engine.borrow("r0002-test", tmp_path / "r0002-test"))
    assert (active.checkpoint_id, base.checkpoint_id, other.checkpoint_id) == \
        ("r0001-test", None, "r0002-test")
    assert engine.active_checkpoint_id == "r0001-test"
    assert "r0002-test" not in engine._adapters.names  # loaded for its reply alone
    # the same seed through the active adapter again: the very same reply
    assert sample(engine, prompt).reply_ids == active.reply_ids
    # and the base, borrowed, is exactly the base served (the log-probs tell adapters apart)
    engine.request_swap(None, None)
    assert sample(engine, prompt).logprobs == base.logprobs
    engine.request_swap("r0001-test", tmp_path / "r0001-test")
    assert base.logprobs != active.logprobs != other.logprobs


def test_chats_during_a_comparison_keep_the_active_adapter(served, store, tmp_path):
    engine = served
    from reinf.serving.compare import build_comparison

    prompt = engine.build_prompt([], "Hello")
    done = []

    def chat():
        for _ in range(4):
            done.append(sample(engine, prompt, seed=None).checkpoint_id)
    thread = threading.Thread(target=chat)
    thread.start()
    comparison = build_comparison(engine, store, engine.config, prompt="Hello",
                                  checkpoint="r0002")
    thread.join(60)
    assert done == ["r0001-test"] * 4
    assert sorted(c.checkpoint_id or "" for c in comparison.replies) == \
        ["", "r0001-test", "r0002-test"]


@pytest.fixture
def server(served, config, store, build_daemon):
    from reinf.serving.chat import ChatService
    from webui import create_app
    from webui.server import BackgroundServer

    engine = served
    cfg = config.replace(model_path=engine.config.model.model_path, max_new_tokens=12)
    app = create_app(cfg, store=store, chat=ChatService(engine, store, cfg), engine=engine,
                     daemon=build_daemon(engine, config=cfg))
    with BackgroundServer(app) as running:
        yield running


def test_compare_and_pick_store_the_winner_and_the_loser(server, store):
    r = requests.post(server.url + "/api/compare", json={"prompt": "Why is the sky blue?"},
                      timeout=120)
    assert r.status_code == 200, r.text
    shown = r.json()
    assert shown["blind"] is True and [c["slot"] for c in shown["replies"]] == ["A", "B"]
    assert all("checkpoint_id" not in c for c in shown["replies"])  # blind
    assert all(1 <= c["predicted_score"] <= 5 for c in shown["replies"])  # r0001's model
    r = requests.post(f"{server.url}/api/compare/{shown['compare_id']}/pick",
                      json={"winner": "b"}, timeout=10)
    picked = r.json()
    assert picked["picked"] == "B"
    revealed = {c["slot"]: c["checkpoint_id"] for c in picked["replies"]}
    assert sorted(revealed.values()) == ["base", "r0001-test"]
    pair, = store.list_pairs()
    assert (pair.source, pair.outcome, pair.blind) == ("compare", "b", True)
    assert (pair.a_checkpoint_id or "base", pair.b_checkpoint_id or "base") == \
        (revealed["A"], revealed["B"])
    assert pair.b_text == shown["replies"][1]["text"] and pair.prompt == "Why is the sky blue?"
    assert pair.prompt_ids and pair.a_reply_ids and pair.b_reply_ids
    assert picked["pairs"] == [pair.to_dict()]
    again = requests.post(f"{server.url}/api/compare/{shown['compare_id']}/pick",
                          json={"winner": "A"}, timeout=10)
    assert again.status_code == 409 and store.counts()["pairs"] == 1


def test_compare_three_checkpoints_not_blind_on_a_turns_prompt(server, store):
    turn = requests.post(server.url + "/api/chat", json={"message": "The quick brown fox"},
                         timeout=60).json()
    r = requests.post(server.url + "/api/compare", json={
        "turn_id": turn["turn_id"], "checkpoint": "r0002", "blind": False}, timeout=120)
    shown = r.json()
    assert [(c["slot"], c["checkpoint_id"], c["role"]) for c in shown["replies"]] == \
        [("A", "base", "base"), ("B", "r0001-test", "active"), ("C", "r0002-test", "checkpoint")]
    assert shown["prompt"] == "The quick brown fox"
    r = requests.post(f"{server.url}/api/compare/{shown['compare_id']}/pick",
                      json={"winner": "C", "reveal": False}, timeout=10)
    assert all("checkpoint_id" not in c for c in r.json()["replies"])
    assert all(set(p) == {"pair_id", "outcome"} for p in r.json()["pairs"])
    pairs = store.list_pairs()
    assert sorted((p.a_checkpoint_id or "base", p.b_checkpoint_id, p.outcome) for p in pairs) == \
        [("base", "r0002-test", "b"), ("r0001-test", "r0002-test", "b")]
    assert {p.prompt_turn_id for p in pairs} == {turn["turn_id"]}
    listed = requests.get(server.url + "/api/pairs?checkpoint_id=r0002-test", timeout=10).json()
    assert listed["count"] == 2
    # forgetting the turn takes the comparisons of its prompt along
    gone = requests.delete(f"{server.url}/api/turns/{turn['turn_id']}", timeout=10).json()
    assert gone["forgotten"]["pairs"] == 2 and store.counts()["pairs"] == 0


@pytest.mark.parametrize("body,status,words", [
    ({"prompt": "hi", "checkpoint": "base"}, 400, "bare base"),
    ({"prompt": "hi", "checkpoint": "r0001"}, 400, "active one"),
    ({"prompt": "hi", "checkpoint": "r9"}, 404, "no checkpoint"),
    ({"prompt": "hi", "checkpoint": "r000"}, 400, "ambiguous"),
    ({"prompt": "  "}, 400, "empty"),
    ({"prompt": "hi", "blind": "yes"}, 400, "blind"),
])
def test_compare_refuses_bad_input_in_one_line(server, store, body, status, words):
    r = requests.post(server.url + "/api/compare", json=body, timeout=60)
    assert r.status_code == status and words in r.json()["error"]
    assert store.counts()["pairs"] == 0


def test_compare_on_the_bare_base_says_what_to_do(server, engine, store):
    store.activate_checkpoint(None)  # as the engine: else the daemon's reconcile swaps back
    engine.request_swap(None, None)
    r = requests.post(server.url + "/api/compare", json={"prompt": "hi"}, timeout=60)
    assert r.status_code == 409 and "train" in r.json()["fix"]


# --- reinf compare --------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_reinf_compare_without_a_server_stores_a_pair(tiny, home, store, invoke, monkeypatch):
    import json

    add_checkpoint(store, tiny, home / "checkpoints", "r0001-cli", seed=4)
    store.activate_checkpoint("r0001-cli")
    monkeypatch.setenv("REINF_MODEL_PATH", str(tiny))
    monkeypatch.setenv("REINF_MAX_NEW_TOKENS", "6")
    monkeypatch.setenv("REINF_PORT", str(free_port()))  # no server answers there
    result = invoke("compare", "Hello there", input="maybe\nb\n")
    assert result.exit_code == 0, result.output
    assert "--- A ---" in result.output and "--- B ---" in result.output
    assert "'maybe' is not an answer" in result.output
    assert "stored 1 pair (B is better)" in result.output
    pair, = store.list_pairs()
    assert pair.outcome == "b" and pair.source == "compare"
    assert {pair.a_checkpoint_id, pair.b_checkpoint_id} == {None, "r0001-cli"}
    assert f"B: {pair.b_checkpoint_id or 'base'}" in result.output
    out = json.loads(invoke("compare", "Hi", "--no-blind", "--pick", "tie", "--json").stdout)
    assert out["picked"] == "tie" and out["replies"][0]["checkpoint_id"] == "base"
    assert store.list_pairs()[0].outcome == "tie" and store.counts()["pairs"] == 2
    skipped = invoke("compare", "Hi", input="\n")
    assert "skipped: nothing stored" in skipped.output and store.counts()["pairs"] == 2


# --- alternatives over HTTP, with the real engine -------------------------------------------

def test_again_and_pick_through_reinf_chats_http_backend(server, store, engine):
    from reinf.client import HttpBackend

    backend = HttpBackend(server.url)
    first = backend.send_stream("Hello there", None)
    first_text = "".join(first)
    first_turn = first.result()
    again = backend.send_again(first_turn["turn_id"])
    again_text = "".join(again)
    again_turn = again.result()
    assert again_turn["reply"] == again_text and again_turn["index"] == first_turn["index"]
    assert (again_turn["picked"], again_turn["alternatives"]) == (True, 2)
    picked = backend.pick(first_turn["turn_id"])
    assert picked["turn"]["picked"] and [p["outcome"] for p in picked["pairs"]] == ["a"]
    nxt = backend.send_stream("What next?", first.conversation_id)
    "".join(nxt)
    stored = store.get_turn(nxt.result()["turn_id"])
    assert stored.prompt_ids == engine.build_prompt([("Hello there", first_text)], "What next?",
                                                    system=stored.system_prompt)


def test_openai_client_n_2_gives_two_rateable_choices(server, store):
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)
    done = client.chat.completions.create(model="m", n=2, max_tokens=6,
                                          messages=[{"role": "user", "content": "Why?"}])
    ids = [c.model_extra["id"] for c in done.choices]
    assert len(set(ids)) == 2 and ids[0] == done.id
    for completion_id, score in zip(ids, (5, 1)):
        r = requests.put(f"{server.url}/api/turns/{completion_id}/rating", json={"score": score},
                         timeout=10)
        assert r.status_code == 200
    scores = [store.get_turn(int(i.removeprefix("chatcmpl-"))).rating.score for i in ids]
    assert scores == [5, 1]
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="m", n=9,
                                       messages=[{"role": "user", "content": "Why?"}])
    assert "'n' must be between 1 and 8" in str(bad.value)


def test_n_choices_with_a_seed_differ_and_repeat(server, store):
    """``n`` choices with a ``seed`` are n samples, not n copies of one, and the same request
    gives the same choices again (streamed or not); the choices after the first are
    alternatives of its turn, not picked."""
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)
    body = dict(model="m", n=4, max_tokens=8, seed=11, temperature=1.0,
                messages=[{"role": "user", "content": "Tell me a story"}])
    first = [c.message.content for c in client.chat.completions.create(**body).choices]
    again = client.chat.completions.create(**body)
    assert [c.message.content for c in again.choices] == first
    assert len(set(first)) >= 3, first
    turns = [store.get_turn(int(c.model_extra["id"].removeprefix("chatcmpl-")))
             for c in again.choices]
    assert [t.picked for t in turns] == [True, False, False, False]
    assert len({t.index for t in turns}) == 1 and turns[0].alternatives == 4
    streamed = ["", "", "", ""]
    for chunk in client.chat.completions.create(stream=True, **body):
        for choice in chunk.choices:
            streamed[choice.index] += choice.delta.content or ""
    assert streamed == first


def test_reinf_compare_through_a_running_server(server, store, invoke):
    import json

    result = invoke("compare", "Why is the sea salty?", "--url", server.url, "--checkpoint",
                    "r0002", "--pick", "C", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["picked"] == "C" and len(out["pairs"]) == 2
    winner = next(r["checkpoint_id"] for r in out["replies"] if r["slot"] == "C")
    pairs = store.list_pairs()
    assert all((p.b_checkpoint_id or "base") == winner and p.outcome == "b" for p in pairs)
    bad = invoke("compare", "Hi", "--url", server.url, "--pick", "d")
    assert bad.exit_code == 1 and "'d' is not an answer" in bad.output
    assert store.counts()["pairs"] == 2
