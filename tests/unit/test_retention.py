"""Checkpoint directories without a model: completeness, stray clean-up, retention."""
import os
import subprocess
import sys

import pytest

from reinf.training import checkpoints


def fake_checkpoint(root, name, complete=True):
    path = root / name
    path.mkdir(parents=True)
    for file in checkpoints.REQUIRED if complete else checkpoints.REQUIRED[:-1]:
        (path / file).write_text("{}")
    return path


def test_is_complete_needs_every_file_and_a_final_name(tmp_path):
    assert checkpoints.is_complete(fake_checkpoint(tmp_path, "r0001-a"))
    assert not checkpoints.is_complete(fake_checkpoint(tmp_path, "r0002-b", complete=False))
    assert not checkpoints.is_complete(fake_checkpoint(tmp_path, ".tmp-r0003-c-1-abc"))
    assert not checkpoints.is_complete(tmp_path / "missing")
    with pytest.raises(checkpoints.TrainingError, match="incomplete"):
        checkpoints.load_checkpoint(tmp_path / "r0002-b")


def test_clean_stray_removes_only_dead_writers(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    gone = fake_checkpoint(tmp_path, f".tmp-r0001-20250101-000000-ab12-{dead}-aaa")
    mine = fake_checkpoint(tmp_path, f".tmp-r0002-20250101-000000-ab12-{os.getpid()}-bbb")
    alive = fake_checkpoint(tmp_path, f".tmp-r0003-20250101-000000-ab12-{os.getppid()}-ccc")
    real = fake_checkpoint(tmp_path, "r0004-20250101-000000-ab12")
    removed = checkpoints.clean_stray(tmp_path)
    assert sorted(removed) == sorted([gone, mine])
    assert alive.exists() and real.exists()


def add(store, root, cid, reward, parent=None, status="promoted"):
    path = fake_checkpoint(root, cid)
    store.add_checkpoint(cid, str(path), parent_id=parent, metrics={"reward_mean": reward},
                         status=status)
    return path


def test_retention_keeps_active_parent_and_best(store, config):
    root = checkpoints.root_dir(config)
    paths = {
        "c1": add(store, root, "c1", 0.9),              # best score
        "c2": add(store, root, "c2", 0.1, "c1"),
        "c3": add(store, root, "c3", 0.5, "c2"),        # second best
        "c4": add(store, root, "c4", -0.3, "c3"),       # parent of the active one
        "c5": add(store, root, "c5", -0.5, "c4"),       # active, worst score
        "c6": add(store, root, "c6", float("nan"), "c5"),
        "rj": add(store, root, "rj", 5.0, "c5", status="rejected"),
    }
    store.activate_checkpoint("c5")
    deleted = checkpoints.apply_retention(store, root, keep_best=2)
    assert sorted(deleted) == ["c2", "c6"]
    status = {c.id: c.status for c in store.list_checkpoints()}
    assert status == {"c1": "promoted", "c2": "deleted", "c3": "promoted", "c4": "promoted",
                      "c5": "promoted", "c6": "deleted", "rj": "rejected"}
    assert not paths["c2"].exists() and not paths["c6"].exists()
    assert all(paths[c].exists() for c in ("c1", "c3", "c4", "c5"))
    assert store.active_checkpoint().id == "c5"


def test_retention_never_deletes_outside_the_checkpoints_dir(store, config, tmp_path):
    outside = fake_checkpoint(tmp_path, "elsewhere")
    store.add_checkpoint("x", str(outside), metrics={"reward_mean": -1.0})
    add(store, checkpoints.root_dir(config), "y", 1.0)
    store.activate_checkpoint("y")
    assert checkpoints.apply_retention(store, checkpoints.root_dir(config), keep_best=0) == ["x"]
    assert outside.exists()


def test_checkpoint_ids_sort_by_round_and_are_unique():
    a, b = checkpoints.create_checkpoint_id(2), checkpoints.create_checkpoint_id(2)
    assert a != b and a.startswith("r0002-")
    assert checkpoints.create_checkpoint_id(10) > checkpoints.create_checkpoint_id(9)


def test_jsonable_drops_nan_for_json():
    assert checkpoints.jsonable({"a": float("nan"), "b": [1.5, float("inf")], 3: "x"}) == \
        {"a": None, "b": [1.5, None], "3": "x"}
