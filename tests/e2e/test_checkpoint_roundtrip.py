"""Checkpoints written by a real round: round trip to 1e-6, crashes mid-write."""
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import trainkit as tk
from conftest import REPO, clean_env
from reinf.errors import TrainingError
from reinf.storage.store import Store
from reinf.training import checkpoints
from reinf.training.ppo import ValueHead
from reinf.training.session import build_session
from reinf.training.trainer import train_round

pytestmark = [pytest.mark.e2e, pytest.mark.stack]  # see pyproject.toml's markers
single_thread = pytest.fixture(autouse=True)(tk.one_thread)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tk.make_model(tmp_path_factory.mktemp("model"))


def test_round_trip_logits_value_head_and_state(home, model_dir, monkeypatch):
    # a GAE round: the one kind whose checkpoint carries a value head
    config = tk.train_config(home, model_dir).replace(advantage="gae")
    store = Store.open(config)
    tk.add_rated_turns(store, tk.load_policy(model_dir), 8, seed=0)
    written = {}
    real_write = checkpoints.write_checkpoint

    def spy(root, checkpoint_id, **parts):
        written.update(parts)  # the in-memory objects the round trained
        return real_write(root, checkpoint_id, **parts)

    monkeypatch.setattr(checkpoints, "write_checkpoint", spy)
    result = train_round(config, store)
    path = store.get_checkpoint(result.checkpoint_id).path
    assert sorted(p.name for p in checkpoints.root_dir(config).iterdir()) == [result.checkpoint_id]
    for name in checkpoints.REQUIRED:
        assert (checkpoints.root_dir(config) / result.checkpoint_id / name).is_file()

    ids = torch.randint(3, 300, (2, 12), generator=torch.Generator().manual_seed(0))
    trained = written["model"].eval()
    loaded = tk.load_policy(model_dir, path)  # PeftModel.from_pretrained on a fresh base
    with torch.no_grad():
        a = trained(input_ids=ids, output_hidden_states=True)
        b = loaded(input_ids=ids, output_hidden_states=True)
    assert (a.logits - b.logits).abs().max() < 1e-6
    assert not torch.allclose(b.logits, tk.load_policy(model_dir)(input_ids=ids).logits)

    head = ValueHead(a.hidden_states[-1].shape[-1])
    head.load_state_dict(load_file(f"{path}/value_head.safetensors"))
    with torch.no_grad():
        v_trained = written["value_head"](a.hidden_states[-1])
        v_loaded = head(b.hidden_states[-1])
    assert (v_trained - v_loaded).abs().max() < 1e-6
    assert v_loaded.abs().max() > 0  # it trained away from its zero start

    state = checkpoints.load_checkpoint(path).state
    saved = written["state"]["optimizer"]["state"]
    assert state["global_step"] == result.metrics["global_step"] == written["state"]["global_step"]
    for key, value in saved.items():
        assert torch.equal(state["optimizer"]["state"][key]["exp_avg"], value["exp_avg"])
    metrics = json.loads((checkpoints.root_dir(config) / result.checkpoint_id
                          / "metrics.json").read_text())
    assert metrics["checkpoint_id"] == result.checkpoint_id and metrics["parent_id"] is None
    assert metrics["kl"] == pytest.approx(result.metrics["kl"])

    session = build_session(config, store)  # the next round resumes exactly there
    with torch.no_grad():
        resumed = session.policy.model.eval()(input_ids=ids).logits
    assert (resumed - a.logits).abs().max() < 1e-6


@pytest.mark.parametrize("damaged", [checkpoints.TRAINER_STATE, checkpoints.VALUE_HEAD])
def test_a_damaged_state_file_is_named_and_the_round_starts_it_fresh(home, model_dir, damaged):
    """Garbage in trainer_state.pt or value_head.safetensors of the active checkpoint: the
    next round does not fail with the library's error; it continues from the adapter with
    that part fresh, and a one-line warning in its metrics names the checkpoint and the
    file."""
    config = tk.train_config(home, model_dir)
    store = Store.open(config)
    tk.add_rated_turns(store, tk.load_policy(model_dir), 8, seed=0)
    first = train_round(config, store)
    (Path(store.get_checkpoint(first.checkpoint_id).path) / damaged).write_bytes(
        b"\x00garbage, not a checkpoint file" * 7)
    tk.add_rated_turns(store, tk.load_policy(model_dir), 8, seed=1)
    after = train_round(config, store)
    assert after.status == "succeeded", after.message
    assert after.metrics["parent_id"] == first.checkpoint_id
    assert after.metrics["round"] == first.metrics["round"] + 1  # counters from metrics.json
    notes = [w for w in after.metrics["warnings"] if damaged in w]
    assert len(notes) == 1 and first.checkpoint_id in notes[0] and "\n" not in notes[0]
    run = store.list_runs()[0]
    assert run.status == "succeeded" and not run.error
    assert any(damaged in w for w in run.metrics["warnings"])
    # the new checkpoint is whole again: the round after it warns of nothing
    tk.add_rated_turns(store, tk.load_policy(model_dir), 8, seed=2)
    assert not [w for w in train_round(config, store).metrics["warnings"] if "cannot be read" in w]


def test_failed_rename_leaves_nothing_loadable_and_the_active_one(home, model_dir, monkeypatch):
    config = tk.train_config(home, model_dir)
    store = Store.open(config)
    tk.add_rated_turns(store, tk.load_policy(model_dir), 8, seed=0)
    good = train_round(config, store)
    tk.add_rated_turns(store, tk.load_policy(model_dir), 8, seed=1)

    def crash(tmp, final):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoints, "publish", crash)
    with pytest.raises(TrainingError, match="disk full"):
        train_round(config, store)
    assert store.active_checkpoint().id == good.checkpoint_id
    assert [c.id for c in store.list_checkpoints()] == [good.checkpoint_id]
    assert [p.name for p in checkpoints.root_dir(config).iterdir()] == [good.checkpoint_id]
    run = store.list_runs()[0]
    assert run.status == "failed" and "disk full" in run.error
    assert "Traceback" in (home / "logs" / "trainer.log").read_text()


CRASHING_CHILD = textwrap.dedent("""
    import os, signal, sys
    import torch
    torch.set_num_threads(1)
    sys.path[:0] = [{tests!r}, {e2e!r}]
    import trainkit as tk
    from reinf.training import checkpoints
    from reinf.storage.store import Store
    from reinf.training.trainer import train_round

    def die(tmp, final):  # killed after every file is written, before the rename
        os.kill(os.getpid(), signal.SIGKILL)

    checkpoints.publish = die
    config = tk.train_config({home!r}, {model!r})
    train_round(config, Store.open(config))
""")


def test_killed_writer_leaves_a_tmp_dir_that_nothing_loads(home, model_dir):
    config = tk.train_config(home, model_dir)
    store = Store.open(config)
    tk.add_rated_turns(store, tk.load_policy(model_dir), 8, seed=0)
    good = train_round(config, store)
    tk.add_rated_turns(store, tk.load_policy(model_dir), 8, seed=1)
    script = CRASHING_CHILD.format(tests=str(REPO / "tests"), e2e=str(REPO / "tests" / "e2e"),
                                   home=str(home), model=str(model_dir))
    proc = subprocess.run([sys.executable, "-c", script], env=clean_env(home), cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-2000:]
    root = checkpoints.root_dir(config)
    stray = [p for p in root.iterdir() if p.name.startswith(checkpoints.TMP_PREFIX)]
    assert len(stray) == 1 and (stray[0] / "metrics.json").is_file()  # fully written, yet
    assert not checkpoints.is_complete(stray[0])
    with pytest.raises(TrainingError):
        checkpoints.load_checkpoint(stray[0])
    assert store.active_checkpoint().id == good.checkpoint_id
    assert [c.id for c in store.list_checkpoints()] == [good.checkpoint_id]
    store.mark_interrupted_runs("trainer killed")  # what the daemon does at start-up
    # The next round cleans the dead writer's directory and starts from the active one.
    after = train_round(config, store)
    assert after.status == "succeeded" and after.metrics["parent_id"] == good.checkpoint_id
    assert not any(p.name.startswith(checkpoints.TMP_PREFIX) for p in root.iterdir())


def test_checkpoints_record_the_model_name_and_load_when_moved(home, model_dir, tmp_path):
    """adapter_config.json names the base as the setting does (here a directory beside the
    config file), not this machine's absolute path; a moved checkpoint still loads, and a
    round resumed from one saves without looking the name up anywhere."""
    from reinf.model.adapters import read_adapter

    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text("model:\n  model_path: tiny-model\n")
    (home / "tiny-model").symlink_to(model_dir, target_is_directory=True)
    config = tk.train_config(home, model_dir, model_path="tiny-model")
    assert config.model.model_path == "tiny-model"
    store = Store.open(config)
    tk.add_rated_turns(store, tk.load_policy(model_dir), 8, seed=0)
    first = train_round(config, store)
    tk.add_rated_turns(store, tk.load_policy(model_dir), 8, seed=1)
    second = train_round(config, store)  # resumes from the first checkpoint, then saves
    assert store.get_checkpoint(second.checkpoint_id).parent_id == first.checkpoint_id
    for result in (first, second):
        path = Path(store.get_checkpoint(result.checkpoint_id).path)
        recorded = json.loads((path / "adapter_config.json").read_text())
        assert recorded["base_model_name_or_path"] == "tiny-model"
        assert str(home) not in (path / "adapter_config.json").read_text()

    moved = tmp_path / "shared" / "ckpt"
    shutil.copytree(store.get_checkpoint(second.checkpoint_id).path, moved)
    ids = torch.randint(3, 300, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        here = tk.load_policy(model_dir, store.get_checkpoint(second.checkpoint_id).path)
        there = tk.load_policy(model_dir, moved)  # PeftModel.from_pretrained(base, path)
        assert (here(input_ids=ids).logits - there(input_ids=ids).logits).abs().max() < 1e-6
        assert not torch.allclose(there(input_ids=ids).logits,
                                  tk.load_policy(model_dir)(input_ids=ids).logits)
    peft_config, weights = read_adapter(moved, "moved")  # how the engine reads one
    assert peft_config.base_model_name_or_path == "tiny-model" and weights
