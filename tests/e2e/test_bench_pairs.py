"""`reinf bench learn --pairs-every N` on the demo model, small: every Nth interaction the
simulated person picks between two replies instead of rating one, through regenerate's
path, and the rounds read those picks."""
from __future__ import annotations

import json
import shutil

import pytest
import trainkit as tk

pytestmark = pytest.mark.e2e


restore_threads = pytest.fixture(autouse=True)(tk.threads_restored)


def test_learn_with_a_pair_every_fourth_interaction(invoke, tmp_path):
    from reinf.config import load_config
    from reinf.storage.store import Store

    result = invoke("bench", "learn", "--json", "--threads", "1", "--heldout", "24", "--plot",
                    tmp_path / "learn.png", "--ratings", "16", "--train-after", "8",
                    "--window", "8", "--seeds", "1", "--probe", "4", "--final-probe", "4",
                    "--target", "3.0", "--baselines", "none", "--pairs-every", "4", "--keep")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["plan"]["pairs_every"] == 4
    run = report["methods"]["reinf"]["seeds"][0]
    try:
        # 16 interactions: 12 ratings and 4 pairs; a round after every 8 interactions
        assert sum(run["pairs"].values()) == 4 and set(run["pairs"]) <= {"a", "b", "tie"}
        assert [p["ratings"] for p in run["curve"]] == [0, 8, 16]
        assert [x["after_ratings"] for x in run["rounds"]] == [8, 16]
        assert all(x["status"] == "succeeded" for x in run["rounds"]), run["rounds"]
        assert len(run["scores"]) == 16
        last = run["rounds"][-1]
        assert "rating_model_consistency" in last
        home = run["data_dir"]
        store = Store.open(load_config(environ={"REINF_HOME": home}))
        try:
            counts = store.counts()
            assert counts["ratings"] == 12 and counts["pairs"] == 4
            assert counts["turns"] == 20                 # a pair's two replies are turns
            pairs = store.list_pairs(limit=None)
            assert {p.source for p in pairs} == {"regenerate"}
            assert all(p.a_turn_id and p.b_turn_id for p in pairs)
            decided = [p for p in pairs if p.outcome != "tie"]
            assert sum(run["pairs"].get(k, 0) for k in ("a", "b")) == len(decided)
            # the round after 16 fitted the rating model (12 ratings) and read the picks (a
            # pair of two identical replies says nothing and is skipped)
            assert 1 <= last["rating_model_pairs"] <= 4
        finally:
            store.close()
    finally:
        shutil.rmtree(run["data_dir"], ignore_errors=True)


def test_pairs_every_one_is_refused(invoke, tmp_path):
    result = invoke("bench", "learn", "--ratings", "4", "--seeds", "1", "--baselines", "none",
                    "--pairs-every", "1", "--plot", tmp_path / "x.png")
    assert result.exit_code != 0
    assert "--pairs-every must be 0" in result.output
