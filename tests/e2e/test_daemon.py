"""``reinf serve`` as a person runs it, on the demo model: ratings start a round in a child
trainer, the new checkpoint is swapped in between replies, ``reinf train`` goes through
the running server, and a rollback survives a restart. Real processes, real signals."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from conftest import REPO
from daemonkit import (free_port, needs_demo, open_gate, parent_of, reinf,
                       servers,  # noqa: F401 - a fixture
                       wait_for, write_config, write_gated_config)
from reinf.daemon.lock import read_info

pytestmark = [pytest.mark.e2e, needs_demo]


def test_four_ratings_start_a_round_whose_checkpoint_serves_the_next_reply(home, servers):
    write_config(home, schedule={"train_after_ratings": 4})
    server = servers.start(home)
    assert server.served_checkpoint() == "base"
    turns = [server.chat(f"question {i}: what is {i} plus {i}?") for i in range(4)]
    assert {t["checkpoint_id"] for t in turns} == {"base"}
    for turn in turns[:3]:
        server.rate(turn["turn_id"], 5)
    assert server.schedule()["training"] is False and server.runs() == []  # 3 < 4
    server.rate(turns[3]["turn_id"], 5)
    rated = time.monotonic()

    def swapped():
        status = server.status()
        return status if status["model"]["active_checkpoint"] != "base" else None
    status = wait_for(swapped, 120, "the new checkpoint to be swapped in")
    print(f"4th rating -> swapped in: {time.monotonic() - rated:.1f} s")
    new = status["model"]["active_checkpoint"]
    assert status["active_checkpoint"] == new  # the store agrees with the engine
    [run] = server.runs()
    assert run["status"] == "succeeded" and run["trigger"] == "ratings"
    assert run["checkpoint_id"] == new and run["samples"] == 4
    listed = server.call("GET", "/api/checkpoints")
    assert listed["active_checkpoint"] == new
    assert [c["checkpoint_id"] for c in listed["checkpoints"] if c["active"]] == [new]
    assert (home / "checkpoints" / new / "adapter_model.safetensors").is_file()
    reply = server.chat("and what is 2 plus 2?")
    assert reply["checkpoint_id"] == new
    history = server.call("GET", "/api/history")["turns"]
    assert {t["turn_id"]: t["checkpoint_id"] for t in history}[reply["turn_id"]] == new
    assert status["ratings_waiting"] == 0


def test_reinf_train_asks_the_running_server_and_a_second_server_is_refused(home, servers):
    write_gated_config(home)  # the round waits in its reward hook until open_gate
    server = servers.start(home)
    second = reinf(home, "serve", "--port", str(free_port()), timeout=120)
    assert second.returncode == 1, second.stderr
    assert f"another reinf serve (pid {server.pid}, {server.url}) is using" in second.stderr
    assert "REINF_HOME" in second.stderr and "Traceback" not in second.stderr
    assert "loading" not in second.stderr  # refused before the model load
    assert server.status()["daemon"]["pid"] == server.pid  # the first one is unharmed

    server.chat_and_rate(3)
    cli = subprocess.Popen([sys.executable, "-m", "reinf", "train", "--json"], cwd=REPO, env=server.env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        run = server.wait_running_run(60)
        trainer = server.schedule()["trainer_pid"]
        # One trainer: the server's child, holding the train lock the server took for it.
        assert trainer is not None and parent_of(trainer) == server.pid
        assert read_info(home / "train.lock")["pid"] == server.pid
        busy = reinf(home, "train")
        assert busy.returncode == 1
        assert "a round is already running in reinf serve" in busy.stderr
        assert f"run #{run['run_id']}" in busy.stderr
        open_gate(home)
        out, err = cli.communicate(timeout=180)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == 0, err
    result = json.loads(out)
    assert result["status"] == "succeeded" and result["error"] is None
    assert result["run_id"] == run["run_id"] and result["metrics"]["samples"] == 3
    assert result["daemon"]["swapped"] is True and result["daemon"]["pid"] == server.pid
    assert server.served_checkpoint() == result["checkpoint_id"]
    runs = server.runs()
    assert [(r["run_id"], r["trigger"]) for r in runs] == [(run["run_id"], "request")]

    nothing = reinf(home, "train", "--json")
    assert nothing.returncode == 4, nothing.stderr
    assert json.loads(nothing.stdout)["error"] == "nothing_to_train"
    assert len(server.runs()) == 1  # no round, no row

    status = json.loads(reinf(home, "status", "--json").stdout)
    assert status["daemon"]["running"] is True and status["daemon"]["pid"] == server.pid
    assert status["active_checkpoint"] == result["checkpoint_id"]
    assert status["log_file"] == str(home / "logs" / "reinf.log")
    assert (home / "logs" / "reinf.log").stat().st_size > 0


def test_a_rollback_survives_a_restart_and_base_resets(home, servers):
    write_config(home)
    server = servers.start(home)
    first, second = server.train_rounds(2)
    assert server.served_checkpoint() == second
    assert server.call("GET", "/api/checkpoints")["checkpoints"][0]["parent_id"] == first

    answer = server.call("POST", "/api/rollback", {"checkpoint_id": first})
    assert answer["active_checkpoint"] == first and answer["previous_checkpoint"] == second
    assert server.served_checkpoint() == first
    assert server.chat("after the rollback")["checkpoint_id"] == first
    assert server.stop() == 0

    server = servers.start(home)
    assert server.served_checkpoint() == first
    assert server.status()["active_checkpoint"] == first
    assert server.chat("after the restart")["checkpoint_id"] == first
    cli = reinf(home, "rollback", second, "--json")  # through the running server
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout) == {"active_checkpoint": second, "daemon_notified": True}
    assert server.served_checkpoint() == second
    assert server.stop() == 0

    cli = reinf(home, "rollback", "base", "--json")  # no server: the store's choice
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout) == {"active_checkpoint": "base", "daemon_notified": False}
    server = servers.start(home)
    assert server.served_checkpoint() == "base"
    assert server.chat("plain again")["checkpoint_id"] == "base"
    assert server.status()["active_checkpoint"] == "base"
