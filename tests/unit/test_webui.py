"""The Flask app through its test client: routes, JSON shapes, validation and errors.

The chat service is FakeChatService (tests/webui_fakes.py), which stores turns through
the real Store, and training runs in a real Daemon whose round runner is FakeRunner;
everything else is the real app.
"""
from __future__ import annotations

import math
import os

import pytest

from webui_fakes import (app, build_daemon, client, daemon, fake_chat,  # noqa: F401 - fixtures
                         parse_sse, wait_for)


def chat(client, message="hello", **extra):
    r = client.post("/api/chat", json={"message": message, **extra})
    assert r.status_code == 200, r.get_json()
    return r.get_json()


# --- chat ----------------------------------------------------------------------------

def test_chat_returns_the_stored_turn(client, store):
    turn = chat(client, "what is PPO?")
    assert turn["reply"] == "echo: what is PPO?"
    stored = store.get_turn(turn["turn_id"])
    assert stored.reply == turn["reply"] and stored.conversation_id == turn["conversation_id"]
    again = chat(client, "and KL?", conversation_id=turn["conversation_id"])
    assert again["conversation_id"] == turn["conversation_id"] and again["index"] == 2


def test_chat_stream_events_in_order(client, store):
    r = client.post("/api/chat", json={"message": "one two three", "stream": True})
    assert r.status_code == 200 and r.mimetype == "text/event-stream"
    events = parse_sse(r.get_data(as_text=True))
    assert events[0][0] == "start" and "stream_id" in events[0][1]
    deltas = [d["delta"] for e, d in events if e == "message"]
    assert "".join(deltas) == "echo: one two three" and len(deltas) == 4
    kind, done = events[-1]
    assert kind == "done" and done["reply"] == "echo: one two three"
    assert done["conversation_id"] == events[0][1]["conversation_id"]
    assert store.get_turn(done["turn_id"]).reply == done["reply"]


def test_generation_parameters_reach_the_chat_service(client, fake_chat):
    chat(client, "a b c d", temperature=0.5, top_p=0.9, max_new_tokens=2)
    assert fake_chat.calls[-1][2] == {"temperature": 0.5, "top_p": 0.9, "max_new_tokens": 2}


def test_generation_error_mid_stream_becomes_an_error_event(client, fake_chat, store):
    fake_chat.fail_with = RuntimeError("the GPU caught fire")
    r = client.post("/api/chat", json={"message": "hi", "stream": True})
    events = parse_sse(r.get_data(as_text=True))
    assert events[-1][0] == "error" and "GPU caught fire" in events[-1][1]["error"]
    assert store.counts()["turns"] == 0


@pytest.mark.parametrize("body, status, needle", [
    ({}, 400, "missing field 'message'"),
    ({"message": ""}, 400, "empty"),
    ({"message": 5}, 400, "must be a string"),
    ({"message": "x", "stream": "yes"}, 400, "true or false"),
    ({"message": "x", "temperature": 99}, 400, "temperature"),
    ({"message": "x", "max_new_tokens": 1.5}, 400, "whole number"),
    ({"message": "x", "conversation_id": -3}, 400, "conversation_id"),
    ({"message": "x", "conversation_id": 999}, 404, "no conversation 999"),
    ({"message": "x", "colour": "red"}, 400, "unknown field(s): colour"),
])
def test_chat_rejects_bad_input_with_a_clear_message(client, body, status, needle):
    if "message" not in body:
        body = {**body, "stream": False}
    r = client.post("/api/chat", json=body)
    assert r.status_code == status
    assert needle in r.get_json()["error"]


def test_a_message_over_max_message_chars_is_413(config, store, fake_chat, daemon):
    from webui import create_app

    app = create_app(config.replace(max_message_chars=10), store=store, chat=fake_chat,
                     daemon=daemon)
    r = app.test_client().post("/api/chat", json={"message": "x" * 11})
    assert r.status_code == 413
    assert r.get_json()["key"] == "max_message_chars" and "limit is 10" in r.get_json()["error"]


def test_without_a_chat_service_chat_is_501(config, store, daemon):
    from webui import create_app

    client = create_app(config, store=store, daemon=daemon).test_client()
    r = client.post("/api/chat", json={"message": "x"})
    assert r.status_code == 501 and "no model" in r.get_json()["error"]


def test_stop_route_for_an_unknown_stream_is_404(client):
    r = client.post("/api/chat/abc123/stop")
    assert r.status_code == 404 and "no reply in progress" in r.get_json()["error"]


# --- ratings -------------------------------------------------------------------------

def test_rate_rerate_and_undo(client, store):
    turn = chat(client)
    tid = turn["turn_id"]
    r = client.put(f"/api/turns/{tid}/rating",
                   json={"score": 4, "tags": ["needs examples"], "comment": "ok", "critical": True})
    assert r.status_code == 200
    assert r.get_json() | {"created_at": None, "updated_at": None} == {
        "turn_id": tid, "score": 4, "tags": ["needs examples"], "comment": "ok",
        "critical": True, "created_at": None, "updated_at": None}
    r = client.put(f"/api/turns/chatcmpl-{tid}/rating", json={"score": 2})
    assert r.get_json()["score"] == 2 and store.get_turn(tid).rating.tags == []
    r = client.delete(f"/api/turns/{tid}/rating")
    assert r.get_json()["removed"]["score"] == 2 and store.get_turn(tid).rating is None
    assert client.delete(f"/api/turns/{tid}/rating").get_json() == {"removed": None}


@pytest.mark.parametrize("body, needle", [
    ({"score": 7}, "score must be a whole number from 1 to 5"),
    ({"score": 4.5}, "score must be"),
    ({"score": True}, "score must be"),
    ({"score": None}, "missing field 'score'"),
    ({"score": 3, "tags": "x" * 65}, "longer than 64"),
    ({"score": 3, "tags": [1, 2]}, "tags must be a list of strings"),
    ({"score": 3, "critical": "yes"}, "critical must be true or false"),
    ({"score": 3, "comment": 5}, "comment must be text"),
    ({"score": 3, "stars": 5}, "unknown field(s): stars"),
])
def test_bad_ratings_are_400_and_keep_the_stored_rating(client, store, body, needle):
    tid = chat(client)["turn_id"]
    store.rate(tid, 5, tags=["great tone"])
    r = client.put(f"/api/turns/{tid}/rating", json=body)
    assert r.status_code == 400 and needle in r.get_json()["error"]
    assert store.get_turn(tid).rating.score == 5


def test_rating_unknown_or_malformed_turns(client):
    assert client.put("/api/turns/4242/rating", json={"score": 3}).status_code == 404
    assert client.delete("/api/turns/4242/rating").status_code == 404
    r = client.put("/api/turns/abc/rating", json={"score": 3})
    assert r.status_code == 400 and r.get_json()["error"] == "not a turn: 'abc'"
    assert r.get_json()["fix"] == "give `last`, a turn number, or an OpenAI completion id " \
                                  "`chatcmpl-…`"
    r = client.put("/api/turns/chatcmpl-stream-ffff/rating", json={"score": 3})
    assert r.status_code == 400 and "chatcmpl-…" in r.get_json()["fix"]
    r = client.put("/api/turns/chatcmpl-stream-" + "f" * 32 + "/rating", json={"score": 3})
    assert r.status_code == 404 and "reinf history" in r.get_json()["fix"]


def stream_completion(client, text="stream me"):
    """The chunks of a streamed /v1/chat/completions reply, as an OpenAI client reads them."""
    r = client.post("/v1/chat/completions", json={
        "model": "m", "stream": True, "messages": [{"role": "user", "content": text}]})
    assert r.status_code == 200
    return [d for _, d in parse_sse(r.get_data(as_text=True)) if isinstance(d, dict)]


def test_a_streamed_completion_is_rated_by_its_first_chunk_id_after_a_restart(
        config, store, fake_chat, daemon, invoke):
    """The `llm` CLI logs the first chunk's id (chatcmpl-stream-<hex>); the turn id is only
    in the last chunk. A new app (a restarted server) and `reinf rate` both find the turn."""
    from webui import create_app

    chunks = stream_completion(create_app(config, store=store, chat=fake_chat,
                                          daemon=daemon).test_client())
    first, final = chunks[0]["id"], chunks[-1]
    assert first.startswith("chatcmpl-stream-") and final["id"] == f"chatcmpl-{final['turn_id']}"
    restarted = create_app(config, store=store, chat=fake_chat, daemon=daemon).test_client()
    r = restarted.put(f"/api/turns/{first}/rating", json={"score": 2})
    assert r.status_code == 200 and r.get_json()["turn_id"] == final["turn_id"]
    assert restarted.get(f"/api/turns/{first}").get_json()["turn_id"] == final["turn_id"]
    result = invoke("rate", first, "5", "--json")
    assert result.exit_code == 0, result.output
    assert store.get_turn(final["turn_id"]).rating.score == 5
    r = restarted.delete(f"/api/turns/{first}/rating")
    assert r.get_json()["removed"]["turn_id"] == final["turn_id"]


def test_rating_last(client):
    chat(client, "first")
    tid = chat(client, "second")["turn_id"]
    assert client.put("/api/turns/last/rating", json={"score": 5}).get_json()["turn_id"] == tid


def test_daemon_is_notified_of_each_rating(config, store, fake_chat):
    from webui import create_app

    class Daemon:
        notified = 0

        def notify_rating(self):
            self.notified += 1

        def schedule_info(self):
            return {"next_run": "2030-01-01T00:00:00+00:00", "ratings_waiting": 1,
                    "running": True}

    daemon = Daemon()
    client = create_app(config, store=store, chat=fake_chat, daemon=daemon).test_client()
    tid = chat(client)["turn_id"]
    client.put(f"/api/turns/{tid}/rating", json={"score": 3})
    client.put(f"/api/turns/{tid}/rating", json={"score": 9})  # refused: no notification
    assert daemon.notified == 1
    status = client.get("/api/status").get_json()
    assert status["next_run"] == "2030-01-01T00:00:00+00:00" and status["daemon"]["running"]


# --- history, conversations, forget --------------------------------------------------

def test_history_filters(client, store):
    ids = [chat(client, f"message {i}")["turn_id"] for i in range(5)]
    for tid, score, tags in zip(ids, [1, 2, 4, 5], [["wrong"], [], ["too long"], ["wrong"]]):
        store.rate(tid, score, tags=tags)

    def turn_ids(query):
        r = client.get(f"/api/history?{query}")
        assert r.status_code == 200, r.get_json()
        return [t["turn_id"] for t in r.get_json()["turns"]]

    assert turn_ids("") == ids[::-1]
    assert turn_ids("min_score=4") == [ids[3], ids[2]]
    assert turn_ids("max_score=2") == [ids[1], ids[0]]
    assert turn_ids("tag=wrong") == [ids[3], ids[0]]
    assert turn_ids("rated=false") == [ids[4]]
    assert turn_ids("limit=2") == ids[:-3:-1]
    assert turn_ids("since=2999-01-01") == []
    assert turn_ids("until=2000-01-01") == []
    assert turn_ids("since=2000-01-01&until=2999-12-31") == ids[::-1]


def test_history_carries_the_mapped_reward(client, store):
    tid = chat(client)["turn_id"]
    store.rate(tid, 5)
    row = client.get("/api/history").get_json()["turns"][0]
    assert isinstance(row["reward"], float) and row["reward"] > 0


def test_broken_reward_hook_gives_turns_and_hook_error(client, store, config, daemon):
    hook = config.data_dir / "broken.py"
    hook.write_text("def reward_mapper(score, metadata):\n    return 1 / 0\n")
    from webui import create_app

    broken = config.replace(reward_mapper=f"{hook}:reward_mapper")
    c = create_app(broken, store=store, chat=None, daemon=daemon).test_client()
    tid = store.append_turn(store.create_conversation().id, "q", "a").id
    store.rate(tid, 4)
    r = c.get("/api/history")
    assert r.status_code == 200
    data = r.get_json()
    assert data["turns"][0]["turn_id"] == tid and data["turns"][0]["reward"] is None
    assert "ZeroDivisionError" in data["hook_error"] and "broken.py" in data["hook_error"]


def test_status_follows_config_yaml_edited_after_the_server_started(home, store, daemon):
    """The trainer child reads config.yaml afresh each round: /api/status reports the reward
    hook from the file as it is now (as `reinf status` does), says which changed settings
    need a restart, and says in one line when the file no longer loads."""
    from reinf.config import load_config
    from reinf.daemon.status import collect_status
    from webui import create_app

    file = home / "config.yaml"
    file.write_text("rewards:\n  critical_bonus: 0.5\n")
    started = load_config(file, environ={"REINF_HOME": str(home)})
    c = create_app(started, store=store, chat=None, daemon=daemon).test_client()
    s = c.get("/api/status").get_json()
    assert s["reward_hook"]["ok"] is True and s["config_changed"] is None

    hook = home / "broken.py"
    hook.write_text("def reward_mapper(score, metadata):\n    return 1 / 0\n")
    file.write_text(f"model:\n  model_path: {home / 'another-model'}\nrewards:\n"
                    f"  reward_mapper: '{hook}:reward_mapper'\n")
    s = c.get("/api/status").get_json()
    cli = collect_status(load_config(file, environ={"REINF_HOME": str(home)}), store)
    assert cli["reward_hook"]["ok"] is False  # what `reinf status` says
    assert s["reward_hook"]["ok"] is False and s["reward_hook"]["error"] == \
        cli["reward_hook"]["error"] and "broken.py" in s["reward_hook"]["error"]
    change = s["config_changed"]
    assert change["restart_needed"] == ["model_path"]
    assert "reward_mapper" in change["next_round"]
    assert s["model"]["model_path"] == started.model.model_path  # what the server serves
    notice = [w for w in s["warnings"] if "changed since the server started" in w]
    assert len(notice) == 1 and "model_path" in notice[0] and "restart" in notice[0]
    assert notice[0] == change["message"] and notice[0] in s["schedule"]["warnings"]
    assert 'id="config-changed"' in c.get("/training").get_data(as_text=True)

    file.write_text("rewards:\n  critical_bonus: [0.5\n")  # no longer YAML
    r = c.get("/api/status")
    assert r.status_code == 200
    change = r.get_json()["config_changed"]
    assert change["error"] and "line" in change["error"] and "\n" not in change["message"]
    assert change["message"] in r.get_json()["warnings"]


def test_a_reward_hook_runs_only_for_turns_it_has_not_mapped(store, config, daemon,
                                                              monkeypatch):
    from reinf.rewards import hooks
    from webui import create_app
    from webui.reports import map_rewards

    runs = []  # items per hook child process
    run_hook = hooks.run_hook

    def counted(spec, source, items, *args, **kwargs):
        runs.append(len(items))
        return run_hook(spec, source, items, *args, **kwargs)

    monkeypatch.setattr(hooks, "run_hook", counted)
    hook = config.data_dir / "mapper.py"
    hook.write_text("def reward_mapper(score, metadata):\n    return score / 10\n")
    cfg = config.replace(reward_mapper=f"{hook}:reward_mapper")
    client = create_app(cfg, store=store, daemon=daemon).test_client()
    conv = store.create_conversation().id
    a, b = (store.append_turn(conv, f"q{i}", "a").id for i in range(2))
    store.rate(a, 4)
    store.rate(b, 2)

    def rewards():
        data = client.get("/api/history").get_json()
        assert data["hook_error"] is None
        return {t["turn_id"]: t["reward"] for t in data["turns"]}

    assert rewards() == {a: 0.4, b: 0.2} and runs == [2]
    assert rewards() == {a: 0.4, b: 0.2} and runs == [2]  # no new child process
    assert client.get(f"/api/turns/{a}").get_json()["reward"] == 0.4 and runs == [2]
    store.rate(b, 5)  # a re-rated turn is mapped again, and only it
    assert rewards() == {a: 0.4, b: 0.5} and runs == [2, 1]
    hook.write_text("def reward_mapper(score, metadata):\n    return -score / 10\n")
    mtime = hook.stat().st_mtime_ns + 10**9  # a later mtime even on a coarse clock
    os.utime(hook, ns=(mtime, mtime))
    assert rewards() == {a: -0.4, b: -0.5} and runs == [2, 1, 2]
    assert rewards() == {a: -0.4, b: -0.5} and runs == [2, 1, 2]
    os.utime(hook, ns=(mtime + 10**9, mtime + 10**9))  # touched, same bytes: same version
    assert rewards() == {a: -0.4, b: -0.5} and runs == [2, 1, 2]
    clipped, _ = map_rewards(cfg.replace(reward_min=-0.45), store.history(limit=None))
    assert {k: v["reward"] for k, v in clipped.items()} == {a: -0.4, b: -0.45}
    assert runs == [2, 1, 2, 2]  # another setting: another cache entry


def test_the_reward_cache_is_bounded_and_entries_expire():
    from webui.reports import RewardCache

    now = [0.0]
    cache = RewardCache(size=2, max_age=60, clock=lambda: now[0])
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # now the most recently used
    cache.put("c", 3)
    assert len(cache) == 2 and cache.get("b") is None and cache.get("a") == 1
    now[0] = 61.0
    assert cache.get("a") is None and cache.get("c") is None and len(cache) == 0


@pytest.mark.parametrize("query, needle", [
    ("limit=abc", "'limit' must be a whole number"), ("limit=0", "between 1"),
    ("min_score=9", "'min_score'"), ("min_score=4&max_score=2", "above max_score"),
    ("since=yesterday", "'since' must be a date"), ("rated=maybe", "true or false"),
    ("conversation_id=x", "conversation_id"),
])
def test_history_rejects_bad_queries(client, query, needle):
    r = client.get(f"/api/history?{query}")
    assert r.status_code == 400 and needle in r.get_json()["error"]


def test_conversations_list_open_and_forget(client, store):
    a = chat(client, "first topic")
    chat(client, "more", conversation_id=a["conversation_id"])
    b = chat(client, "second topic")
    listed = client.get("/api/conversations").get_json()["conversations"]
    assert [c["conversation_id"] for c in listed] == [b["conversation_id"], a["conversation_id"]]
    assert listed[1]["title"] == "first topic" and listed[1]["turns"] == 2
    opened = client.get(f"/api/conversations/{a['conversation_id']}").get_json()
    assert [t["user_message"] for t in opened["turns"]] == ["first topic", "more"]
    r = client.delete(f"/api/conversations/{a['conversation_id']}")
    assert r.get_json()["forgotten"]["turns"] == 2
    assert client.get(f"/api/conversations/{a['conversation_id']}").status_code == 404
    r = client.delete(f"/api/turns/{b['turn_id']}")
    assert r.get_json()["forgotten"]["turns"] == 1 and store.counts()["turns"] == 0
    assert client.delete(f"/api/turns/{b['turn_id']}").status_code == 404


# --- training, checkpoints, status ---------------------------------------------------

def add_checkpoints(store, tmp_path):
    """Two complete checkpoint directories (the daemon refuses to roll back to one that
    would not load), ckpt-2 active."""
    from reinf.training.checkpoints import REQUIRED

    for name in ("c1", "c2"):
        (tmp_path / name).mkdir()
        for file in REQUIRED:
            (tmp_path / name / file).write_text("x")
    store.add_checkpoint("ckpt-1", str(tmp_path / "c1"), metrics={"reward_mean": 0.1})
    store.add_checkpoint("ckpt-2", str(tmp_path / "c2"), parent_id="ckpt-1",
                         metrics={"reward_mean": 0.4, "kl": float("nan")})
    store.activate_checkpoint("ckpt-2")


def test_checkpoints_and_rollback_swap_the_engine(config, store, fake_chat, tmp_path,
                                                  build_daemon):
    from webui import create_app

    class Engine:
        swaps = []
        active_checkpoint_id = None

        def request_swap(self, checkpoint_id, path=None):
            self.swaps.append((checkpoint_id, path))
            self.active_checkpoint_id = checkpoint_id

        def describe(self):
            return {"model_name": "fake"}

        warnings: list = []

    add_checkpoints(store, tmp_path)
    engine = Engine()
    client = create_app(config, store=store, chat=fake_chat, engine=engine,
                        daemon=build_daemon(engine)).test_client()
    data = client.get("/api/checkpoints").get_json()
    assert data["active_checkpoint"] == "ckpt-2"
    assert data["checkpoints"][0]["metrics"]["kl"] is None  # NaN is not JSON
    r = client.post("/api/rollback", json={})
    assert r.get_json()["active_checkpoint"] == "ckpt-1"
    assert engine.swaps[-1] == ("ckpt-1", str(tmp_path / "c1"))
    r = client.post("/api/rollback", json={"checkpoint_id": "base"})
    assert r.get_json()["active_checkpoint"] == "base" and engine.swaps[-1] == (None, None)
    assert store.active_checkpoint() is None
    r = client.post("/api/rollback", json={})
    assert r.status_code == 409 and "already active" in r.get_json()["error"]
    r = client.post("/api/rollback", json={"checkpoint_id": "nope"})
    assert r.status_code == 404
    r = client.post("/api/rollback", json={"checkpoint_id": 5})
    assert r.status_code == 400


def test_rollback_takes_a_unique_prefix_of_a_checkpoint_id(client, store, tmp_path):
    add_checkpoints(store, tmp_path)  # ckpt-1, ckpt-2 (active)
    r = client.post("/api/rollback", json={"checkpoint_id": "ckpt-"})
    assert r.status_code == 400
    assert r.get_json()["error"] == ("checkpoint id 'ckpt-' is ambiguous: 2 checkpoints "
                                     "start with it (ckpt-1, ckpt-2)")
    assert store.active_checkpoint().id == "ckpt-2"
    r = client.post("/api/rollback", json={"checkpoint_id": "ckpt-1"})
    assert r.status_code == 200 and r.get_json()["active_checkpoint"] == "ckpt-1"
    store.add_checkpoint("r0005-20261125-030648-8ce1", str(tmp_path / "c2"))
    r = client.post("/api/rollback", json={"checkpoint_id": "r0005"})
    assert r.get_json()["active_checkpoint"] == "r0005-20261125-030648-8ce1"
    assert store.active_checkpoint().id == "r0005-20261125-030648-8ce1"
    r = client.post("/api/rollback", json={"checkpoint_id": "r0009"})
    assert r.status_code == 404 and r.get_json()["fix"] == "list them with `reinf checkpoints`"


def test_rollback_to_an_incomplete_checkpoint_is_refused(client, store, tmp_path):
    add_checkpoints(store, tmp_path)
    (tmp_path / "c1" / "metrics.json").unlink()  # as a crash mid-write would leave it
    r = client.post("/api/rollback", json={})
    assert r.status_code == 409 and "missing or incomplete" in r.get_json()["error"]
    assert store.active_checkpoint().id == "ckpt-2"


def test_train_now_runs_one_round_at_a_time(client, daemon, store):
    runner = daemon.runner
    runner.gate.clear()
    nothing = client.post("/api/train")
    assert nothing.status_code == 409 and "nothing new to train on" in nothing.get_json()["error"]
    store.rate(chat(client)["turn_id"], 4)
    assert client.post("/api/train").status_code == 202
    r = client.post("/api/train", json={})
    assert r.status_code == 409 and "already running" in r.get_json()["error"]
    assert client.get("/api/status").get_json()["training"]["running"] is True
    runner.gate.set()
    assert wait_for(lambda: not client.get("/api/status").get_json()["training"]["running"])
    state = client.get("/api/status").get_json()["training"]
    assert state["running"] is False and state["last_result"]["message"] == "nothing to learn"
    assert runner.calls == ["request"]


def test_train_now_goes_to_the_daemon(config, store, fake_chat):
    from webui import create_app

    class Daemon:
        busy = False

        def train_now(self, force=False):
            if self.busy:
                return {"started": False, "reason": "a round is already running"}
            return {"started": True, "via": "daemon", "force": force}

        def notify_rating(self):
            pass

    daemon = Daemon()
    client = create_app(config, store=store, chat=fake_chat, daemon=daemon).test_client()
    r = client.post("/api/train", json={"force": True})
    assert r.status_code == 202 and r.get_json() == {"started": True, "via": "daemon",
                                                     "force": True}
    daemon.busy = True
    r = client.post("/api/train")
    assert r.status_code == 409 and r.get_json()["error"] == "a round is already running"
    assert client.post("/api/train", json={"force": "yes"}).status_code == 400


def test_runs_and_stats(client, store):
    run = store.start_run("manual")
    store.finish_run(run.id, "succeeded", metrics={"reward_mean": 0.25, "kl": 0.01},
                     samples=3, checkpoint_id="ckpt-9")
    failed = store.start_run("schedule")
    store.finish_run(failed.id, "failed", error="boom", metrics={"reward_mean": math.nan})
    runs = client.get("/api/runs").get_json()["runs"]
    assert [r["status"] for r in runs] == ["failed", "succeeded"]
    tid = chat(client)["turn_id"]
    store.rate(tid, 4)
    stats = client.get("/api/stats").get_json()
    assert [p["reward_mean"] for p in stats["reward_curve"]] == [0.25]
    assert stats["rating_by_checkpoint"] == [
        {"checkpoint_id": "base", "ratings": 1, "mean_rating": 4.0,
         "first_reply_at": stats["rating_by_checkpoint"][0]["first_reply_at"]}]


def test_status_reports_counts(client, store):
    chat(client)
    s = client.get("/api/status").get_json()
    assert s["counts"]["turns"] == 1 and s["active_checkpoint"] == "base"
    assert s["training"]["running"] is False and s["training"]["last_result"] is None
    assert s["training"]["method"] == "rollouts" and s["training"]["last_mode"] is None


# --- pages and errors ----------------------------------------------------------------

@pytest.mark.parametrize("path, needle", [
    ("/", 'id="transcript"'), ("/history", 'id="history-table"'),
    ("/training", 'id="reward-chart"')])
def test_pages_render_with_the_csrf_token_and_no_inline_script(client, path, needle):
    r = client.get(path)
    html = r.get_data(as_text=True)
    assert r.status_code == 200 and needle in html
    guard = client.application.extensions["reinf"].guard
    assert f'<meta name="csrf-token" content="{guard.csrf_token}">' in html
    assert "<script>" not in html  # CSP: scripts come from /static only
    assert "default-src 'self'" in r.headers["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert r.headers["Referrer-Policy"] == "no-referrer"


def test_static_files_and_favicon(client):
    for name in ("common.js", "chat.js", "rating.js", "history.js", "training.js", "charts.js",
                 "style.css", "favicon.svg"):
        r = client.get(f"/static/{name}")
        assert r.status_code == 200 and len(r.data) > 100, name
        r.close()
    assert client.get("/favicon.ico").status_code == 301


def test_static_scripts_never_write_html():
    from pathlib import Path

    import webui

    for js in (Path(webui.__file__).parent / "static").glob("*.js"):
        source = js.read_text(encoding="utf-8")
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert sink not in source, f"{js.name} uses {sink}"


def test_errors_are_json_under_api_and_html_elsewhere(client):
    r = client.get("/api/nothing-here")
    assert r.status_code == 404 and r.get_json()["error"].startswith("no such page or route")
    r = client.delete("/api/history")
    assert r.status_code == 405 and "GET" in r.get_json()["fix"]
    r = client.get("/v1/nothing")
    assert r.status_code == 404 and r.get_json()["error"]["type"] == "not_found_error"
    r = client.get("/no-page")
    assert r.status_code == 404 and r.mimetype == "text/html"
    assert "no such page" in r.get_data(as_text=True)


def test_an_unexpected_exception_is_a_logged_500_json(config, store, daemon, caplog):
    from webui import create_app

    class Exploding:
        def send(self, *a, **k):
            raise ValueError("bug")

        stream = send

    client = create_app(config, store=store, chat=Exploding(), daemon=daemon).test_client()
    r = client.post("/api/chat", json={"message": "x"})
    assert r.status_code == 500 and "ValueError" in r.get_json()["error"]
    assert any("unexpected error" in rec.message for rec in caplog.records)


@pytest.mark.parametrize("data, needle", [
    ("{bad json", "not valid JSON"), ("[1, 2]", "must be a JSON object"),
    ("", "body is empty"), ("\xff\xfe", "not valid JSON"),
    ('{"message": "x"' * 1, "not valid JSON"), ("[" * 5000 + "]" * 5000, "JSON")])
def test_malformed_bodies_are_400(client, data, needle):
    r = client.post("/api/chat", data=data.encode("latin-1"), content_type="application/json")
    assert r.status_code in (400, 413) and needle in r.get_json()["error"]


def test_non_utf8_body_is_400(client):
    r = client.post("/api/chat", data=b'{"message": "\xff"}', content_type="application/json")
    assert r.status_code == 400 and "not UTF-8" in r.get_json()["error"]


# --- a conversation's system prompt ----------------------------------------------------

def test_a_new_conversation_takes_the_system_prompt_sent_with_its_first_message(client, store,
                                                                                fake_chat):
    turn = chat(client, "hi", system_prompt="Answer like a pirate.")
    assert fake_chat.system_prompts[-1] == "Answer like a pirate."
    assert turn["system_prompt"] == "Answer like a pirate."
    cid = turn["conversation_id"]
    opened = client.get(f"/api/conversations/{cid}").get_json()
    assert opened["conversation"]["system_prompt"] == "Answer like a pirate."
    assert opened["turns"][0]["system_prompt"] == "Answer like a pirate."
    listed = client.get("/api/conversations").get_json()["conversations"]
    assert listed[0]["system_prompt"] == "Answer like a pirate."
    [row] = client.get(f"/api/history?conversation_id={cid}").get_json()["turns"]
    assert row["system_prompt"] == "Answer like a pirate."          # the history view's
    # the same one again is fine; another, once the conversation has a turn, is a conflict
    chat(client, "more", conversation_id=cid, system_prompt="Answer like a pirate.")
    r = client.post("/api/chat", json={"message": "x", "conversation_id": cid,
                                       "system_prompt": "Be formal."})
    assert r.status_code == 409 and "system prompt is fixed" in r.get_json()["error"]
    assert store.get_conversation(cid).system_prompt == "Answer like a pirate."
    assert store.get_conversation(cid).turns == 2
    # without one, nothing is sent to the service (it applies the config's)
    plain = chat(client, "plain")
    assert fake_chat.system_prompts[-1] is None and plain["system_prompt"] is None


def test_chat_refuses_a_bad_system_prompt(config, store, fake_chat, daemon, client):
    from webui import create_app

    r = client.post("/api/chat", json={"message": "x", "system_prompt": 5})
    assert r.status_code == 400 and r.get_json()["key"] == "system_prompt"
    small = create_app(config.replace(max_message_chars=10), store=store, chat=fake_chat,
                       daemon=daemon).test_client()
    r = small.post("/api/chat", json={"message": "x", "system_prompt": "y" * 11})
    assert r.status_code == 413 and "'system_prompt' is 11 characters" in r.get_json()["error"]
    assert store.counts()["conversations"] == 0


def test_put_or_patch_sets_the_system_prompt_only_before_the_first_turn(client, store):
    cid = store.create_conversation().id
    for method, value, stored in [("PATCH", "Be terse.", "Be terse."), ("PUT", None, None),
                                  ("PUT", "  Be kind.  ", "Be kind."), ("PATCH", "", None),
                                  ("PATCH", "Be kind.", "Be kind.")]:
        r = client.open(f"/api/conversations/{cid}", method=method,
                        json={"system_prompt": value})
        assert r.status_code == 200, r.get_json()
        assert r.get_json()["conversation"]["system_prompt"] == stored
    assert client.get(f"/api/conversations/{cid}").get_json()["conversation"][
        "system_prompt"] == "Be kind."
    turn = chat(client, "hi", conversation_id=cid)
    assert turn["system_prompt"] == "Be kind."
    r = client.patch(f"/api/conversations/{cid}", json={"system_prompt": "Be rude."})
    assert r.status_code == 409 and r.get_json()["key"] == "system_prompt"
    assert "already has 1 turn" in r.get_json()["error"] and r.get_json()["fix"]
    assert store.get_conversation(cid).system_prompt == "Be kind."
    for body, status, needle in [({}, 400, "nothing to change"),
                                 ({"title": "x"}, 400, "unknown field(s): title"),
                                 ({"system_prompt": ["x"]}, 400, "must be a string")]:
        r = client.patch(f"/api/conversations/{cid}", json=body)
        assert r.status_code == status and needle in r.get_json()["error"]
    assert client.patch("/api/conversations/999", json={"system_prompt": "x"}).status_code == 404
    assert client.put("/api/conversations/x", json={"system_prompt": "x"}).status_code == 400


def test_the_chat_page_offers_the_configured_system_prompt(config, store, fake_chat, daemon):
    import json as jsonlib
    import re

    from webui import create_app

    app = create_app(config.replace(system_prompt="Be <brief>."), store=store, chat=fake_chat,
                     daemon=daemon)
    html = app.test_client().get("/").get_data(as_text=True)
    assert 'id="system-prompt"' in html and 'id="system-shown"' in html
    data = re.search(r'<script type="application/json" id="page-data">(.*?)</script>', html)
    assert jsonlib.loads(data.group(1))["system_prompt"] == "Be <brief>."
    assert "<brief>" not in html  # escaped inside the JSON
