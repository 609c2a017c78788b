"""`reinf bench round` on the demo model, small: one real round per arm, judged on held-out
replies; a round on a rating model that knows the rater moves them the rater's way."""
from __future__ import annotations

import importlib.util
import json

import pytest
import trainkit as tk

pytestmark = pytest.mark.e2e
restore_threads = pytest.fixture(autouse=True)(tk.threads_restored)


def test_each_arm_is_one_real_round_judged_on_held_out_replies(invoke):
    result = invoke("bench", "round", "--model", "reinf-demo", "--rater", "prefers-terse",
                    "--ratings", "16", "--prompts", "8", "--replies", "4", "--arm", "rated",
                    "--arm", "rollouts", "--arm", "slow:learning_rate=1e-9",
                    "--arm", "again:training.min_consistency=-1", "--threads", "1",
                    "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["ratings"] == 16 and report["prompts"] == 8
    assert 0 < report["replies"] <= 32
    assert list(report["arms"]) == ["rated", "rollouts", "slow", "again"]
    r = report["raters"]["prefers-terse"]
    assert r["unseen"] is False and 1 <= r["held_out_mean"] <= 5
    for arm in report["arms"]:
        assert r[arm]["status"] == "succeeded", r[arm]
        assert 1 <= r[arm]["rated_mean"] <= 5
    assert r["rated"]["mode"] == "rated"            # the arms train as they say
    assert r["rollouts"]["mode"] == "rollouts" and r["rollouts"]["rollouts"] > 0
    # The rating model learns terseness from 16 ratings; its rollout round makes the
    # rater's better held-out replies likelier than its worse ones, and the estimated
    # mean rating rises.
    assert r["rollouts"]["pairwise"] > 0.5 and r["rollouts"]["estimated_change"] > 0
    # An arm that cannot move the adapter moves nothing ...
    assert r["slow"]["mean_abs_delta"] < 1e-3 < r["rollouts"]["mean_abs_delta"]
    assert r["slow"]["ess"] > 0.999
    # ... and each arm starts from, and is judged against, the bare base: the rollouts arm
    # again, after two other arms' adapters came and went, gives the same figures.
    for key in ("pairwise", "estimated_change", "mean_abs_delta", "rated_mean"):
        assert r["again"][key] == pytest.approx(r["rollouts"][key], abs=1e-3), key


def test_resample_answers_the_held_out_prompts_afresh_with_each_rounds_adapter(invoke):
    """``--resample``: the held-out prompts answered again by the round's adapter (same
    sampler and seed) and rated. A round that learnt terseness raises that mean; an adapter
    that did not move samples the base's very replies, so its change is 0. The styled arm
    reports its styled rollouts."""
    result = invoke("bench", "round", "--model", "reinf-demo", "--rater", "prefers-terse",
                    "--ratings", "16", "--prompts", "8", "--replies", "4", "--arm", "rollouts",
                    "--arm", "slow:learning_rate=1e-9", "--arm", "styled", "--threads", "1",
                    "--resample", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["resample"] is True
    r = report["raters"]["prefers-terse"]
    for arm in ("rollouts", "slow", "styled"):
        f = r[arm]
        assert f["resampled_change"] == pytest.approx(f["resampled_mean"] - r["held_out_mean"],
                                                      abs=2e-3)
    assert r["rollouts"]["resampled_change"] > 0.1
    assert r["slow"]["resampled_change"] == 0
    assert r["styled"]["styled_rollouts"] > 0 and r["styled"]["mode"] == "rollouts"
    text = invoke("bench", "round", "--model", "reinf-demo", "--rater", "prefers-terse",
                  "--ratings", "8", "--prompts", "4", "--replies", "2", "--arm", "rated",
                  "--threads", "1", "--resample")
    assert text.exit_code == 0, text.output
    assert "resampled" in text.stdout


@pytest.mark.skipif(importlib.util.find_spec("trl") is None,
                    reason="the KTO arms need TRL (the bench extra)")
def test_the_baselines_and_the_first_version_are_arms_on_the_same_ratings(invoke):
    result = invoke("bench", "round", "--model", "reinf-demo", "--rater", "prefers-terse",
                    "--ratings", "16", "--prompts", "8", "--replies", "4", "--arm", "sft",
                    "--arm", "kto@1e-3", "--arm", "kto", "--arm", "rated-v1", "--threads", "1",
                    "--json")
    assert result.exit_code == 0, result.output
    r = json.loads(result.stdout)["raters"]["prefers-terse"]
    for arm in ("sft", "kto@1e-3", "kto", "rated-v1"):
        assert r[arm]["status"] == "succeeded", r[arm]
    assert r["sft"]["rated_mean"] == r["kto"]["rated_mean"]  # the same replies, rated alike
    assert (r["sft"]["mode"], r["kto"]["mode"], r["rated-v1"]["mode"]) == ("sft", "kto", "rated")
    # SFT imitates the replies rated 4-5 (terse ones): the terser held-out replies gain.
    assert r["sft"]["pairwise"] > 0.5 and r["sft"]["estimated_change"] > 0
    # KTO at TRL's 5e-6 barely moves a LoRA adapter; at 1e-3 it moves it far more.
    assert r["kto"]["mean_abs_delta"] < r["kto@1e-3"]["mean_abs_delta"]


@pytest.mark.parametrize("args, words", [
    (("--arm", "nobody"), "unknown arm 'nobody'"),
    (("--arm", "x:learning_rate=abc"), "learning_rate"),
    (("--arm", "rated", "--arm", "rated"), "arm names repeat"),
    (("--ratings", "300"), "exceed the"),
    (("--arm", "kto@fast"), "kto_lr needs baseline=kto"),
])
def test_bad_input_is_one_line_with_the_fix(invoke, args, words):
    result = invoke("bench", "round", "--model", "reinf-demo", "--rater", "prefers-terse", *args)
    assert result.exit_code != 0
    assert words in result.output and "Traceback" not in result.output
