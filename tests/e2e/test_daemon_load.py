"""``reinf serve`` (demo model) while a round runs: a hung reward hook times out and the run
fails with its reason while chat keeps answering; a few hundred concurrent ratings are
all stored, none answered with a 5xx. Real processes."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

import pytest

from daemonkit import (is_alive, needs_demo, open_gate, read_db,
                       servers,  # noqa: F401 - a fixture
                       wait_for, write_config, write_gated_config)

pytestmark = [pytest.mark.e2e, needs_demo]

HUNG_HOOK = """
import os, pathlib, time

def reward_mapper(score, metadata):
    pathlib.Path(os.environ["REINF_HOME"], "hook.pid").write_text(str(os.getpid()))
    time.sleep(3600)
    return 0.0
"""


def test_a_hung_reward_hook_fails_the_run_with_its_reason_and_chat_stays_up(home, servers):
    home.mkdir(parents=True, exist_ok=True)
    (home / "reward_mapper.py").write_text(HUNG_HOOK)
    write_config(home, rewards={"reward_mapper": "reward_mapper.py:reward_mapper",
                                "hook_timeout_seconds": 1.0},
                 schedule={"train_timeout_minutes": 0.5})
    server = servers.start(home)
    server.chat_and_rate(2)
    server.call("POST", "/api/train", ok=(202,))
    server.wait_running_run(60)
    latencies = []
    while server.schedule()["training"]:  # chat goes on while the hook hangs
        started = time.monotonic()
        reply = server.chat(f"still there? {len(latencies)}", max_new_tokens=8)
        latencies.append(time.monotonic() - started)
        assert reply["checkpoint_id"] == "base"
        time.sleep(0.2)
    result = server.wait_result(60)
    print(f"{len(latencies)} replies during the round; slowest {max(latencies):.2f} s")
    assert latencies and max(latencies) < 10
    assert result["status"] == "failed" and result["error"] == "hook"
    assert "reward hook broken" in result["message"]
    assert "took longer than 1 s" in result["message"], result["message"]
    [run] = server.runs()
    assert run["status"] == "failed" and run["error"] in result["message"]
    status = server.status()
    assert status["last_run"]["error"] == run["error"]
    assert status["active_checkpoint"] == "base" and status["model"]["active_checkpoint"] == "base"
    hook_pid = int((home / "hook.pid").read_text())  # the hook really ran, and is gone
    wait_for(lambda: not is_alive(hook_pid), 10, "the hung hook to be killed")
    assert server.chat("after the round", max_new_tokens=8)["checkpoint_id"] == "base"


def test_hundreds_of_concurrent_ratings_during_a_round_are_all_stored(home, servers):
    # The round waits in its reward hook until half the ratings are answered, then loads
    # the model and runs PPO while the other half arrive.
    write_gated_config(home, ppo={"ppo_epochs": 20}, generation={"max_new_tokens": 8})
    server = servers.start(home)
    turns = [server.chat(f"question {i}")["turn_id"] for i in range(40)]
    for turn_id in turns[:8]:
        server.rate(turn_id, 5)
    server.call("POST", "/api/train", ok=(202,))
    run = server.wait_running_run(60)
    # Each turn gets a sequence of ratings in order (a new rating, then re-ratings); the
    # turns run concurrently. 40 x 8 = 320 requests.
    plans = {t: [(i * 7 + k) % 5 + 1 for k in range(8)] for i, t in enumerate(turns)}
    answers: list[tuple[int, float]] = []
    lock = threading.Lock()

    def rate_in_order(turn_id: int) -> None:
        for k, score in enumerate(plans[turn_id]):
            extra = {"tags": ["too long"], "comment": f"last {score}"} if k == 7 else {}
            response = server.http.put(f"{server.url}/api/turns/{turn_id}/rating",
                                       json={"score": score, **extra}, timeout=60)
            with lock:
                answers.append((response.status_code, time.time()))
                if len(answers) == 160:
                    open_gate(home)

    started = time.time()
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(rate_in_order, turns))
    codes = [code for code, _ in answers]
    assert len(codes) == 320 and set(codes) == {200}, sorted(set(codes))
    result = server.wait_result(180)
    assert result["status"] == "succeeded", result
    finished = datetime.fromisoformat(
        next(r for r in server.runs() if r["run_id"] == run["run_id"])["finished_at"]).timestamp()
    during = sum(1 for _, at in answers if at < finished)
    print(f"320 ratings in {max(at for _, at in answers) - started:.1f} s; "
          f"{during} answered while the round ran")
    assert during >= 160
    db = read_db(home)
    assert db["integrity"] == "ok"
    assert db["ratings"] == {t: plan[-1] for t, plan in plans.items()}
    history = {t["turn_id"]: t["rating"] for t in
               server.call("GET", "/api/history?limit=100")["turns"]}
    for turn_id, plan in plans.items():
        assert history[turn_id]["score"] == plan[-1]
        assert history[turn_id]["tags"] == ["too long"]
        assert history[turn_id]["comment"] == f"last {plan[-1]}"
