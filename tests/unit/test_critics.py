"""Built-in critics and the three ways they combine with the human reward."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from reinf.records import Sample
from reinf.rewards.critics import (BUILTIN, combine, critic_format, critic_length,
                                   critic_repetition, enabled, format_problems)
from reinf.rewards.mapper import compute_rewards

NOW = datetime(2025, 6, 1, tzinfo=timezone.utc)
META = {"settings": {"length_target_chars": 100}}
PROSE = ("Boil the water first. Then lower the egg in gently with a spoon, and wait nine "
         "minutes before cooling it under the tap.")


def sample(score, response, turn_id=1) -> Sample:
    return Sample(turn_id=turn_id, conversation_id=1, turn_index=1, user_id="local",
                  prompt="How?", response=response, prompt_ids=[1], reply_ids=[2, 3],
                  logprobs=[-1.0, -1.0], checkpoint_id=None, score=score, tags=[], comment="",
                  critical=False, rated_at=NOW, created_at=NOW, temperature=1.0)


# --- length ---------------------------------------------------------------------------------

def test_length_peaks_at_the_target_and_falls_both_ways():
    score = {n: critic_length("", "x" * n, META) for n in (25, 50, 100, 200, 400, 1000)}
    assert score[100] == 1.0
    assert score[50] == pytest.approx(0.0) and score[200] == pytest.approx(0.0)
    assert score[25] == -1.0 and score[400] == -1.0 and score[1000] == -1.0
    assert critic_length("", "x" * 70, META) > critic_length("", "x" * 60, META) > 0
    assert critic_length("", "   ", META) == -1.0


# --- repetition -----------------------------------------------------------------------------

def test_repetition_rewards_varied_text_and_punishes_loops():
    assert critic_repetition("", PROSE, META) == 1.0
    loop = "I am a model. " * 12
    assert critic_repetition("", loop, META) == -1.0
    half = PROSE + " " + "the egg is done. " * 4
    assert -1.0 < critic_repetition("", half, META) < 1.0
    assert critic_repetition("", "", META) == -1.0
    assert critic_repetition("", "Yes.", META) == 1.0  # too short to repeat anything


# --- format ---------------------------------------------------------------------------------

@pytest.mark.parametrize("reply,value,problem", [
    (PROSE, 1.0, None),
    ("Here is a list:\n- eggs\n- salt", 1.0, None),
    ("Use this:\n```python\nprint('hi')\n```", 1.0, None),
    ("Done 🙂", 1.0, None),
    ("Boil the water and then", -1.0, "ends mid-sentence"),
    ("Try:\n```python\nprint('hi'", -1.0, "unclosed code fence"),
    ("", -1.0, "empty reply"),
    ("Use a pan (a small one.", -0.5, "unbalanced ()"),
])
def test_format_critic(reply, value, problem):
    assert critic_format("", reply, META) == value
    assert (problem in format_problems(reply)) if problem else format_problems(reply) == []


def test_builtin_critics_stay_in_range():
    for name, critic in BUILTIN.items():
        for reply in ("", "a", PROSE, "no " * 500, "x" * 10_000, "(((", "```"):
            assert -1.0 <= critic("q", reply, META) <= 1.0, (name, reply[:20])


# --- combination ----------------------------------------------------------------------------

def test_no_enabled_critic_gives_the_human_reward_in_every_mode():
    for mode in ("weighted_average", "min", "consensus"):
        assert combine(0.7, {"length": -1.0}, {"length": 0.0}, mode) == (0.7, True)
    assert enabled({"length": 0.0, "format": 2.0}) == {"format": 2.0}


def test_weighted_average():
    reward, kept = combine(1.0, {"length": -1.0, "format": 0.5}, {"length": 1.0, "format": 2.0},
                           "weighted_average", human_weight=3.0)
    assert reward == pytest.approx((3 * 1.0 + 1 * -1.0 + 2 * 0.5) / (3 + 1 + 2)) and kept


def test_min_takes_the_most_pessimistic():
    assert combine(0.5, {"length": -0.2, "format": 1.0}, {"length": 1, "format": 1}, "min") \
        == (-0.2, True)
    assert combine(-1.0, {"length": 0.3}, {"length": 1}, "min") == (-1.0, True)


def test_consensus_keeps_only_samples_the_critics_agree_with():
    w = {"length": 1.0, "format": 1.0}
    assert combine(0.5, {"length": 0.2, "format": 1.0}, w, "consensus") == (0.5, True)
    assert combine(0.5, {"length": 0.2, "format": -0.1}, w, "consensus") == (0.5, False)
    assert combine(-1.0, {"length": -0.2, "format": -1.0}, w, "consensus") == (-1.0, True)
    assert combine(-1.0, {"length": 0.4, "format": -1.0}, w, "consensus") == (-1.0, False)
    # 0 is "no opinion" and never vetoes, on either side
    assert combine(0.5, {"length": 0.0, "format": 1.0}, w, "consensus") == (0.5, True)
    assert combine(0.0, {"length": -1.0, "format": 1.0}, w, "consensus") == (0.0, True)


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="critic_combine"):
        combine(0.0, {"length": 1.0}, {"length": 1.0}, "median")


# --- through compute_rewards ----------------------------------------------------------------

def test_compute_rewards_combines_critics_per_config(config):
    good, cut = sample(5, PROSE, 1), sample(5, "So you take the egg and", 2)
    cfg = config.replace(critics={"format": 1.0, "length": 0.0, "repetition": 0.0},
                         critic_combine="weighted_average", human_weight=1.0)
    rows = compute_rewards(cfg, [good, cut], now=NOW)
    assert [r.critics for r in rows] == [{"format": 1.0}, {"format": -1.0}]
    assert [r.reward for r in rows] == pytest.approx([1.0, 0.0])
    assert [r.human_reward for r in rows] == pytest.approx([1.0, 1.0])

    rows = compute_rewards(cfg.replace(critic_combine="min"), [good, cut], now=NOW)
    assert [r.reward for r in rows] == pytest.approx([1.0, -1.0])

    rows = compute_rewards(cfg.replace(critic_combine="consensus"), [good, cut], now=NOW)
    assert [r.kept for r in rows] == [True, False]
    assert [r.reward for r in rows] == pytest.approx([1.0, 1.0])


def test_critics_are_off_by_default(config):
    assert enabled(config.rewards.critics) == {}
    row, = compute_rewards(config, [sample(4, "So you take the egg and")], now=NOW)
    assert row.critics == {} and row.reward == row.human_reward == 0.5
