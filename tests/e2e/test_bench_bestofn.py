"""`reinf bench learn --baselines bestofn` on the demo model, tiny: after each of Reinf's
rounds, the base model's best of n replies to each probe prompt by the rating model Reinf
serves there, rated by the rater; its cost is reported."""
from __future__ import annotations

import json

import pytest
import trainkit as tk

pytestmark = pytest.mark.e2e


restore_threads = pytest.fixture(autouse=True)(tk.threads_restored)


def test_best_of_n_reranks_base_replies_with_reinfs_rating_model(invoke, tmp_path, monkeypatch):
    # Trust any rating model a round fits (training.min_consistency), so that 16 ratings
    # are enough for best-of-n to rerank.
    monkeypatch.setenv("REINF_TRAINING_MIN_CONSISTENCY", "-1")
    result = invoke("bench", "learn", "--json", "--threads", "1", "--heldout", "24", "--plot",
                    tmp_path / "p.png",
                    "--ratings", "16", "--train-after", "8", "--seeds", "1", "--probe", "4",
                    "--final-probe", "4", "--baselines", "bestofn", "--best-of", "3")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert list(report["methods"]) == ["reinf", "bestofn"]
    reinf = report["methods"]["reinf"]["seeds"][0]
    best = report["methods"]["bestofn"]
    run = best["seeds"][0]
    base = report["base_curve"]
    # the same points on the curve as Reinf's, each with the rating model Reinf served there
    assert [p["ratings"] for p in run["curve"]] == [p["ratings"] for p in reinf["curve"]] \
        == [0, 8, 16]
    assert run["curve"][0]["probe_mean_rating"] == base["probe_mean_rating"]
    reranked = 0
    for mine, theirs in zip(run["curve"][1:], reinf["curve"][1:]):
        assert mine["rating_model_checkpoint"] == theirs["active_checkpoint"]
        # rated by the rater (prefers-terse: 5 preferred, 1 not), on the same 4 probe prompts
        assert mine["probe"] == 4 and 1 <= mine["probe_mean_rating"] <= 5
        assert mine["probe_mean_rating"] == pytest.approx(1 + 4 * mine["probe_preferred_share"])
        if mine["mode"] == "reranked":
            reranked += 1
            assert len(mine["candidates_predicted"]) == 4
            for row, chosen in zip(mine["candidates_predicted"], mine["chosen"]):
                assert len(row) == 3 and row[chosen] == max(v for v in row if v is not None)
        else:  # no rating model yet: the first sample, which is the base's probe reply
            assert mine["mode"] == "first sample" and mine["chosen"] == [0, 0, 0, 0]
            assert mine["probe_mean_rating"] == base["probe_mean_rating"]
    assert reranked >= 1
    assert run["final"]["probe"] == 4 and run["final"]["kl"] is None
    cost = best["cost"]
    assert (cost["n"], cost["replies"], cost["samples"]) == (3, 4, 12)
    assert len(cost["sample_seconds_by_candidate"]) == 3 and cost["sample_seconds"] > 0
    assert cost["feature_seconds"] > 0 and best["settings"]["n"] == 3
    assert "bestofn" in report["goals"]["fewer_ratings_than_baselines"]
    from reinf.bench.plot import format_table
    text = format_table(report)
    assert "Best-of-3 at serve time" in text and "12 replies (3 x 4 probe prompts)" in text
