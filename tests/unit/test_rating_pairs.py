"""The rating model's pairs term (reinf.training.rating_model): Bradley-Terry picks beside
ridge ratings, on synthetic features (no model load)."""
from __future__ import annotations

import pytest
import torch

from reinf.training import rating_model as rm
from reinf.training.rating_model import (PairSet, cross_validated_pair_accuracy,
                                         fit_rating_model)


def synthetic(n: int = 40, extra: int = 20, pairs: int = 80, seed: int = 0):
    """A person whose liking is 4 [x0 > 0] + x1: they rate 5 or 1 by x0 alone (the scale is
    too coarse to say more) and pick between two replies of the same rating by x1, which
    the ratings never show. Rows after ``n`` are replies that were only paired."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n + extra, 6, generator=gen, dtype=torch.float64)
    y = [5.0 if v > 0 else 1.0 for v in x[:n, 0]]
    liking = 4 * (x[:, 0] > 0) + x[:, 1]
    rows = []
    while len(rows) < pairs:
        a, b = torch.randint(n + extra, (2,), generator=gen).tolist()
        if a != b and (x[a, 0] > 0) == (x[b, 0] > 0):  # ratings alone cannot separate them
            rows.append((a, b, 1.0 if liking[a] > liking[b] else 0.0))
    return x, y, PairSet.of(rows)


def test_pairs_teach_what_ratings_cannot():
    """The ratings say nothing about feature 1, so on their own the model guesses the
    held-out picks (about 50%); with the pairs term it predicts them."""
    x, y, pairs = synthetic()
    with_pairs, alone, held = cross_validated_pair_accuracy(x, y, pairs, seed=0)
    assert held == 80
    assert alone < 0.65, alone
    assert with_pairs > 0.7 and with_pairs > alone + 0.15, (with_pairs, alone)
    # the fitted model: its scores follow x1 now, and still the ratings (these picks are
    # certain, so Bradley-Terry spreads the scores of equally rated replies far apart: the
    # held-out ratings' Spearman falls from 0.79 to 0.46, still above min_consistency)
    model = fit_rating_model(x, y, heads=3, pairs=pairs)
    assert model.pairs == 80 and model.pair_scale > 0
    assert model.consistency > 0.3
    mean, _ = model.predict(x.float())
    assert torch.corrcoef(torch.stack([mean.double(), x[:, 1]]))[0, 1] > 0.5
    plain, _ = fit_rating_model(x[:40], y, heads=3).predict(x.float())
    assert abs(float(torch.corrcoef(torch.stack([plain.double(), x[:, 1]]))[0, 1])) < 0.2


def test_more_weight_on_pairs_moves_further_toward_them():
    x, y, pairs = synthetic(pairs=40, seed=1)
    light = cross_validated_pair_accuracy(x, y, pairs, pair_weight=0.1, seed=0)[0]
    heavy = cross_validated_pair_accuracy(x, y, pairs, pair_weight=4.0, seed=0)[0]
    assert heavy > light


def test_without_pairs_the_fit_is_the_ridge_one():
    x, y, _ = synthetic(extra=0)
    plain = fit_rating_model(x, y, heads=3, seed=2)
    empty = fit_rating_model(x, y, heads=3, seed=2, pairs=PairSet.of([]))
    off = fit_rating_model(x, y, heads=3, seed=2, pairs=synthetic(extra=0)[2],
                           pair_weight=0.0)
    for other in (empty, off):
        assert torch.equal(plain.weights, other.weights)
        assert other.consistency == plain.consistency and other.pairs == 0


def test_the_newton_fit_reaches_the_optimum_of_the_combined_objective():
    """The dual Newton solution matches a primal optimiser (LBFGS on w) on the same
    objective: sum (y - b - s)^2 + lam |w|^2 + beta sum BT log-loss, ties included."""
    x, y, pairs = synthetic(n=30, extra=10, pairs=30, seed=3)
    pairs = PairSet.of([*zip(pairs.a.tolist(), pairs.b.tolist(), pairs.target.tolist()),
                        (0, 1, 0.5), (2, 35, 0.5)])
    y_t = torch.tensor(y, dtype=torch.float64)
    mu, sd = rm._standardise(x[:30])
    xs = (x - mu) / sd
    strength, beta = 0.3, 2.5
    fit = rm._fit_pairs(xs @ xs.T, xs, y_t, torch.ones(30), pairs,
                        torch.ones(len(pairs), dtype=torch.float64), strength, beta)
    lam = strength * float((xs[:30] ** 2).sum(1).mean())
    w = torch.zeros(6, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w], max_iter=500, tolerance_grad=1e-12, tolerance_change=1e-15,
                            line_search_fn="strong_wolfe")
    soft = torch.nn.functional.softplus

    def closure():
        opt.zero_grad()
        s = xs @ w
        d = s[pairs.a] - s[pairs.b]
        t = pairs.target
        loss = ((y_t - y_t.mean() - s[:30]) ** 2).sum() + lam * (w @ w) \
            + beta * (t * soft(-d) + (1 - t) * soft(d)).sum()
        loss.backward()
        return loss

    for _ in range(3):
        opt.step(closure)
    assert torch.allclose(fit.w, w.detach(), atol=1e-6), (fit.w, w)
    assert fit.b == pytest.approx(float(y_t.mean()))


def test_a_tie_pulls_two_scores_together():
    """Two replies the ratings score far apart: a tie between them (weighted heavily)
    brings their scores closer; a pick for the lower one brings it above."""
    x, y, _ = synthetic(n=30, extra=0, seed=4)
    lo = min(range(30), key=lambda i: float(x[i, 0]))
    hi = max(range(30), key=lambda i: float(x[i, 0]))

    def gap(rows):
        model = fit_rating_model(x, y, heads=1, cross_validate=False,
                                 pairs=PairSet.of(rows) if rows else None, pair_weight=50.0)
        mean, _ = model.predict(x.float())
        return float(mean[hi] - mean[lo])

    apart = gap([])
    assert apart > 1
    assert 0 < gap([(hi, lo, 0.5)] * 5) < apart
    assert gap([(lo, hi, 1.0)] * 5) < gap([(hi, lo, 0.5)] * 5)


def test_pair_accuracy_needs_decisive_picks():
    x, y, _ = synthetic()
    assert cross_validated_pair_accuracy(x, y, PairSet.of([(0, 1, 0.5), (2, 3, 1.0)])) == \
        (None, None, 0)


def test_consistency_leaves_out_pairs_that_hold_a_held_out_rating():
    """Leave-one-out Spearman must not learn a held-out rating through a pair: a pair
    that names the held-out reply is dropped from that fold (rm._without)."""
    x, y, pairs = synthetic(n=10, extra=2, pairs=12, seed=5)
    xt, yt, pt = rm._without(x, 10, torch.tensor(y, dtype=torch.float64), pairs,
                             torch.tensor([3]))
    assert len(xt) == 11 and len(yt) == 9
    named = ((pairs.a == 3) | (pairs.b == 3)).sum()
    assert len(pt) == len(pairs) - named
    # the remapped rows are the same replies
    kept = [(a, b) for a, b in zip(pairs.a.tolist(), pairs.b.tolist()) if 3 not in (a, b)]
    for (a, b), ra, rb in zip(kept, pt.a.tolist(), pt.b.tolist()):
        assert torch.equal(xt[ra], x[a]) and torch.equal(xt[rb], x[b])


def test_columns_with_one_value_in_every_row_change_no_fit_and_get_no_weight():
    """Most of the bag's buckets are empty in any one set of replies: the fits drop such
    columns first. With and without them, ratings and picks give the same predictions,
    consistency and pair accuracy, and the saved model still has the full width."""
    x, y, pairs = synthetic()
    padded = torch.cat([x[:, :3], torch.zeros(len(x), 50, dtype=torch.float64), x[:, 3:],
                        torch.full((len(x), 7), 2.5, dtype=torch.float64)], 1)
    for p in (None, pairs):
        lean = fit_rating_model(x, y, heads=3, seed=2, pairs=p)
        wide = fit_rating_model(padded, y, heads=3, seed=2, pairs=p)
        assert wide.weights.shape == (3, 63) and wide.mu.shape == wide.sd.shape == (63,)
        assert torch.count_nonzero(wide.weights[:, 3:53]) == 0
        assert torch.count_nonzero(wide.weights[:, 56:]) == 0
        assert wide.consistency == pytest.approx(lean.consistency, abs=1e-9)
        assert torch.allclose(wide.predict(padded)[0], lean.predict(x)[0], atol=1e-5)
    assert cross_validated_pair_accuracy(padded, y, pairs) == pytest.approx(
        cross_validated_pair_accuracy(x, y, pairs))
