"""The batched-sampling measurement of `reinf bench speed` on the demo model, tiny sizes:
the report's shape, and that it counts the tokens actually sampled (replies that stopped at
EOS count their own length, not max_new_tokens). No speed is asserted."""
from __future__ import annotations

import pytest

from reinf.catalog import PROJECT_ROOT

DEMO = PROJECT_ROOT / "models" / "reinf-demo"
pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(not (DEMO / "config.json").exists(),
                                 reason="the demo model is not built")]


@pytest.fixture
def loaded(config):
    from reinf.model.modeling import load_model

    return load_model(config.replace(model_path="reinf-demo"))


@pytest.fixture
def engine(loaded, config):
    from reinf.serving.engine import Engine

    return Engine(loaded, config.replace(model_path="reinf-demo"))


def test_measure_rollouts_counts_the_tokens_actually_sampled(engine):
    from reinf.bench.generation import format_rollouts, measure_rollouts
    from reinf.training.rollouts import sample_rollouts

    prompts = [engine.build_prompt([], p, max_new_tokens=24)
               for p in ("What is a cloud?", "Give me three tips for sleeping better.")]
    # 2 prompts x 4 replies in batches of 3: three batches, the last one short.
    result = measure_rollouts(engine, prompts, k=4, batch_size=3, max_new_tokens=24,
                              temperature=1.0, top_p=0.95, repeats=2, seed=5)
    assert (result["prompts"], result["replies_per_prompt"], result["replies"]) == (2, 4, 8)
    assert (result["batch_size"], result["max_new_tokens"], result["runs"]) == (3, 24, 2)
    assert result["model"] == engine.model_name
    assert [len(lengths) for lengths in result["reply_lengths"]] == [8, 8]

    # The same calls again: the counted lengths are the replies' own.
    again = [sample_rollouts(engine.model, engine.tokenizer, prompts, 4, temperature=1.0,
                             top_p=0.95, max_new_tokens=24, seed=seed, batch_size=3)
             for seed in (5, 6)]
    lengths = [[len(r.reply_ids) for r in replies] for replies in again]
    assert result["reply_lengths"] == lengths
    assert result["tokens_sampled"] == sum(map(sum, lengths))
    stopped = sum(r.finish_reason == "stop" for replies in again for r in replies)
    assert result["stopped_early"] == stopped
    # Some replies stopped at EOS, so counting rows x max_new_tokens would be wrong here.
    assert stopped > 0 and result["tokens_sampled"] < 2 * 8 * 24
    assert 0 < result["occupancy"] < 1
    assert result["seconds"] > 0 and result["tokens_per_s"] > 0
    assert "tok/s at batch 3" in format_rollouts(result)


def test_measure_generation_reports_batched_sampling_against_the_engine(loaded, config):
    from reinf.bench.generation import format_result, measure_generation

    result = measure_generation(loaded, ["Hello"], config=config, max_new_tokens=4, repeats=1,
                                swaps=0, rollout_batch=4, rollouts_per_prompt=2)
    rollouts = result["rollouts"]
    assert (rollouts["batch_size"], rollouts["prompts"], rollouts["replies"]) == (4, 2, 4)
    assert rollouts["max_new_tokens"] == result["new_tokens"] == 4
    assert rollouts["tokens_sampled"] == sum(rollouts["reply_lengths"][0])
    assert rollouts["ratio_to_engine"] == pytest.approx(
        rollouts["tokens_per_s"] / result["engine"]["tokens_per_s"], rel=0.01)
    text = format_result(result)
    assert "batched sampling:" in text and "the engine's single stream" in text
    assert "swap" not in result


def test_measure_generation_can_skip_batched_sampling(loaded, config):
    from reinf.bench.generation import measure_generation

    result = measure_generation(loaded, ["Hello"], config=config, max_new_tokens=2, repeats=1,
                                swaps=0, rollout_batch=0)
    assert "rollouts" not in result
