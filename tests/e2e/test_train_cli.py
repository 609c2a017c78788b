"""`reinf train` and `python -m reinf.training.child`: messages, --json, exit codes."""
import json
import subprocess
import sys

import pytest
import yaml

import trainkit as tk
from conftest import REPO, clean_env
from reinf.config import load_config
from reinf.storage.store import Store
from reinf.training.outcome import RoundOutcome

pytestmark = pytest.mark.e2e
single_thread = pytest.fixture(autouse=True)(tk.one_thread)
DOCUMENTED_METRICS = {"reward_mean", "kl", "approx_kl", "clipfrac", "policy_loss", "value_loss",
                  "explained_variance", "entropy", "samples", "seconds"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tk.make_model(tmp_path_factory.mktemp("model"))


def write_config(home, model_path, **ppo):
    """config.yaml in the data dir, as a person would write it."""
    home.mkdir(parents=True, exist_ok=True)
    data = {"model": {"model_path": str(model_path), "device": "cpu"},
            "lora": {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": tk.ALL_LINEAR},
            "ppo": {"learning_rate": 2e-3, "batch_size": 8, "ppo_epochs": 2, **ppo},
            "rewards": {"half_life_days": 0},
            # The CLI's mechanics on a fixed batch (exit codes, --json, the bar's 2/2): PPO on
            # the rated replies; rollout rounds are tests/e2e/test_rollouts.py's.
            "training": {"method": "rated"}}
    (home / "config.yaml").write_text(yaml.safe_dump(data))
    return load_config(environ={"REINF_HOME": str(home)})


def add_turns(config, model_dir, n=8, seed=0):
    store = Store.open(config)
    tk.add_rated_turns(store, tk.load_policy(model_dir), n, seed=seed)
    store.close()


def test_train_json_and_nothing_new(home, model_dir, invoke):
    config = write_config(home, model_dir)
    first = invoke("train")
    assert first.exit_code == RoundOutcome.NOTHING_NEW.exit_code
    assert "nothing new to train on" in first.output and "Traceback" not in first.output
    add_turns(config, model_dir)
    result = invoke("train", "--once", "--json")
    assert result.exit_code == RoundOutcome.SUCCEEDED.exit_code, result.output
    out = json.loads(result.stdout)
    assert out["status"] == "succeeded" and out["error"] is None
    assert DOCUMENTED_METRICS <= set(out["metrics"])
    assert out["metrics"]["samples"] == 8
    store = Store.open(config)
    assert store.active_checkpoint().id == out["checkpoint_id"]
    assert store.get_run(out["run_id"]).status == "succeeded"
    skipped = invoke("train", "--json")
    assert skipped.exit_code == RoundOutcome.NOTHING_NEW.exit_code
    assert json.loads(skipped.stdout)["status"] == "skipped"


def test_train_progress_bar_and_message(home, model_dir, invoke):
    config = write_config(home, model_dir)
    add_turns(config, model_dir)
    result = invoke("train")
    assert result.exit_code == 0, result.output
    assert "checkpoint" in result.stdout and "is active" in result.stdout
    assert "PPO" in result.stderr and "approx_kl" in result.stderr and "loss" in result.stderr
    assert "2/2" in result.stderr  # epochs x minibatches: 2 epochs of one minibatch


def test_train_rejected_exit_code(home, model_dir, invoke):
    config = write_config(home, model_dir, kl_max=1e-9)
    add_turns(config, model_dir)
    result = invoke("train")
    assert result.exit_code == RoundOutcome.REJECTED.exit_code
    assert "round rejected" in result.stdout and "kl_max" in result.stdout


def test_model_missing_and_hook_broken(home, tmp_path, model_dir, invoke):
    config = write_config(home, tmp_path / "gone")
    add_turns(config, model_dir, n=2)
    missing = invoke("train")
    assert missing.exit_code == RoundOutcome.MODEL_MISSING.exit_code
    assert "model missing" in missing.output and "set model_path to a name" in missing.output
    config = write_config(home, model_dir)
    (home / "mapper.py").write_text("def reward_mapper(score, metadata):\n    return undefined\n")
    text = (home / "config.yaml").read_text() + f"reward_mapper: {home / 'mapper.py'}:reward_mapper\n"
    (home / "config.yaml").write_text(text)
    broken = invoke("train", "--json")
    assert broken.exit_code == RoundOutcome.HOOK_BROKEN.exit_code
    out = json.loads(broken.stdout)
    assert out["status"] == "failed" and out["error"] == "hook"
    assert out["message"].startswith("reward hook broken:") and "undefined" in out["message"]


def test_child_process_same_behaviour(home, model_dir):
    config = write_config(home, model_dir)
    add_turns(config, model_dir)
    env = clean_env(home, REINF_TRAIN_THREADS="1")
    cmd = [sys.executable, "-m", "reinf.training.child", "--json", "--trigger", "schedule"]
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == RoundOutcome.SUCCEEDED.exit_code, proc.stderr[-3000:]
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last["status"] == "succeeded" and DOCUMENTED_METRICS <= set(last["metrics"])
    store = Store.open(config)
    run = store.get_run(last["run_id"])
    assert run.trigger == "schedule" and run.checkpoint_id == last["checkpoint_id"]
    assert "PPO" in proc.stderr and "Traceback" not in proc.stderr
    again = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert again.returncode == RoundOutcome.NOTHING_NEW.exit_code
    assert json.loads(again.stdout.strip().splitlines()[-1])["error"] == "nothing_to_train"
    assert "nothing new to train on" in again.stderr


def test_one_round_at_a_time(home, model_dir, invoke):
    from reinf.daemon.lock import acquire_train_lock

    config = write_config(home, model_dir)
    add_turns(config, model_dir, n=2)
    held = acquire_train_lock(config, trigger="schedule")
    try:
        result = invoke("train")
    finally:
        held.release()
    assert result.exit_code == 1
    assert "another training round is running" in result.output
    assert Store.open(config).list_runs() == []


def test_a_broken_hook_is_reported_even_with_nothing_new(home, tmp_path, invoke):
    """No new ratings, but the hook is broken: the hook is what to fix (exit 5), not
    "nothing new to train on" (exit 4); the round stops before anything loads."""
    write_config(home, tmp_path / "no-model-needed")
    (home / "mapper.py").write_text("def reward_mapper(score, metadata):\n    return undefined\n")
    with open(home / "config.yaml", "a") as f:
        f.write(f"reward_mapper: {home / 'mapper.py'}:reward_mapper\n")
    broken = invoke("train", "--json")
    assert broken.exit_code == RoundOutcome.HOOK_BROKEN.exit_code, broken.output
    out = json.loads(broken.stdout)
    assert (out["status"], out["error"], out["run_id"]) == ("failed", "hook", None)
    assert out["message"].startswith("reward hook broken:") and "undefined" in out["message"]
    assert "nothing new" not in broken.output
    text_out = invoke("train")
    assert text_out.exit_code == RoundOutcome.HOOK_BROKEN.exit_code
    assert "undefined" in text_out.output and "Traceback" not in text_out.output
    assert text_out.output.count("training is paused") == 1
    (home / "mapper.py").write_text("def reward_mapper(score, metadata):\n    return 0.0\n")
    # fixed: back to "nothing new"
    assert invoke("train").exit_code == RoundOutcome.NOTHING_NEW.exit_code
