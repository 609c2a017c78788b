"""The one-round study's judge and arms (``reinf bench round``) on made-up log-ratios."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from reinf.bench.round_study import ARMS, judge_round, parse_arm, split_arm
from reinf.catalog import NO_STYLE_LEARNING
from reinf.errors import BadInput

# 3 prompts x 3 replies, scored 1, 3, 5 within each prompt
HELD = [SimpleNamespace(group=g) for g in range(3) for _ in range(3)]
SCORES = [1.0, 3.0, 5.0] * 3


def test_a_round_that_favours_the_better_replies_agrees_and_gains():
    f = judge_round(HELD, SCORES, [-0.5, 0.0, 0.5] * 3)
    assert f["pairwise"] == 1.0 and f["pairs"] == 9
    assert f["estimated_change"] > 0.5          # weights e^Δ tilt towards the 5s
    assert 0.5 < f["ess"] < 1.0


def test_a_round_against_them_disagrees_and_loses():
    f = judge_round(HELD, SCORES, [0.5, 0.0, -0.5] * 3)
    assert f["pairwise"] == 0.0 and f["estimated_change"] < -0.5


def test_a_round_that_moved_nothing_is_no_direction():
    f = judge_round(HELD, SCORES, [0.0] * 9)
    assert f["pairwise"] == 0.5                 # ties count half
    assert f["estimated_change"] == 0.0 and f["ess"] == 1.0
    assert f["mean_abs_delta"] == 0.0


def test_replies_the_rater_scores_alike_are_no_pairs():
    f = judge_round(HELD, [4.0] * 9, [-0.5, 0.0, 0.5] * 3)
    assert f["pairs"] == 0 and f["pairwise"] is None
    assert math.isclose(f["estimated_change"], 0.0, abs_tol=1e-12)  # nothing to gain


def test_only_pairs_within_a_prompt_count():
    # the better prompt's replies all made likelier: no pair within a prompt differs in Δ
    held = [SimpleNamespace(group=g) for g in (0, 0, 1, 1)]
    f = judge_round(held, [1.0, 2.0, 4.0, 5.0], [0.0, 0.0, 1.0, 1.0])
    assert f["pairs"] == 2 and f["pairwise"] == 0.5


def test_arms_are_built_in_names_or_overrides():
    assert parse_arm("rated") == ("rated", ARMS["rated"])
    # a built-in arm learns no styles unless it says so, on any model (as when measured)
    assert parse_arm("rollouts") == ("rollouts", {**NO_STYLE_LEARNING,
                                                  "training.min_consistency": -1.0})
    explore = ARMS["explore"]
    assert explore["explore_styles"] == 0.5 and explore["training.styled_rollouts"] == 2
    assert explore["training.imitate_styled"] == 0.0
    name, overrides = parse_arm("r8:training.min_consistency=-1, training.rollouts_per_prompt=8,"
                                "learning_rate=3e-3")
    assert name == "r8"
    assert overrides == {"training.min_consistency": "-1", "training.rollouts_per_prompt": "8",
                         "learning_rate": "3e-3"}  # read and checked by Config.replace


def test_the_baselines_are_arms_with_bench_keys_kept_apart_from_the_config():
    assert parse_arm("sft") == ("sft", {**NO_STYLE_LEARNING, "baseline": "sft"})
    assert parse_arm("kto@1e-4") == ("kto@1e-4", {**NO_STYLE_LEARNING, "baseline": "kto",
                                                  "kto_lr": 1e-4})
    name, overrides = parse_arm("k:baseline=kto,kto_lr=3e-3,lora.r=4")
    assert (name, overrides) == ("k", {"baseline": "kto", "kto_lr": 3e-3, "lora.r": "4"})
    assert split_arm(overrides) == ({"lora.r": "4"}, {"baseline": "kto", "kto_lr": 3e-3})
    # the first version's method, as `reinf bench learn` runs its rated baseline
    assert ARMS["rated-v1"] == {**NO_STYLE_LEARNING, "training.method": "rated",
                                "kl_loss_coef": 0.0, "advantage": "gae"}


@pytest.mark.parametrize("spec, words", [
    ("nobody", "unknown arm 'nobody'"),
    ("x:learning_rate", "is not key=value"),
    ("x:=3", "is not key=value"),
    ("kto@fast", "kto_lr needs baseline=kto and a learning rate"),
    ("kto@2", "between 0 and 1"),
    ("x:baseline=sft,kto_lr=1e-4", "kto_lr needs baseline=kto"),
    ("x:baseline=dpo", "baseline must be sft or kto"),
])
def test_a_bad_arm_names_the_problem_and_the_fix(spec, words):
    with pytest.raises(BadInput) as caught:
        parse_arm(spec)
    assert words in caught.value.message and caught.value.fix


def test_the_text_report_has_a_line_per_rater_and_arm_in_columns():
    from reinf.bench.round_study import format_round_study

    ok = {"status": "succeeded", "mode": "rollouts", "rating_model_consistency": 0.41,
          "pairwise": 0.77, "pairs": 236, "estimated_change": 0.083, "ess": 0.97,
          "kl": 0.0109, "seconds": 198.0}
    report = {"model": "m", "ratings": 32, "replies": 256, "prompts": 32,
              "replies_per_prompt": 8, "sample_seconds": 300.0, "seed": 0, "machine": "vm",
              "arms": {"rollouts": {}, "rated": {}},
              "raters": {"a-rather-long-rater-name": {"unseen": True, "rollouts": ok,
                                                       "rated": {"status": "failed",
                                                                 "message": "boom"}}}}
    lines = format_round_study(report).splitlines()
    header = next(line for line in lines if "pairwise" in line and "arm" in line)
    row = next(line for line in lines if "a-rather-long-rater-name" in line)
    assert row.index("rollouts") == header.index("arm")   # the long name does not shift it
    assert "0.77" in row and "+0.083" in row and "0.41" in row
    assert any("rated" in line and "failed: boom" in line for line in lines)


def test_a_round_of_several_passes_says_where_each_left_the_policy():
    from reinf.bench.round_study import describe

    f = {"status": "succeeded", "mode": "rollouts", "pairwise": 0.7, "pairs": 10,
         "estimated_change": 0.1, "ess": 0.9, "mean_abs_delta": 1.0, "kl": 0.02, "seconds": 5.0}
    assert "passes" not in describe(f)
    f["iterations"] = [{"kl": 0.011, "predicted_score_mean": 2.5},
                       {"kl": 0.02, "predicted_score_mean": 2.75}]
    assert describe(f).endswith("; passes: KL 0.0110 predicted 2.50, KL 0.0200 predicted 2.75")


def test_a_round_says_how_many_steps_it_took_and_whether_it_stopped_early():
    from reinf.bench.round_study import describe

    f = {"status": "succeeded", "mode": "rollouts", "pairwise": 0.7, "pairs": 10,
         "estimated_change": 0.1, "ess": 0.9, "mean_abs_delta": 1.0, "kl": 0.02, "seconds": 5.0,
         "steps": 36, "early_stopped": False, "approx_kl": 0.0412, "clipfrac": 0.21}
    assert describe(f).endswith("; 36 steps, approx_kl 0.041, clipfrac 0.21")
    f.update(steps=9, early_stopped=True)
    assert "; 9 steps, stopped early, approx_kl" in describe(f)
