"""Rewrites in a real round on a tiny random Qwen2 (reinf.training.rewrites, plan, trainer):
where every rating is the same (the model never writes what the person wants), a rewrite is
the only contrast there is, and the round learns from it; the rating model reads rewrites as
ratings of 5 and as picks; the reward mapper sees them; a forget during the round is honoured.
"""
from __future__ import annotations

import pytest
import torch

import trainkit as tk
from reinf.training.rewrites import REWRITE_SCORE
from reinf.training.trainer import train_round

pytestmark = pytest.mark.e2e
single_thread = pytest.fixture(autouse=True)(tk.one_thread)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tk.make_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def wanted(model_dir) -> str:
    """A rewrite's text whose first token is GOOD (the tiny vocabulary's "F")."""
    from transformers import AutoTokenizer

    text = "F one two"
    assert AutoTokenizer.from_pretrained(model_dir).encode(
        text, add_special_tokens=False)[0] == tk.GOOD
    return text


def all_bad(store, model, n: int, *, seed: int) -> list[int]:
    """``n`` turns that all start with BAD and are all rated 1: nothing to contrast."""
    return tk.add_rated_turns(store, model, n, seed=seed, good_fraction=0.0)


def test_rewrites_are_the_contrast_that_all_alike_ratings_lack(tmp_path, model_dir, wanted):
    """The same stream of ratings, all 1, trained once alone and once with the person's
    rewrites of half the turns: only the rewrites move the model toward what they show."""
    from reinf.storage.store import Store

    base = tk.load_policy(model_dir)
    good0 = tk.first_token_logp(base, tk.GOOD)
    moved = {}
    for arm in ("ratings alone", "with rewrites"):
        config = tk.train_config(tmp_path / arm, model_dir)
        store = Store.open(config)
        turns = all_bad(store, base, 12, seed=3)
        if arm == "with rewrites":
            for turn_id in turns[::2]:
                store.rewrite(turn_id, wanted)
        result = train_round(config, store)
        assert result.status == "succeeded", result.message
        assert result.metrics["rewrites"] == (6 if arm == "with rewrites" else 0)
        trained = tk.load_policy(model_dir, store.active_checkpoint().path)
        moved[arm] = tk.first_token_logp(trained, tk.GOOD) - good0
        store.close()
    assert abs(moved["ratings alone"]) < 0.01, moved      # all alike: nothing to learn
    assert moved["with rewrites"] > 0.1, moved            # toward the rewrites' first token


def test_imitation_raises_the_rewrites_further_than_the_clipped_objective(tmp_path,
                                                                          model_dir, wanted):
    """training.rewrite_imitation adds the rewrites' log-likelihood to the PPO loss; the
    clipped objective alone moves a demonstration's tokens by at most the clip range."""
    from reinf.storage.store import Store

    base = tk.load_policy(model_dir)
    good0 = tk.first_token_logp(base, tk.GOOD)
    moved, losses = {}, {}
    for coef in (0.0, 1.0):
        config = tk.train_config(tmp_path / str(coef), model_dir,
                                 training_rewrite_imitation=coef)
        store = Store.open(config)
        for turn_id in all_bad(store, base, 12, seed=3)[::2]:
            store.rewrite(turn_id, wanted)
        result = train_round(config, store)
        assert result.status == "succeeded", result.message
        losses[coef] = result.metrics["imitation_loss"]
        moved[coef] = tk.first_token_logp(
            tk.load_policy(model_dir, store.active_checkpoint().path), tk.GOOD) - good0
        store.close()
    assert losses[0.0] is None and losses[1.0] > 0
    assert moved[1.0] > moved[0.0] + 0.03, moved


@pytest.mark.parametrize("rule", ["until-likely", "once"])
def test_imitating_the_best_rated_replies_raises_a_rare_good_reply_further(tmp_path, model_dir,
                                                                          rule):
    """training.imitate_rated 5: the replies rated 5 are imitated as rewrites are, beside the
    clipped objective, which raises a reply by at most the clip range a round. The same
    stream (the model's own likely replies rated 1, and 3 replies that start with a token it
    finds less likely, rated 5) trained with it off and on: on, it reads exactly the 5s and
    moves the model further toward them."""
    base = tk.load_policy(model_dir)
    good0 = tk.first_token_logp(base, tk.GOOD)
    moved, metrics = {}, {}
    for threshold in (0, 5):
        config = tk.train_config(tmp_path / f"{rule}-{threshold}", model_dir,
                                 training_imitate_rated=threshold,
                                 training_rewrite_imitation_rule=rule)
        metrics[threshold], moved[threshold] = round_toward_good(
            config, model_dir, good0, lambda store: (
                likely_turns(store, base, 13, seed=5),
                likely_turns(store, base, 3, seed=6, first=tk.GOOD, score=5)))
    assert metrics[0]["rated_imitated"] == 0 and metrics[0]["imitation_loss"] is None
    assert metrics[5]["rated_imitated"] == 3 and metrics[5]["imitation_loss"] > 0
    assert metrics[5]["rewrites_imitated"] == 0
    assert moved[0] > 0, moved                      # the clipped objective alone moves a little
    assert moved[5] > 1.2 * moved[0], moved         # imitation moves it further


def test_imitating_the_well_rated_replies_served_in_a_style_reads_only_those(tmp_path,
                                                                           model_dir):
    """training.imitate_explored 5: of the replies rated 5, the ones served in a style are
    imitated (they stand for what the model seldom writes unasked), the plain ones are not;
    the model moves further toward them than with it off."""
    base = tk.load_policy(model_dir)
    good0 = tk.first_token_logp(base, tk.GOOD)
    moved, metrics = {}, {}
    for threshold in (0, 5):
        config = tk.train_config(tmp_path / f"explored-{threshold}", model_dir,
                                 training_imitate_explored=threshold)
        metrics[threshold], moved[threshold] = round_toward_good(
            config, model_dir, good0, lambda store: (
                likely_turns(store, base, 12, seed=5),
                likely_turns(store, base, 1, seed=7, score=5),            # a plain 5
                likely_turns(store, base, 3, seed=6, first=tk.GOOD, score=5,
                             style="Use a list.")))
    assert metrics[0]["rated_imitated"] == 0 and metrics[0]["imitation_loss"] is None
    assert metrics[5]["rated_imitated"] == 3 and metrics[5]["imitation_loss"] > 0
    assert metrics[5]["explored_imitated"] == 3 and metrics[0]["explored_imitated"] == 0
    # imitated once (the default rule), in full: 0.17 against 0.14 here
    assert moved[5] > 1.1 * moved[0] > 0, moved


def test_the_styled_fives_of_a_person_who_rates_nearly_everything_five_are_not_imitated(
        tmp_path, model_dir):
    """training.imitate_explored's margin: the same three styled replies rated 5, among
    plain replies rated 5 and 4 instead of 1, stand less than EXPLORED_MARGIN above the
    person's mean, so the round imitates none of them."""
    base = tk.load_policy(model_dir)
    config = tk.train_config(tmp_path / "generous", model_dir, training_imitate_explored=5)
    metrics, _ = round_toward_good(config, model_dir, tk.first_token_logp(base, tk.GOOD),
                                   lambda store: (
        likely_turns(store, base, 10, seed=5, score=5),
        likely_turns(store, base, 3, seed=7, score=4),
        likely_turns(store, base, 3, seed=6, first=tk.GOOD, score=5, style="Use a list.")))
    assert metrics["explored_imitated"] == 0 and metrics["rated_imitated"] == 0
    assert metrics["imitation_loss"] is None


def test_a_rewrite_is_imitated_until_an_adapter_that_learnt_it_is_promoted(home, model_dir,
                                                                             wanted):
    """training.rewrite_imitation_rule once: the unclipped imitation term reads a rewrite in
    the rounds that start from an adapter made before it was written; once such a round is
    promoted, later rounds keep it as a demonstration (clipped, like any episode) and imitate
    only the rewrites new to them, so a few short rewrites are not pushed up again round
    after round."""
    from reinf.storage.store import Store

    config = tk.train_config(home, model_dir, training_rewrite_imitation=1.0,
                             training_rewrite_imitation_rule="once")
    store = Store.open(config)
    base = tk.load_policy(model_dir)
    first = all_bad(store, base, 6, seed=7)
    store.rewrite(first[0], wanted)
    store.rewrite(first[1], wanted)
    one = train_round(config, store)
    assert one.status == "succeeded", one.message
    assert one.metrics["rewrites"] == 2 and one.metrics["rewrites_imitated"] == 2
    assert one.metrics["imitation_loss"] > 0

    second = all_bad(store, base, 4, seed=8)
    two = train_round(config, store)  # new ratings, no new rewrite
    assert two.status == "succeeded", two.message
    assert two.metrics["rewrites"] == 2 and two.metrics["rewrites_imitated"] == 0
    assert two.metrics["imitation_loss"] is None

    store.rewrite(second[0], wanted)  # a new one, and one changed: both new to the adapter
    store.rewrite(first[0], wanted + " two")
    three = train_round(config, store)
    assert three.status == "succeeded", three.message
    assert three.metrics["rewrites"] == 3 and three.metrics["rewrites_imitated"] == 2
    assert three.metrics["imitation_loss"] > 0
    store.close()


def round_toward_good(config, model_dir, good0: float, fill) -> tuple[dict, float]:
    """One round on a fresh store that ``fill(store)`` stocks with rated turns: the round's
    metrics, and how far it moved the first token GOOD's log-probability from ``good0``."""
    from reinf.storage.store import Store

    store = Store.open(config)
    try:
        fill(store)
        result = train_round(config, store)
        assert result.status == "succeeded", result.message
        moved = tk.first_token_logp(
            tk.load_policy(model_dir, store.active_checkpoint().path), tk.GOOD) - good0
        return result.metrics, moved
    finally:
        store.close()


def likely_turns(store, model, n: int, *, seed: int, first: int | None = None,
                 score: int = 1, style: str | None = None) -> list[tuple[int, list[int]]]:
    """``n`` turns whose replies are the model's own greedy continuations (as likely, per
    token, as any reply it writes), each rated ``score``: (turn id, prompt ids) each. With
    ``first``, each reply starts with that token and goes on greedily from it; with
    ``style``, the turn says it was served in that style (explore_styles)."""
    import random

    rng = random.Random(seed)
    conv = store.create_conversation(f"greedy {seed}")
    turn_ids = []
    for i in range(n):
        prompt = tk.make_prompt(rng)
        start = prompt + ([] if first is None else [first])
        with torch.no_grad():
            out = model.generate(torch.tensor([start]), max_new_tokens=4 - (first is not None),
                                 do_sample=False, pad_token_id=0)
        reply = out[0, len(prompt):].tolist()
        turn = store.append_turn(conv.id, f"prompt {seed}-{i}", "greedy", prompt_ids=prompt,
                                 reply_ids=reply, logprobs=tk.reply_logprobs(model, prompt, reply),
                                 gen_params={"temperature": tk.TEMPERATURE,
                                             **({"style": style} if style else {})})
        store.rate(turn.id, score)
        turn_ids.append((turn.id, prompt))
    return turn_ids


def test_until_likely_imitates_every_rewrite_in_every_round_while_it_is_unlikely(tmp_path,
                                                                                   model_dir,
                                                                                   wanted):
    """training.rewrite_imitation_rule until-likely: a round reads every rewrite, new or not,
    and pushes up each of its tokens the model finds less likely than its own replies' tokens
    on average (the round's imitation_target). Where imitating once stops after the first
    round, it goes on pushing in the second; by the third every token of the rewrites is as
    likely as the model's own, and it stops."""
    from reinf.storage.store import Store

    from transformers import AutoTokenizer

    base = tk.load_policy(model_dir)
    wanted_ids = AutoTokenizer.from_pretrained(model_dir).encode(wanted, add_special_tokens=False)

    def likelihood(model, prompts) -> float:  # of the rewrite, per token, on its prompts
        return sum(sum(tk.reply_logprobs(model, p, wanted_ids)) for p in prompts) / (
            len(prompts) * len(wanted_ids))

    moved, rounds = {}, {}
    for rule in ("once", "until-likely"):
        config = tk.train_config(tmp_path / rule, model_dir, training_rewrite_imitation=1.0,
                                 training_rewrite_imitation_rule=rule)
        store = Store.open(config)
        first = likely_turns(store, base, 6, seed=7)
        for turn_id, _ in first[:4]:  # far less likely than the model's greedy replies
            store.rewrite(turn_id, wanted)
        prompts = [p for _, p in first[:4]]
        before = likelihood(base, prompts)
        rounds[rule] = []
        for round_ in range(3):  # after the first: new ratings, no new rewrite
            if round_:
                likely_turns(store, base, 4, seed=7 + round_)
            result = train_round(config, store)
            assert result.status == "succeeded", result.message
            assert result.metrics["rewrites"] == 4, result.metrics
            rounds[rule].append(result.metrics)
        moved[rule] = likelihood(tk.load_policy(model_dir, store.active_checkpoint().path),
                                 prompts) - before
        store.close()
    once, until = rounds["once"], rounds["until-likely"]
    assert [m["rewrites_imitated"] for m in once] == [4, 0, 0]
    # the second round still finds most of the rewrites' tokens less likely: pushed
    assert until[1]["rewrites_imitated"] == 4 and until[1]["imitation_active"] > 0
    assert until[1]["imitation_loss"] > until[1]["imitation_target"] > 0
    assert min(moved.values()) > 0.1, moved  # both moved toward the rewrites
    # and once every token is as likely as its own replies' are, nothing is pushed further
    assert until[2]["imitation_active"] == 0
    assert until[2]["imitation_loss"] <= until[2]["imitation_target"] + 0.05


def test_the_rating_model_reads_rewrites_as_fives_and_picks(home, model_dir, wanted):
    from reinf.storage.store import Store

    config = tk.train_config(home, model_dir, training_method="rollouts",
                             training_min_consistency=-1.0, training_min_ratings=8,
                             training_rollout_prompts=4, training_rollouts_per_prompt=2,
                             training_rollout_max_new_tokens=6, training_winrate_prompts=4,
                             ppo_epochs=1)
    store = Store.open(config)
    turns = all_bad(store, tk.load_policy(model_dir), 6, seed=4)
    for turn_id in turns[:3]:
        store.rewrite(turn_id, wanted)
    result = train_round(config, store)
    m = result.metrics
    assert result.status == "succeeded", result.message
    # 6 ratings + 3 rewrites reach min_ratings 8, and the 5s give the 1s a contrast
    assert m["mode"] == "rollouts" and m["rating_model_rewrites"] == 3
    assert m["rating_model_ratings"] == 6 and m["rating_model_pairs"] == 3
    assert m["rating_model_consistency"] is not None
    assert m["rewrites"] == 3 and m["rated_in_batch"] >= 1
    assert "3 rewrites" in m["mode_reason"]


def test_in_a_rollout_round_every_5_is_imitated_not_only_those_a_rollout_drew(home,
                                                                             model_dir):
    """training.imitate_rated in rollout mode: the batch holds the rated replies to the
    round's rollout prompts (newest first), and every 5 besides, so all are imitated."""
    from reinf.storage.store import Store

    config = tk.train_config(home, model_dir, training_method="rollouts",
                             training_min_consistency=-1.0, training_min_ratings=8,
                             training_rollout_prompts=3, training_rollouts_per_prompt=2,
                             training_rollout_max_new_tokens=6, training_winrate_prompts=0,
                             ppo_epochs=1, training_imitate_rated=5)
    store = Store.open(config)
    turns = tk.add_rated_turns(store, tk.load_policy(model_dir), 12, seed=11, good_fraction=0.8)
    fives = sum(store.get_turn(t).reply == "GOOD" for t in turns)
    assert 3 < fives < 12, fives  # a contrast for the rating model, and more 5s than prompts
    result = train_round(config, store)
    m = result.metrics
    assert result.status == "succeeded", result.message
    assert m["mode"] == "rollouts" and m["rated_in_batch"] == 3
    in_batch = m["rated_imitated"] - m["imitated_joined"]   # the 5s among the rollout prompts
    assert m["rated_imitated"] == fives and 0 <= in_batch <= 3 < m["imitated_joined"]
    assert m["samples"] == 3 * 2 + 3 + m["imitated_joined"]
    assert m["imitation_loss"] > 0
    store.close()


def test_the_reward_mapper_sees_a_rewrite_and_rewards_it(home, model_dir, wanted):
    from reinf.storage.store import Store

    hook = home / "reward_mapper.py"
    home.mkdir(parents=True, exist_ok=True)
    hook.write_text(
        "def reward_mapper(score, metadata):\n"
        "    if metadata['rewrite']:\n"
        f"        assert score == {REWRITE_SCORE} and metadata['response'] == {wanted!r}\n"
        "        return 0.75\n"
        "    return -0.5\n")
    config = tk.train_config(home, model_dir, reward_mapper=f"{hook}:reward_mapper")
    store = Store.open(config)
    turns = all_bad(store, tk.load_policy(model_dir), 6, seed=5)
    store.rewrite(turns[0], wanted)
    result = train_round(config, store)
    assert result.status == "succeeded", result.message
    assert result.metrics["rewrites"] == 1
    # the batch: six ratings at the mapper's -0.5 and the rewrite at its 0.75
    assert result.metrics["reward_mean"] == pytest.approx((6 * -0.5 + 0.75) / 7)


def test_a_rewrite_of_a_turn_forgotten_during_the_round_is_not_promoted(home, model_dir,
                                                                        wanted, monkeypatch):
    from reinf.storage.store import Store
    from reinf.training import trainer

    config = tk.train_config(home, model_dir)
    store = Store.open(config)
    turns = all_bad(store, tk.load_policy(model_dir), 6, seed=6)
    unrated = store.append_turn(store.create_conversation("x").id, "q", "y",
                                prompt_ids=[1, 9, 8, 1], reply_ids=[41, 5, 2],
                                logprobs=[-1.0] * 3, gen_params={"temperature": 1.0})
    store.rewrite(unrated.id, wanted)
    real = trainer.measure_fluency

    def forget_then_measure(*args, **kwargs):  # the person forgets it while the round runs
        store.forget_turn(unrated.id)
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "measure_fluency", forget_then_measure)
    result = train_round(config, store)
    assert result.status == "rejected" and "forgotten" in result.message
    assert store.active_checkpoint() is None and store.get_turn(turns[0]).rating.score == 1
