"""Crash safety of ``reinf serve`` (demo model): ``kill -9`` mid-round, again and again, loses
no rating, leaves an intact database, never loads a half-written checkpoint, and the
restarted server serves the last good checkpoint; SIGTERM mid-reply and mid-round stops
cleanly. Real processes, real signals."""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import time

import pytest
import requests

from daemonkit import (is_alive, needs_demo, read_db, servers,  # noqa: F401 - a fixture
                       wait_for, write_config, write_gated_config)
from reinf.daemon.lock import is_held
from reinf.training.checkpoints import is_complete

pytestmark = [pytest.mark.e2e, needs_demo]
KILL_POINTS = ("run row written", "checkpoint being written", "random moment")


def tmp_dirs(home) -> list[str]:
    root = home / "checkpoints"
    return sorted(p.name for p in root.glob(".tmp-*")) if root.exists() else []


def freeze_at(server, trainer: int, point: str, rng: random.Random) -> str:
    """Wait until the round reaches ``point``, then SIGSTOP the trainer there, so that the
    server's kill -9 finds it exactly at that point; returns what was seen."""
    if point == "random moment":
        time.sleep(rng.uniform(0.0, 1.5))
    elif point == "checkpoint being written":
        old = set(tmp_dirs(server.home))
        deadline = time.monotonic() + 60
        while not set(tmp_dirs(server.home)) - old:  # it lives for some milliseconds
            if not is_alive(trainer) or time.monotonic() > deadline:
                point += ": not seen"
                break
            time.sleep(0.001)
    try:
        os.kill(trainer, signal.SIGSTOP)
    except ProcessLookupError:
        return f"{point}: the round was already over"
    return point


def test_kill_9_mid_round_repeatedly_loses_nothing(home, servers):
    write_config(home, ppo={"ppo_epochs": 8})
    rng = random.Random(7)
    server = servers.start(home)
    acknowledged: dict[int, int] = {}  # every rating the API confirmed: turn -> score
    for turn in server.chat_and_rate(3, score=5):
        acknowledged[turn] = 5
    server.call("POST", "/api/train", ok=(202,))
    first = server.wait_result(120)
    assert first["status"] == "succeeded", first
    good = first["checkpoint_id"]
    seen, interrupted = [], 0
    for point in KILL_POINTS:
        score = rng.randint(1, 5)
        for turn in server.chat_and_rate(2, score=score, prefix=point):
            acknowledged[turn] = score
        server.call("POST", "/api/train", {"force": True}, ok=(202,))
        run = server.wait_running_run(60)
        trainer = wait_for(lambda: server.schedule()["trainer_pid"], 10, "the trainer's pid")
        late = server.chat("rated during the round")["turn_id"]
        server.rate(late, 2)
        acknowledged[late] = 2
        seen.append(freeze_at(server, trainer, point, rng))
        server.kill()
        # The trainer dies with the server (PR_SET_PDEATHSIG): no orphan finishes the round.
        wait_for(lambda: not is_alive(trainer), 10, f"the trainer (pid {trainer}) to die")
        db = read_db(home)
        assert db["integrity"] == "ok"
        assert db["ratings"] == acknowledged  # all of them, with their last score
        row = next(r for r in db["runs"] if r["id"] == run["run_id"])
        left = tmp_dirs(home)
        seen[-1] += f"; left behind: {left or 'nothing'}"

        server = servers.start(home)
        after = {r["run_id"]: r for r in server.runs()}[run["run_id"]]
        served = server.served_checkpoint()
        if row["status"] == "running":  # killed mid-round
            interrupted += 1
            assert after["status"] == "failed" and after["error"].startswith("interrupted")
        # The last good checkpoint: the one served before, or this round's own if the
        # kill came after it was published and activated (a complete, promoted one).
        expected = {good} | {c["id"] for c in db["checkpoints"]
                             if c["run_id"] == run["run_id"] and c["status"] == "promoted"}
        assert served in expected, (served, expected, row)
        assert server.status()["active_checkpoint"] == served
        assert is_complete(home / "checkpoints" / served)
        assert not any(served in name for name in left)  # never a half-written one
        assert server.status()["counts"]["ratings"] == len(acknowledged)
        good = served
    print("kill points reached:", seen)
    assert interrupted >= 2, seen  # the random moment may come too late, the others do not

    # A half-written checkpoint left by a dead writer is never loaded, and the next round
    # removes it.
    dead = trainer
    fake = home / "checkpoints" / f".tmp-r0099-20300101-000000-beef-{dead}-abcdef"
    shutil.copytree(home / "checkpoints" / good, fake)
    assert not is_complete(fake)
    assert server.chat("still there?")["checkpoint_id"] == good
    for turn in server.chat_and_rate(2, score=4, prefix="after the crashes"):
        acknowledged[turn] = 4
    before = server.schedule()["last_result"]
    server.call("POST", "/api/train", ok=(202,))
    final = server.wait_result(120, after=before)
    assert final["status"] == "succeeded", final
    assert server.served_checkpoint() == final["checkpoint_id"]
    assert tmp_dirs(home) == []
    assert final["checkpoint_id"] in {c["checkpoint_id"] for c in
                                      server.call("GET", "/api/checkpoints")["checkpoints"]}
    assert server.stop() == 0
    db = read_db(home)
    assert db["integrity"] == "ok" and db["ratings"] == acknowledged
    assert not [r for r in db["runs"] if r["status"] == "running"]


def test_sigterm_mid_reply_and_mid_round_stops_cleanly(home, servers):
    write_gated_config(home)  # the round waits in its reward hook: never over too soon
    server = servers.start(home)
    server.chat_and_rate(4)
    server.call("POST", "/api/train", ok=(202,))
    run = server.wait_running_run(60)
    trainer = wait_for(lambda: server.schedule()["trainer_pid"], 10, "the trainer's pid")
    response = server.http.post(server.url + "/api/chat", json={
        "message": "tell me a long story", "stream": True, "max_new_tokens": 400},
        stream=True, timeout=60)
    assert response.status_code == 200
    events, text, signalled = [], [], None
    lines = response.iter_lines(decode_unicode=True)
    event = None
    try:
        for line in lines:
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                events.append((event, data))
                if event is None and "delta" in data:
                    text.append(data["delta"])
                    if signalled is None:  # mid-reply: the first token is out
                        server.proc.send_signal(signal.SIGTERM)
                        signalled = time.monotonic()
            elif not line:
                event = None
    except requests.RequestException as exc:  # the reply must end with "done", not a reset
        raise AssertionError(f"the stream broke: {exc}; events {events[-3:]}")
    assert signalled is not None, events
    code = server.proc.wait(timeout=60)
    stopped_in = time.monotonic() - signalled
    print(f"SIGTERM -> exit: {stopped_in:.2f} s")
    assert code == 0, server.output()[-2000:]
    assert stopped_in < 30
    done = [data for name, data in events if name == "done"]
    assert len(done) == 1, events[-3:]
    wait_for(lambda: not is_alive(trainer), 10, f"the trainer (pid {trainer}) to stop")
    assert not is_held(home / "reinf.pid") and not is_held(home / "train.lock")
    db = read_db(home)
    assert db["integrity"] == "ok"
    row = next(r for r in db["runs"] if r["id"] == run["run_id"])
    assert row["status"] == "failed" and row["error"] == "stopped at shutdown", row
    import sqlite3

    conn = sqlite3.connect(home / "reinf.db")
    try:
        reply, interrupted = conn.execute("SELECT reply, interrupted FROM turns WHERE id = ?",
                                          (done[0]["turn_id"],)).fetchone()
    finally:
        conn.close()
    assert reply == "".join(text) == done[0]["reply"]  # finished, or cut and stored as such
    assert bool(interrupted) == done[0]["interrupted"]


def test_a_damaged_active_checkpoint_falls_back_to_its_nearest_intact_ancestor(home, servers):
    """A truncated adapter in the active checkpoint: the restarted server serves its parent
    (not the base model), records that choice, and says which and why; when the parent's
    adapter_config.json is garbage too, the base model."""
    write_config(home)
    server = servers.start(home)
    first, second = server.train_rounds(2)
    assert server.served_checkpoint() == second
    assert server.stop() == 0
    adapter = home / "checkpoints" / second / "adapter_model.safetensors"
    adapter.write_bytes(adapter.read_bytes()[: adapter.stat().st_size // 2])
    assert is_complete(adapter.parent)  # every file is there; one of them is cut short

    server = servers.start(home)
    assert server.served_checkpoint() == first
    status = server.status()
    assert status["active_checkpoint"] == first and read_db(home)["active"] == first
    warnings = status["schedule"]["warnings"]  # the daemon's (also in `reinf status`)
    why = [w for w in warnings if f"checkpoint {second} could not be loaded" in w]
    assert why and f"serving {first}, the nearest intact ancestor of {second}" in why[0], \
        warnings
    assert server.chat("after the fallback")["checkpoint_id"] == first
    assert server.stop() == 0

    (home / "checkpoints" / first / "adapter_config.json").write_text("{ not json")
    server = servers.start(home)
    assert server.served_checkpoint() == "base" and read_db(home)["active"] is None
    assert any(f"checkpoint {first} could not be loaded" in w and "the base model" in w
               for w in server.schedule()["warnings"])
    assert server.stop() == 0


def test_a_published_checkpoint_without_its_row_is_adopted_or_removed(home, servers):
    """A kill between a round's rename and its store transaction leaves a checkpoint
    directory with no row. At the next start a complete one whose run exists is recorded
    as promoted but not active; one that cannot be (files missing, run unknown) is
    removed; directories with a row and names Reinf does not write are left alone."""
    write_config(home)
    server = servers.start(home)
    (good,) = server.train_rounds(1)
    run_id = server.runs()[0]["run_id"]
    assert server.stop() == 0
    root = home / "checkpoints"

    def publish_unrecorded(name: str, *, run: int, drop: str | None = None):
        shutil.copytree(root / good, root / name)
        metrics = json.loads((root / name / "metrics.json").read_text())
        metrics.update(checkpoint_id=name, parent_id=good, run_id=run)
        (root / name / "metrics.json").write_text(json.dumps(metrics))
        if drop:
            (root / name / drop).unlink()

    orphan = "r0002-20300101-000000-aaaa"
    publish_unrecorded(orphan, run=run_id)
    publish_unrecorded("r0003-20300101-000000-bbbb", run=run_id, drop="trainer_state.pt")
    publish_unrecorded("r0004-20300101-000000-cccc", run=9999)  # its run is not in the DB
    (root / "my-notes").mkdir()  # not a name Reinf writes

    server = servers.start(home)
    assert server.served_checkpoint() == good  # the adopted one is not made active
    listed = {c["checkpoint_id"]: c for c in server.call("GET", "/api/checkpoints")["checkpoints"]}
    assert listed[orphan]["status"] == "promoted" and not listed[orphan]["active"]
    assert listed[orphan]["parent_id"] == good
    assert not set(listed) & {"r0003-20300101-000000-bbbb", "r0004-20300101-000000-cccc"}
    assert sorted(p.name for p in root.iterdir()) == sorted([good, orphan, "my-notes"])
    assert any(f"checkpoint {orphan} was written but not recorded" in w
               for w in server.schedule()["warnings"])
    answer = server.call("POST", "/api/rollback", {"checkpoint_id": orphan})
    assert answer["active_checkpoint"] == orphan and server.served_checkpoint() == orphan
    assert server.stop() == 0
    server = servers.start(home)  # nothing left to adopt: no warning, nothing removed
    assert not any("was written but not recorded" in w for w in server.schedule()["warnings"])
    assert server.served_checkpoint() == orphan
