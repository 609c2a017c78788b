"""The child-trainer runner with fake children: real processes, real signals, real rows.

Each fake child is a short Python script that does what ``python -m reinf.training.child`` does
to the store (a run row with its own pid, a checkpoint, the JSON last line) and then
misbehaves in one way. The runner code under test is the one the daemon uses; only the
command differs.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from reinf.daemon.lock import acquire_train_lock
from reinf.daemon.worker import ChildRunner, describe_seconds, describe_signal, interpret

FAKE = textwrap.dedent("""
    import json, os, signal, sys, time
    if sys.argv[1] == "ignore-term":  # first thing, so the runner's SIGTERM finds it set
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from reinf.config import load_config
    from reinf.storage.store import Store
    action, trigger = sys.argv[1], sys.argv[2]
    if action == "crash-early":
        raise RuntimeError("cannot import the model library")
    cfg = load_config()
    store = Store(cfg.db_url, migrate=False)
    run = store.start_run(trigger, pid=os.getpid())
    print("working on run", run.id, file=sys.stderr, flush=True)
    if action == "hang":
        time.sleep(120)
    elif action == "sigkill":
        os.kill(os.getpid(), 9)
    elif action == "ignore-term":
        time.sleep(120)
    elif action == "succeed":
        ckpt = "r0001-test"
        path = cfg.data_dir / "checkpoints" / ckpt
        path.mkdir(parents=True)
        for name in ("adapter_config.json", "adapter_model.safetensors",
                     "value_head.safetensors", "trainer_state.pt", "metrics.json"):
            (path / name).write_text("x")
        store.add_checkpoint(ckpt, str(path))
        store.activate_checkpoint(ckpt)
        store.finish_run(run.id, "succeeded", checkpoint_id=ckpt, metrics={"kl": 0.01})
        print(json.dumps({"run_id": run.id, "status": "succeeded", "checkpoint_id": ckpt,
                          "metrics": {"kl": 0.01}, "message": "checkpoint is active"}))
    elif action == "settings":
        store.finish_run(run.id, "rejected", error="inspecting")
        print(json.dumps({"run_id": run.id, "status": "rejected", "checkpoint_id": None,
                          "metrics": {"nice": os.getpriority(os.PRIO_PROCESS, 0),
                                      "pgid": os.getpgid(0), "pid": os.getpid(),
                                      "omp": os.environ.get("OMP_NUM_THREADS"),
                                      "train_nice": os.environ.get("REINF_TRAIN_NICE"),
                                      "home": os.environ.get("REINF_HOME")},
                          "message": "rejected"}))
        sys.exit(3)
""")


def make_runner(config, store, action: str, **kw) -> ChildRunner:
    kw.setdefault("timeout_seconds", 30)
    kw.setdefault("grace_seconds", 1.0)
    return ChildRunner(config, store, command=lambda trigger, force: [
        sys.executable, "-c", FAKE, action, trigger], **kw)


def test_success_reads_the_json_result(config, store):
    outcome = make_runner(config, store, "succeed").run("ratings")
    assert outcome.status == "succeeded" and outcome.exit_code == 0
    assert outcome.checkpoint_id == "r0001-test" and outcome.metrics == {"kl": 0.01}
    run = store.get_run(outcome.run_id)
    assert run.status == "succeeded" and run.pid == outcome.pid and run.trigger == "ratings"


def test_a_hung_child_times_out_and_its_run_fails_with_the_reason(config, store):
    started = time.monotonic()
    outcome = make_runner(config, store, "hang", timeout_seconds=3).run("ratings")
    assert time.monotonic() - started < 15
    assert outcome.status == "failed" and "timed out after 3 s" in outcome.message
    run = store.get_run(outcome.run_id)
    assert run.pid == outcome.pid and run.status == "failed"
    assert "reward hook or the model may hang" in run.error
    assert not _alive(outcome.pid)


def test_a_child_ignoring_sigterm_is_killed(config, store):
    runner = make_runner(config, store, "ignore-term", timeout_seconds=2)
    outcome = runner.run("interval")
    assert outcome.status == "failed" and outcome.exit_code == -signal.SIGKILL
    assert store.get_run(outcome.run_id).status == "failed"


def test_a_child_killed_by_sigkill_is_recorded_as_out_of_memory(config, store):
    outcome = make_runner(config, store, "sigkill").run("ratings")
    assert outcome.status == "failed" and outcome.exit_code == -9
    run = store.get_run(outcome.run_id)
    assert run.status == "failed" and run.pid == outcome.pid
    assert run.error == "killed by signal 9 (SIGKILL) — out of memory? (the kernel's OOM " \
                        "killer sends SIGKILL)"


def test_a_child_that_dies_before_its_row_still_leaves_a_failed_run(config, store):
    outcome = make_runner(config, store, "crash-early").run("request")
    assert outcome.status == "failed" and outcome.exit_code == 1
    assert "cannot import the model library" in outcome.message
    run = store.get_run(outcome.run_id)
    assert run.status == "failed" and run.trigger == "request" and run.pid == outcome.pid
    assert "RuntimeError: cannot import the model library" in run.error
    assert [r.status for r in store.list_runs()] == ["failed"]


def test_a_trainer_that_cannot_start_is_a_failed_run(config, store, tmp_path):
    runner = ChildRunner(config, store, command=lambda t, f: [str(tmp_path / "missing")])
    outcome = runner.run("ratings")
    assert outcome.status == "failed" and "could not start the trainer" in outcome.message
    run = store.get_run(outcome.run_id)
    assert run.status == "failed" and run.error == outcome.message and run.pid is None


def test_the_child_is_niced_thread_limited_and_in_its_own_group(config, store):
    cfg = config.replace(train_nice=7, train_threads=2)
    outcome = make_runner(cfg, store, "settings").run("request")
    assert outcome.status == "rejected" and outcome.exit_code == 3
    m = outcome.metrics
    assert m["nice"] == max(7, os.getpriority(os.PRIO_PROCESS, 0))
    assert m["pgid"] == m["pid"] != os.getpgid(0)
    assert m["omp"] == "2" and m["train_nice"] == "0" and m["home"] == str(cfg.data_dir)


def test_stop_terminates_the_child_and_records_shutdown(config, store):
    import threading

    runner = make_runner(config, store, "hang")
    result = {}
    thread = threading.Thread(target=lambda: result.update(out=runner.run("ratings")))
    thread.start()
    deadline = time.monotonic() + 20
    while runner.current_run_id() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    run_id = runner.current_run_id()
    assert run_id is not None
    runner.stop("stopped at shutdown")
    thread.join(15)
    assert result["out"].status == "failed" and result["out"].run_id == run_id
    assert store.get_run(run_id).error == "stopped at shutdown"
    assert runner.run("ratings").status == "skipped"  # a stopped runner starts nothing


def test_a_round_held_elsewhere_is_not_started_twice(config, store):
    held = acquire_train_lock(config, trigger="manual")
    try:
        outcome = make_runner(config, store, "succeed").run("ratings")
    finally:
        held.release()
    assert outcome.status == "skipped" and f"pid {os.getpid()}" in outcome.message
    assert outcome.held_by == os.getpid()
    assert store.list_runs() == []


def test_a_full_disk_at_the_start_of_a_round_does_not_leak_the_train_lock(config, store,
                                                                         monkeypatch):
    import errno

    from reinf.daemon import lock as lock_mod
    from reinf.errors import StoreError

    real_pwrite = os.pwrite

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(lock_mod.os, "pwrite", full)
    with pytest.raises(StoreError) as err:
        acquire_train_lock(config, trigger="manual")
    assert str(err.value) == (f"no space left on device in {config.data_dir} — free some "
                              "space, then try again")
    outcome = make_runner(config, store, "succeed").run("request")  # "Train now", disk full
    assert outcome.status == "failed" and "no space left on device" in outcome.message
    assert "\n" not in outcome.message
    monkeypatch.setattr(lock_mod.os, "pwrite", real_pwrite)  # space is back
    outcome = make_runner(config, store, "succeed").run("request")
    assert outcome.status == "succeeded", outcome.message


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_the_child_dies_with_a_killed_server(config, home, tmp_path):
    """kill -9 of the server must not leave a trainer that later activates a checkpoint."""
    from conftest import clean_env

    parent = textwrap.dedent(f"""
        import sys, threading
        from reinf.config import load_config
        from reinf.storage.store import Store
        from reinf.daemon.worker import ChildRunner
        cfg = load_config()
        store = Store.open(cfg)
        runner = ChildRunner(cfg, store, command=lambda t, f: [sys.executable, "-c",
                             {FAKE!r}, "hang", t])
        threading.Thread(target=runner.run, args=("ratings",), daemon=True).start()
        import time
        while runner.pid is None:
            time.sleep(0.02)
        print(runner.pid, flush=True)
        time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True,
                            env=clean_env(home))
    try:
        child = int(proc.stdout.readline())
        assert _alive(child)
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_interpret_and_describe():
    assert interpret(0, ["noise\n", '{"status": "succeeded", "run_id": 3, '
                     '"checkpoint_id": "c", "message": "ok"}\n'], [], None).checkpoint_id == "c"
    bad = interpret(2, ["not json\n"], ["Traceback", "ValueError: x"], None)
    assert bad.status == "failed" and bad.message.endswith("ValueError: x")
    lying = interpret(1, [json.dumps({"status": "succeeded", "message": "?"})], [], None)
    assert lying.status == "failed" and lying.to_dict()["error"] == "error"
    hook = interpret(5, [json.dumps({"status": "failed", "message": "reward hook broken: x",
                                     "error": "hook"})], [], None)
    assert hook.to_dict()["error"] == "hook" and hook.to_dict()["exit_code"] == 5
    nothing = interpret(4, [json.dumps({"status": "skipped", "message": "nothing new",
                                        "error": "nothing_to_train"})], [], None)
    assert nothing.status == "skipped" and nothing.to_dict()["error"] == "nothing_to_train"
    assert interpret(0, ['{"status": "succeeded", "error": null}'], [], None
                     ).to_dict()["error"] is None
    assert interpret(-9, [], [], None).to_dict()["error"] == "error"
    assert describe_signal(11) == "killed by signal 11 (SIGSEGV)"
    assert describe_seconds(30 * 60) == "30 minutes" and describe_seconds(6) == "6 s"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def test_the_trainer_child_trains_the_model_the_server_serves(tmp_path):
    """config.yaml switched to another model while the server runs: the server keeps the
    model it loaded until a restart, and so must the trainer child (it reads config.yaml
    afresh each round), or it would train an adapter the served model cannot load."""
    from reinf.config import load_config
    from reinf.daemon.worker import build_child_env

    home = tmp_path / "home"
    home.mkdir()
    served = load_config(environ={"REINF_HOME": str(home)},
                         overrides={"model_path": "/models/served"})
    (home / "config.yaml").write_text("model:\n  model_path: /models/edited-since\n")
    env = build_child_env(served, base={"PATH": os.environ.get("PATH", "")})
    child = load_config(environ=env)
    assert child.model.model_path == "/models/served"
    assert child.data_dir == served.data_dir


def test_the_progress_bars_start_again_for_each_pass_of_a_round(capsys):
    """A round of several passes (training.rollout_iterations) reports its rollouts and PPO
    stages once per pass: each pass restarts the stage's bar, named with the pass."""
    from reinf.training.child import ProgressBar

    bar = ProgressBar()
    for i in (1, 2):
        mark = {"iteration": i, "iterations": 2}
        bar({"stage": "rollouts", "done": 0, "total": 8, **mark})
        bar({"stage": "rollouts", "done": 8, "total": 8, **mark})
        bar({"stage": "update", "done": 0, "total": 4, **mark})
        bar({"stage": "update", "done": 4, "total": 4, "epoch": 2, "epochs": 2, "kl": 0.01,
             "approx_kl": 0.001, "loss": 0.5, **mark})
    assert bar.bars["rollouts"].n == 8 and bar.bars["update"].n == 4
    bar.close()
    err = capsys.readouterr().err
    assert err.count("sampling fresh replies") == 1  # the stage's line, once
    for name in ("rollouts 1/2", "rollouts 2/2", "PPO 1/2", "PPO 2/2"):
        assert name in err, err
