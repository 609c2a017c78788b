"""The daemon with the real child trainer (``python -m reinf.training.child``) and the real engine,
on a tiny random model: a round is swapped in, and a hung reward hook is killed while
chat goes on."""
from __future__ import annotations

import importlib.util
import os
import time

import pytest
import yaml

import trainkit as tk
from reinf.config import load_config
from reinf.storage.store import Store

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(importlib.util.find_spec("reinf.training.child") is None,
                                 reason="reinf/training/child.py (the child entry point) has not "
                                        "landed yet")]
single_thread = pytest.fixture(autouse=True)(tk.one_thread)

HUNG_HOOK = """
import os, pathlib, time

def reward_mapper(score, metadata):
    pathlib.Path(os.environ["REINF_HOME"], "hook.pid").write_text(str(os.getpid()))
    time.sleep(600)
    return 0.0
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tk.make_model(tmp_path_factory.mktemp("model"))


def write_config(home, model_dir, **rewards):
    """config.yaml in the data dir: the child trainer reads the same file."""
    home.mkdir(parents=True, exist_ok=True)
    data = {"model": {"model_path": str(model_dir), "device": "cpu"},
            "lora": {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": tk.ALL_LINEAR},
            "ppo": {"learning_rate": 2e-3, "batch_size": 8, "ppo_epochs": 2},
            "schedule": {"train_threads": 1, "train_interval_minutes": 0},
            "rewards": {"half_life_days": 0, **rewards}}
    (home / "config.yaml").write_text(yaml.safe_dump(data))
    return load_config(environ={"REINF_HOME": str(home)})


@pytest.fixture
def parts(home, model_dir):
    from reinf.serving.engine import Engine

    made = []

    def build(runner=None, **rewards):
        from reinf.daemon.background import Daemon

        config = write_config(home, model_dir, **rewards)
        store = Store.open(config)
        tk.add_rated_turns(store, tk.load_policy(model_dir), 8, seed=0)
        engine = Engine.load(config)
        daemon = Daemon(config, store, engine, runner=runner and runner(config, store),
                        schedule=False)
        made.append((daemon, store))
        return config, store, engine, daemon.start()
    yield build
    for daemon, store in made:
        daemon.shutdown(timeout=10)
        store.close()


def is_alive(pid: int) -> bool:
    """Running (not a zombie waiting for init to reap it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return not os.path.exists("/proc")


def wait_result(daemon, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = daemon.schedule_info()
        if info["last_result"] is not None and not info["training"]:
            return info["last_result"]
        time.sleep(0.2)
    raise AssertionError(f"no result within {timeout} s: {daemon.schedule_info()}")


def test_a_real_round_is_swapped_into_the_engine(parts):
    from reinf.training.checkpoints import is_complete

    config, store, engine, daemon = parts()
    assert engine.generate([], "hello").checkpoint_id is None
    assert daemon.train_now()["started"] is True
    result = wait_result(daemon, timeout=300)
    assert result["status"] == "succeeded", result
    assert result["swapped"] is True and result["exit_code"] == 0
    ckpt = store.get_checkpoint(result["checkpoint_id"])
    assert is_complete(ckpt.path) and ckpt.active
    assert engine.active_checkpoint_id == ckpt.id
    run = store.get_run(result["run_id"])
    assert run.status == "succeeded" and run.trigger == "request"
    assert run.pid is not None and run.pid != os.getpid()
    assert engine.generate([], "hello again").checkpoint_id == ckpt.id
    assert daemon.schedule_info()["active_checkpoint"] == ckpt.id
    assert store.ratings_waiting() == 0


def test_a_hung_reward_hook_times_out_and_chat_stays_up(parts, home):
    from reinf.daemon.worker import ChildRunner

    (home / "reward_mapper.py").parent.mkdir(parents=True, exist_ok=True)
    (home / "reward_mapper.py").write_text(HUNG_HOOK)
    config, store, engine, daemon = parts(
        # 40 s: the child must load the model and reach the hook first, which takes over
        # 20 s on a loaded 2-core machine
        runner=lambda config, store: ChildRunner(config, store, timeout_seconds=40,
                                                 grace_seconds=2),
        reward_mapper="reward_mapper.py:reward_mapper", hook_timeout_seconds=600)
    assert daemon.train_now()["started"] is True
    replies = 0
    while daemon.schedule_info()["training"]:  # chat goes on while the round hangs
        assert engine.generate([], f"still there? {replies}", max_new_tokens=8).text is not None
        replies += 1
        time.sleep(0.5)
    result = wait_result(daemon, timeout=60)
    assert replies > 0
    assert result["status"] == "failed"
    assert "timed out after 40 s; a reward hook or the model may hang" in result["message"]
    run = store.get_run(result["run_id"])
    assert run.status == "failed" and run.error == result["message"]
    hook_pid = int((home / "hook.pid").read_text())  # the hook really ran, and is gone now
    deadline = time.monotonic() + 10
    while is_alive(hook_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not is_alive(hook_pid)
    assert store.active_checkpoint() is None and engine.active_checkpoint_id is None
    assert engine.generate([], "after the round", max_new_tokens=8).checkpoint_id is None
