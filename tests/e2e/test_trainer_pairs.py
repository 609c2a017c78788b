"""Pairs in a real round on a tiny random Qwen2 (reinf.training.pairs, rating_model,
trainer): the rating model reads the person's picks and reports them, the round measures
the new adapter against the base, the picks rule starts a round from the parent, and
nothing forgotten is trained on."""
from __future__ import annotations

import random

import pytest

import trainkit as tk
from reinf.training.outcome import NothingToTrain
from reinf.training.trainer import train_round

pytestmark = pytest.mark.e2e
single_thread = pytest.fixture(autouse=True)(tk.one_thread)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tk.make_model(tmp_path_factory.mktemp("model"))


def rollout_config(home, model_dir, **extra):
    """The default method (a rating model, rollouts), forced past its consistency check
    (a random model's features carry little), small."""
    settings = dict(training_method="rollouts", training_min_consistency=-1.0,
                    training_rollout_prompts=4, training_rollouts_per_prompt=2,
                    training_rollout_max_new_tokens=6, training_winrate_prompts=5, ppo_epochs=1)
    return tk.train_config(home, model_dir, **{**settings, **extra})


def regenerate_pairs(store, model, n: int, *, seed: int) -> list[int]:
    """``n`` slots of two unrated alternatives each, the GOOD one picked (pick_alternative:
    the path regenerate takes). Returns the turn ids."""
    rng = random.Random(seed)
    conv = store.create_conversation("pairs")
    ids = []
    for i in range(n):
        prompt = tk.make_prompt(rng)
        turns = []
        for first in (tk.GOOD, tk.BAD):
            reply = [first, rng.randrange(3, 300), 2]
            turns.append(store.append_turn(
                conv.id, f"pick {seed}-{i}", "GOOD" if first == tk.GOOD else "BAD",
                prompt_ids=prompt, reply_ids=reply, logprobs=tk.reply_logprobs(model, prompt,
                                                                             reply),
                gen_params={"temperature": 1.0}, **({"slot": turns[0].index}
                                                    if turns else {})))
        store.pick_alternative(turns[0].id)
        ids += [t.id for t in turns]
    return ids


def text_pair(store, outcome: str, *, a=None, b=None, prompt_turn_id=None, prompt="typed",
              prompt_ids=(1, 7, 8, 1), blind=True):
    """A compare pair: text sides with their token ids, checkpoints ``a`` and ``b``."""
    return store.add_pair(prompt, outcome, a_text="a", b_text="b", a_checkpoint_id=a,
                          b_checkpoint_id=b, blind=blind, prompt_turn_id=prompt_turn_id,
                          prompt_ids=list(prompt_ids), a_reply_ids=[tk.GOOD, 5, 2],
                          b_reply_ids=[tk.BAD, 5, 2])


def test_a_round_reads_the_picks_and_measures_what_changed(home, model_dir):
    from reinf.storage.store import Store

    config = rollout_config(home, model_dir)
    store = Store.open(config)
    model = tk.load_policy(model_dir)
    tk.add_rated_turns(store, model, 10, seed=1)
    regenerate_pairs(store, model, 3, seed=2)
    text_pair(store, "a")
    text_pair(store, "tie", prompt="typed again")
    # a pick whose prompt turn lost its context (an earlier turn was forgotten) is not read
    conv = store.create_conversation("context")
    first = store.append_turn(conv.id, "secret", "x", prompt_ids=[1, 9, 1], reply_ids=[9, 2],
                              logprobs=[-1.0, -1.0])
    later = store.append_turn(conv.id, "next", "y", prompt_ids=[1, 9, 1, 9, 2, 1, 4, 1],
                              reply_ids=[4, 2], logprobs=[-1.0, -1.0])
    text_pair(store, "b", prompt_turn_id=later.id, prompt="next",
              prompt_ids=[1, 9, 1, 9, 2, 1, 4, 1])
    store.forget_turn(first.id)

    result = train_round(config, store)
    m = result.metrics
    assert result.status == "succeeded", result.message
    assert m["mode"] == "rollouts" and "5 picks" in m["mode_reason"]
    assert m["rating_model_pairs"] == 5
    assert m["rating_model_pairs_skipped"] == {"forgotten_context": 1}
    assert m["rating_model_pairs_held_out"] == 4          # the tie trains but is not scored
    assert 0 <= m["rating_model_pair_accuracy"] <= 1
    assert 0 <= m["rating_model_pair_accuracy_ratings_only"] <= 1
    assert m["rating_model_pair_scale"] > 0
    by_model = m["vs_base"]["by_rating_model"]
    assert by_model["prompts"] == 5 and by_model["pairs"] == 5
    assert by_model["wins"] + by_model["losses"] + by_model["ties"] == 5
    assert by_model["win_rate"] == pytest.approx((by_model["wins"] + by_model["ties"] / 2) / 5)
    assert 1 <= by_model["score_mean"] <= 5 and by_model["seconds"] > 0
    assert m["vs_base"]["by_your_picks"] is None           # the base is its parent
    run = store.get_run(result.run_id)
    assert run.metrics["vs_base"]["by_rating_model"] == pytest.approx(by_model)
    assert store.get_checkpoint(result.checkpoint_id).metrics["vs_base"] == run.metrics["vs_base"]

    # The person compares the new checkpoint with the base: picks alone are something new
    # to train on, and the next round counts them "by your picks" (its parent's).
    with pytest.raises(NothingToTrain):
        train_round(config, store)
    text_pair(store, "a", a=result.checkpoint_id, prompt="compare 1")
    text_pair(store, "b", a=result.checkpoint_id, prompt="compare 2")
    again = train_round(config, store)
    assert again.status == "succeeded", again.message
    picks = again.metrics["vs_base"]["by_your_picks"]
    assert picks == {"win_rate": 0.5, "wins": 1, "losses": 1, "ties": 0, "pairs": 2,
                     "checkpoints": [result.checkpoint_id]}
    assert again.metrics["rating_model_pairs"] == 7
    store.close()


def test_the_picks_rule_continues_from_the_parent(home, model_dir):
    """Round 2's checkpoint lost 2 of 3 blind picks against its parent (round 1's): round 3
    continues from round 1's checkpoint (its state: round counter 1 -> 2), and the picks
    rule says so; the passed-over checkpoint stays, inactive."""
    from reinf.storage.store import Store

    config = tk.train_config(home, model_dir)
    store = Store.open(config)
    model = tk.load_policy(model_dir)
    tk.add_rated_turns(store, model, 8, seed=3)
    one = train_round(config, store)
    tk.add_rated_turns(store, model, 8, seed=4)
    two = train_round(config, store)
    assert two.metrics["parent_id"] == one.checkpoint_id and two.metrics["round"] == 2
    for outcome in ("b", "b", "a"):
        text_pair(store, outcome, a=two.checkpoint_id, b=one.checkpoint_id)
    tk.add_rated_turns(store, model, 4, seed=5)
    three = train_round(config, store)
    assert three.status == "succeeded", three.message
    assert three.metrics["parent_id"] == one.checkpoint_id
    assert three.metrics["round"] == 2                     # round 1's counters, not round 2's
    assert three.metrics["passed_over"] == [{
        "checkpoint_id": two.checkpoint_id, "parent_id": one.checkpoint_id,
        "win_rate": 1 / 3, "wins": 1, "losses": 2, "ties": 0, "pairs": 3}]
    assert any("behind its parent" in w for w in three.metrics["warnings"])
    assert store.get_checkpoint(three.checkpoint_id).parent_id == one.checkpoint_id
    assert store.active_checkpoint().id == three.checkpoint_id
    assert store.get_checkpoint(two.checkpoint_id).status == "promoted"
    store.close()


def test_a_pick_forgotten_while_the_round_ran_is_not_promoted(home, model_dir, monkeypatch):
    """A pick on a typed prompt holds no turn, so the store's own check cannot see it go:
    the round checks its picks are all still there before promoting."""
    from reinf.storage.store import Store
    from reinf.training import trainer

    config = rollout_config(home, model_dir, training_winrate_prompts=0)
    store = Store.open(config)
    model = tk.load_policy(model_dir)
    tk.add_rated_turns(store, model, 9, seed=6)
    conv = store.create_conversation("typed")
    typed = store.append_turn(conv.id, "typed", "unrated", prompt_ids=[1, 7, 8, 1],
                              reply_ids=[5, 2], logprobs=[-1.0, -1.0])
    text_pair(store, "a")                                   # on the message "typed"
    measured = trainer.measure_vs_base

    def forget_meanwhile(*args, **kwargs):
        store.forget_turn(typed.id)                         # the last turn holding "typed"
        return measured(*args, **kwargs)

    monkeypatch.setattr(trainer, "measure_vs_base", forget_meanwhile)
    result = train_round(config, store)
    assert result.status == "rejected"
    assert "1 of the picks this round learnt from was forgotten" in result.message
    assert store.active_checkpoint() is None
    assert store.get_checkpoint(result.checkpoint_id).status == "rejected"
    assert not (config.data_dir / "checkpoints" / result.checkpoint_id).exists()
    store.close()
