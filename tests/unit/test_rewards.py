"""The default reward mapper, metadata, time decay, clipping, and `reinf rewards preview`."""
from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone

import pytest

from reinf.errors import HookError
from reinf.records import Sample
from reinf.rewards.mapper import (build_metadata, compute_rewards, decay_weight, default_mapper,
                                  default_reward, hook_status, hook_template, preview,
                                  rewards_settings)

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)


def sample(score=4, *, tags=(), critical=False, age=timedelta(0), turn_id=1, response="Hi.",
           **kw) -> Sample:
    fields = dict(turn_id=turn_id, conversation_id=7, turn_index=2, user_id="local",
                  prompt="hello?", response=response, prompt_ids=[1, 2, 3],
                  reply_ids=[4, 5], logprobs=[-1.0, -2.0], checkpoint_id="ck-1", score=score,
                  tags=list(tags), comment="", critical=critical, rated_at=NOW - age,
                  created_at=NOW - age - timedelta(minutes=1), temperature=0.7)
    fields.update(kw)
    return Sample(**fields)


def rewards_of(config, samples):
    return [r.reward for r in compute_rewards(config, samples, now=NOW)]


# --- the default mapping table --------------------------------------------------------------

BASE = {1: -1.0, 2: -0.5, 3: 0.0, 4: 0.5, 5: 1.0}


@pytest.mark.parametrize("score", [1, 2, 3, 4, 5])
def test_base_reward_is_score_minus_three_over_two(config, score):
    row, = compute_rewards(config, [sample(score)], now=NOW)
    assert row.human_reward == pytest.approx(BASE[score])
    assert row.reward == pytest.approx(BASE[score])
    assert row.weight == pytest.approx(1.0) and row.kept and row.critics == {}


@pytest.mark.parametrize("bonus", [0.5, 0.25])
def test_critical_moves_the_reward_away_from_zero_by_the_bonus(config, bonus):
    cfg = config.replace(critical_bonus=bonus)
    got = rewards_of(cfg, [sample(s, critical=True) for s in range(1, 6)])
    want = [BASE[s] + math.copysign(bonus, BASE[s]) if BASE[s] else 0.0 for s in range(1, 6)]
    assert got == pytest.approx(want)
    assert got[2] == 0.0  # a critical 3 stays neutral


def test_tag_adjustments_add_up_and_match_loosely(config):
    cfg = config.replace(tag_adjustments={"too technical": -0.2, "needs examples": -0.1})
    got = rewards_of(cfg, [sample(4, tags=["too technical"]),
                           sample(4, tags=["Too  Technical", "needs examples"]),
                           sample(4, tags=["something else"]),
                           sample(2, tags=["needs examples"], critical=True)])
    assert got == pytest.approx([0.3, 0.2, 0.5, -0.5 - 0.5 - 0.1])


def test_time_decay_is_a_weight_with_a_half_life(config):
    cfg = config.replace(half_life_days=10)
    ages = [timedelta(0), timedelta(days=10), timedelta(days=20), timedelta(days=5)]
    rows = compute_rewards(cfg, [sample(5, age=a) for a in ages], now=NOW)
    assert [r.weight for r in rows] == pytest.approx([1.0, 0.5, 0.25, 0.5 ** 0.5])
    assert [r.reward for r in rows] == pytest.approx([1.0] * 4)  # decay never changes the reward
    assert rows[1].age_seconds == pytest.approx(10 * 86_400)


def test_half_life_zero_means_no_decay(config):
    cfg = config.replace(half_life_days=0)
    row, = compute_rewards(cfg, [sample(1, age=timedelta(days=3650))], now=NOW)
    assert row.weight == 1.0
    assert decay_weight(-5.0, 1.0) == 1.0  # a rating "from the future" (clock skew) is not boosted


@pytest.mark.parametrize("critical,tags,decay_days", [
    (False, [], 0), (True, [], 0), (False, ["wrong"], 0), (True, ["wrong", "too long"], 30)])
def test_full_table_for_scores_1_to_5(config, critical, tags, decay_days):
    cfg = config.replace(half_life_days=30, critical_bonus=0.5,
                         tag_adjustments={"wrong": -0.3, "too long": -0.2})
    rows = compute_rewards(cfg, [sample(s, critical=critical, tags=tags,
                                        age=timedelta(days=decay_days)) for s in range(1, 6)],
                           now=NOW)
    for score, row in zip(range(1, 6), rows):
        base = BASE[score]
        if critical and base:
            base += math.copysign(0.5, base)
        want = base - 0.3 * ("wrong" in tags) - 0.2 * ("too long" in tags)
        assert row.human_reward == pytest.approx(want)
        assert row.reward == pytest.approx(max(-2.0, min(2.0, want)))
        assert row.weight == pytest.approx(0.5 ** (decay_days / 30))


def test_final_reward_is_clipped_to_the_configured_range(config):
    cfg = config.replace(reward_min=-1.2, reward_max=0.8, critical_bonus=1.0)
    rows = compute_rewards(cfg, [sample(1, critical=True), sample(5, critical=True),
                                 sample(4)], now=NOW)
    assert [r.human_reward for r in rows] == pytest.approx([-2.0, 2.0, 0.5])
    assert [r.reward for r in rows] == pytest.approx([-1.2, 0.8, 0.5])


def test_default_mapper_takes_any_form_of_settings(config):
    meta = {"critical": True, "tags": ["wrong"]}
    as_config = default_mapper(5, meta, config=config)
    assert default_mapper(5, meta, config=config.rewards) == as_config
    assert default_mapper(5, meta, config=rewards_settings(config)) == as_config
    assert as_config == pytest.approx(1.0 + 0.5 - 0.3)
    with pytest.raises(ValueError):
        default_mapper(6, meta, config=config)
    with pytest.raises(ValueError):
        default_mapper(True, meta, config=config)


def test_default_reward_reads_settings_from_metadata(config):
    meta = build_metadata(sample(2, tags=["too long"]), NOW, settings=rewards_settings(config))
    assert default_reward(2, meta) == pytest.approx(-0.5 - 0.2)
    bigger = dict(meta, settings={**meta["settings"], "tag_adjustments": {"too long": -1.0}})
    assert default_reward(2, bigger) == pytest.approx(-1.5)
    with pytest.raises(KeyError, match="settings"):
        default_reward(2, {"tags": []})


# --- metadata ---------------------------------------------------------------------------------

def test_metadata_carries_the_documented_keys(config):
    s = sample(3, tags=["great tone"], critical=True, age=timedelta(hours=2),
               response="Twelve chars", comment="ok")
    meta = build_metadata(s, NOW, settings=rewards_settings(config))
    assert meta["prompt"] == "hello?" and meta["response"] == "Twelve chars"
    assert meta["response_length"] == {"tokens": 2, "chars": 12}
    assert meta["prompt_length"] == {"tokens": 3, "chars": 6}
    assert meta["tags"] == ["great tone"] and meta["comment"] == "ok" and meta["critical"]
    assert datetime.fromisoformat(meta["rated_at"]) == NOW - timedelta(hours=2)
    assert meta["age_seconds"] == pytest.approx(7200.0)
    assert meta["age_days"] == pytest.approx(7200 / 86400)
    assert (meta["conversation_id"], meta["turn_index"], meta["user_id"]) == (7, 2, "local")
    assert meta["checkpoint_id"] == "ck-1" and meta["turn_id"] == 1 and meta["score"] == 3
    assert meta["settings"]["reward_mapper"] == "default"
    json.dumps(meta, allow_nan=False)  # it crosses a process boundary as JSON
    base = build_metadata(sample(checkpoint_id=None, rated_at=datetime(2025, 6, 1, 11)), NOW)
    assert base["checkpoint_id"] == "base"
    assert base["age_seconds"] == pytest.approx(3600.0)  # a naive timestamp is UTC


# --- status and template ----------------------------------------------------------------------

def test_default_mapper_status_is_ok_without_a_child(config, monkeypatch):
    import reinf.rewards.hooks

    def boom(*a, **k):
        raise AssertionError("no child process for the built-in mapper")
    monkeypatch.setattr(reinf.rewards.hooks, "run_hook", boom)
    assert hook_status(config) == {"mapper": "default", "path": None, "ok": True,
                                   "error": None, "line": None, "fix": None}


def test_template_is_valid_python_that_documents_the_contract():
    text = hook_template()
    compile(text, "reward_mapper.py", "exec")
    for needle in ("reward_mapper(score, metadata)", "default_reward", "reward_mapper.py:"
                   "reward_mapper", "critic_", "response_length", "hook_timeout_seconds"):
        assert needle in text


# --- preview and the CLI ----------------------------------------------------------------------

def add_rated(store, score, *, tags=None, critical=False, reply="A fine reply."):
    conv = store.create_conversation().id
    turn = store.append_turn(conv, "question?", reply, prompt_ids=[1, 2], reply_ids=[3, 4, 5],
                             logprobs=[-1.0, -1.0, -1.0])
    store.rate(turn.id, score, tags=tags, critical=critical)
    return turn.id


def test_preview_rows_newest_first_with_age_and_weight(config, store):
    first = add_rated(store, 5)
    second = add_rated(store, 2, tags="too long", critical=True)
    later = datetime.now(timezone.utc) + timedelta(days=30)
    rows = preview(config, store, 10, now=later)
    assert [r["turn_id"] for r in rows] == [second, first]
    assert rows[0]["reward"] == pytest.approx(-0.5 - 0.5 - 0.2)
    assert rows[0]["tags"] == ["too long"] and rows[0]["critical"]
    assert rows[0]["age"] == "30d" and rows[0]["age_seconds"] >= 30 * 86400
    assert rows[0]["weight"] == pytest.approx(0.5, abs=1e-3)  # half_life_days defaults to 30
    assert len(preview(config, store, 1)) == 1


def test_preview_cli_text(invoke, store):
    add_rated(store, 4, tags="needs examples")
    add_rated(store, 1, critical=True)
    result = invoke("rewards", "preview")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "mapper: default (built in)"
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["turn", "score"])
    first, second = lines[header + 1].split(), lines[header + 2].split()
    assert first[1] == "1!" and first[3:5] == ["-1.50", "-1.50"] and first[6] == "yes"
    assert second[1] == "4" and second[3:5] == ["+0.40", "+0.40"]
    assert "needs examples" in lines[header + 2]


def test_preview_cli_json(invoke, store, config):
    turn = add_rated(store, 5, tags="great tone")
    result = invoke("rewards", "preview", "--json", "--limit", "5")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["ok"] is True and data["mapper"] == "default" and data["path"] is None
    row, = data["rows"]
    assert row["turn_id"] == turn and row["score"] == 5 and row["tags"] == ["great tone"]
    assert row["reward"] == pytest.approx(1.2) and row["human_reward"] == pytest.approx(1.2)
    assert row["kept"] is True and row["critics"] == {} and 0.99 < row["weight"] <= 1.0
    assert set(row) >= {"age", "age_seconds", "prompt", "response", "critical"}


def test_preview_cli_with_no_ratings(invoke, store):
    result = invoke("rewards", "preview")
    assert result.exit_code == 0 and "no rated turns yet" in result.output


def test_preview_cli_before_any_database_says_so_and_creates_none(invoke, home):
    result = invoke("rewards", "preview")
    assert result.exit_code == 1 and "there is no Reinf database" in result.output
    assert "reinf init" in result.output and not (home / "reinf.db").exists()


def test_preview_cli_shows_critic_columns(invoke, store, home):
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text("rewards:\n  critics: {format: 1.0, length: 0.5}\n"
                                      "  critic_combine: consensus\n")
    add_rated(store, 5, reply="This reply stops in the middle of")
    result = invoke("rewards", "preview")
    assert result.exit_code == 0, result.output
    header = next(line for line in result.output.splitlines() if "turn" in line)
    assert "format" in header and "length" in header
    assert "consensus" in result.output
    data = json.loads(invoke("rewards", "preview", "--json").output)
    assert data["rows"][0]["critics"]["format"] == -1.0
    assert data["rows"][0]["kept"] is False  # the human said 5, the format critic disagrees


def test_init_writes_the_hook_template(invoke, home):
    result = invoke("init", "--skip-model", "--json")
    assert result.exit_code == 0, result.output
    assert (home / "reward_mapper.py").read_text() == hook_template()


def test_unknown_critic_with_default_mapper_stops_training(config):
    cfg = config.replace(critics={"politeness": 1.0})
    with pytest.raises(HookError, match="politeness"):
        compute_rewards(cfg, [sample()], now=NOW)
    status = hook_status(cfg)
    assert status["ok"] is False and "'politeness'" in status["error"]
    assert "critic_politeness(" in status["fix"]
