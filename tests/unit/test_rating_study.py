"""The rating-model study's judge (``reinf bench rating-model``) on made-up features: it
fits the trainer's own rating model and scores it on prompts it never saw."""
from __future__ import annotations

import torch

from reinf.bench.rating_study import judge, summarise


def _replies(prompts: int, per_prompt: int, seed: int = 0):
    """Features of ``prompts`` x ``per_prompt`` replies: 16 noise dimensions and, first, a
    'quality' dimension; scores 1..5 that follow quality."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(prompts * per_prompt, 17, generator=gen)
    quality = x[:, 0]
    scores = [float(min(5, max(1, round(3 + 1.5 * q)))) for q in quality.tolist()]
    groups = {g: list(range(g * per_prompt, (g + 1) * per_prompt)) for g in range(prompts)}
    return x, scores, groups


def test_features_that_carry_the_score_order_the_replies_to_one_prompt():
    x, scores, groups = _replies(40, 4)
    f = judge(x, scores, groups, 24, seed=1)
    assert f["pairs"] > 20                      # 16 held-out prompts, 6 pairs each, minus ties
    assert f["within_prompt_accuracy"] > 0.75  # 24 ratings for 17 dimensions: not perfect
    assert f["spearman"] > 0.6 and f["ceiling"] >= f["spearman"]
    assert f["cross_validated"] > 0.5 and f["all_alike"] == 0.0


def test_the_weighted_accuracy_counts_the_pairs_a_round_pushes_hardest():
    """A model that errs mostly on pairs it scores nearly alike pushes the rater's way more
    often than its plain accuracy says; that is what the weighted figure measures."""
    x, scores, groups = _replies(40, 4)
    draws = [judge(x, scores, groups, 24, seed=s) for s in range(4)]
    for f in draws:
        assert f["weighted_accuracy"] > f["within_prompt_accuracy"]
    # every pair is pushed, the ones the rater scores alike too: the share of the push
    # that goes the rater's way is below the weighted accuracy on the pairs it tells apart
    for f in draws:
        assert 0 < f["push_share"] < f["weighted_accuracy"]
    # the weights are the scores a round gives (mean - pessimism x std): a far larger
    # pessimism reorders some pairs, so the figure follows the setting
    assert judge(x, scores, groups, 24, seed=0, pessimism=50.0)["weighted_accuracy"] \
        != draws[0]["weighted_accuracy"]


def test_features_that_do_not_carry_it_are_a_coin():
    x, scores, groups = _replies(40, 4)
    noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(9))
    draws = [judge(noise, scores, groups, 24, seed=s) for s in range(8)]
    for key in ("within_prompt_accuracy", "weighted_accuracy"):
        assert 0.3 < sum(f[key] for f in draws) / len(draws) < 0.7
    # and less than half of a round's push goes the rater's way
    assert sum(f["push_share"] for f in draws) / len(draws) < 0.5


def test_ratings_all_alike_fit_nothing_and_say_so():
    x, scores, groups = _replies(20, 3)
    alike = judge(x, [3.0] * len(x), groups, 8, seed=0)
    assert alike["all_alike"] == 1.0 and alike["within_prompt_accuracy"] is None
    assert alike["weighted_accuracy"] is None and alike["push_share"] is None
    fitted = judge(x, scores, groups, 8, seed=0)
    both = summarise([alike, fitted])  # a mean over the draws where the figure exists
    assert both["all_alike"] == 0.5
    assert both["within_prompt_accuracy"] == round(fitted["within_prompt_accuracy"], 3)


def test_picks_between_two_replies_to_one_prompt_join_the_fit():
    """Every 2nd interaction a pick: fewer ratings, and the picks teach the order."""
    x, scores, groups = _replies(60, 4)
    alone = judge(x, scores, groups, 16, seed=3)
    with_picks = judge(x, scores, groups, 16, seed=3, pairs_every=2)
    assert with_picks["within_prompt_accuracy"] is not None
    assert with_picks["within_prompt_accuracy"] > 0.6     # 8 ratings and 8 picks still learn
    # the same prompts are drawn, so both are judged on the same held-out pairs
    assert with_picks["pairs"] == alone["pairs"]
    # picks alone carry no scale: with every interaction a pick there are no ratings to fit
    assert judge(x, scores, groups, 16, seed=3, pairs_every=1)["all_alike"] == 1.0
