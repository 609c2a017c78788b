"""The rating model: a small model of *this person's* judgement, stage 1 of a round.

It predicts the 1-5 score the person would give a (context, reply), so that a round can
score fresh replies nobody has rated (``reinf.training.rollouts``) and each real rating
counts many times.

**Features** come from one no-grad forward of the *base* model (the adapter disabled), so
they never drift with the policy it scores. For each (prompt, reply) the features are, over
the reply's own token positions:

- the mean input embedding (which tokens the reply uses),
- the mean hidden state of the middle layer and of the last layer (what the reply says),
- the last layer's hidden state at the final reply token (a summary of the whole reply),
- log(1 + reply tokens) (how long it is).

**The head** is ridge regression on standardised features, fitted in closed form in its
dual (n x n) form: a person gives tens or hundreds of ratings, and the features have a few
hundred to a few thousand dimensions. The ridge strength is chosen by leave-one-out error,
which ridge gives in closed form. A bootstrap ensemble of ``heads`` ridge fits gives a
spread; the reward of a fresh reply is pessimistic, ``mean - pessimism * std``, so a
reply the model is unsure of is not over-rewarded.

**Consistency** is the cross-validated Spearman correlation between the predicted and the
real scores of held-out ratings (leave-one-out up to 48 ratings, 10 folds beyond; the ridge
strength is chosen inside each fold, so the figure is honest). Its ceiling is below 1 when
ratings tie (``spearman_ceiling``: 0.87 for ratings split evenly between two values). It
decides whether the round may trust the model (see ``reinf.training.trainer``) and is
reported as the "reward consistency" figure.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from reinf.sampling import ForwardArgs

#: Ridge strengths tried, as multiples of the mean diagonal of the feature kernel.
RIDGE_GRID = (1e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0, 100.0)
FOLDS = 10              # cross-validation folds once there are more than LOO_UP_TO ratings
LOO_UP_TO = 48          # up to here every rating is its own fold (leave-one-out)


# --- features -----------------------------------------------------------------------------

def reply_features(model, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], *,
                   batch_size: int = 16) -> Tensor:
    """(N, D) fp32 features of ``pairs`` = (prompt_ids, reply_ids), from the base model with
    any adapter disabled. Replies must be non-empty; prompts too."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    off = model.disable_adapter() if hasattr(model, "disable_adapter") else contextlib.nullcontext()
    device = next(model.parameters()).device
    rows = []
    was_training = model.training
    model.eval()
    try:
        with off, torch.no_grad():
            for start in range(0, len(pairs), batch_size):
                chunk = pairs[start:start + batch_size]
                rows.append(_features(base, chunk, device))
    finally:
        model.train(was_training)
    return torch.cat(rows) if rows else torch.zeros(0, 0)


def _features(base, chunk, device) -> Tensor:
    n_ctx = max(len(p) + len(r) for p, r in chunk)
    input_ids = torch.zeros(len(chunk), n_ctx, dtype=torch.long)
    attention = torch.zeros(len(chunk), n_ctx, dtype=torch.long)
    reply_mask = torch.zeros(len(chunk), n_ctx)
    last = torch.zeros(len(chunk), dtype=torch.long)
    lengths = torch.zeros(len(chunk))
    for i, (prompt, reply) in enumerate(chunk):
        p, r = len(prompt), len(reply)
        input_ids[i, :p + r] = torch.tensor(list(prompt) + list(reply))
        attention[i, :p + r] = 1
        reply_mask[i, p:p + r] = 1.0
        last[i] = p + r - 1
        lengths[i] = r
    # Hidden states only: the decoder under the LM head, so no (B, L, V) logits are made
    # and thrown away (a model without get_decoder is asked for one column of logits).
    decoder = base.get_decoder() if hasattr(base, "get_decoder") else None
    kwargs = {}
    if decoder is None or decoder is base:
        decoder = base
        kwargs = {"logits_to_keep": 1} if ForwardArgs(base).keeps_logits else {}
    out = decoder(input_ids=input_ids.to(device), attention_mask=attention.to(device),
                  output_hidden_states=True, use_cache=False, **kwargs)
    hidden = out.hidden_states  # (layers + 1) x (B, L, H)
    mask = reply_mask.to(device)[..., None]
    count = mask.sum(1).clamp_min(1.0)

    def pooled(h: Tensor) -> Tensor:
        return ((h.float() * mask).sum(1) / count).cpu()

    rows = torch.arange(len(chunk), device=device)
    final = hidden[-1][rows, last.to(device)].float().cpu()
    return torch.cat([pooled(hidden[0]), pooled(hidden[len(hidden) // 2]), pooled(hidden[-1]),
                      final, torch.log1p(lengths)[:, None]], dim=1)


# --- ridge regression -----------------------------------------------------------------------

@dataclass
class _Ridge:
    """One standardised ridge fit, kept in primal form: y = ((x - mu) / sd) . w + b."""
    w: Tensor   # (D,)
    b: float


def _standardise(x: Tensor) -> tuple[Tensor, Tensor]:
    mu = x.mean(0)
    sd = x.std(0, unbiased=False)
    return mu, torch.where(sd > 1e-6, sd, torch.ones_like(sd))


def _fit(xs: Tensor, y: Tensor, strength: float) -> _Ridge:
    """Ridge on already standardised ``xs`` (n, D), dual form: w = Xs^T (K + lam I)^-1 yc."""
    y_mean = float(y.mean())
    k = xs @ xs.T
    lam = strength * float(k.diagonal().mean().clamp_min(1e-6))
    alpha = torch.linalg.solve(k + lam * torch.eye(len(y), dtype=k.dtype), y - y_mean)
    return _Ridge(xs.T @ alpha, y_mean)


def _loo_errors(xs: Tensor, y: Tensor, strength: float) -> Tensor:
    """Leave-one-out residuals of a ridge fit, in closed form: (y - yhat) / (1 - H_ii)."""
    n = len(y)
    k = xs @ xs.T
    lam = strength * float(k.diagonal().mean().clamp_min(1e-6))
    yc = y - y.mean()
    hat = k @ torch.linalg.inv(k + lam * torch.eye(n, dtype=k.dtype))
    # Centring y costs one degree of freedom: count it in the leverage.
    leverage = hat.diagonal() + 1.0 / n
    return (yc - hat @ yc) / (1 - leverage).clamp_min(1e-6)


def choose_strength(x: Tensor, y: Tensor) -> float:
    """The ridge strength from RIDGE_GRID with the lowest leave-one-out squared error."""
    mu, sd = _standardise(x)
    xs = ((x - mu) / sd).double()
    yd = y.double()
    errors = [float((_loo_errors(xs, yd, s) ** 2).mean()) for s in RIDGE_GRID]
    return RIDGE_GRID[min(range(len(errors)), key=errors.__getitem__)]


# --- the model ------------------------------------------------------------------------------

@dataclass
class RatingModel:
    """A bootstrap ensemble of ridge heads on shared standardisation."""
    mu: Tensor          # (D,)
    sd: Tensor          # (D,)
    weights: Tensor     # (heads, D)
    biases: Tensor      # (heads,)
    strength: float     # ridge strength (multiple of the kernel's mean diagonal)
    n: int              # ratings it was fitted on
    consistency: float | None  # cross-validated Spearman; None when undefined

    def predict(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Predicted score of each row: (mean over heads, std over heads), clamped to 1..5."""
        xs = ((x.double() - self.mu.double()) / self.sd.double())
        scores = xs @ self.weights.double().T + self.biases.double()  # (N, heads)
        scores = scores.clamp(1.0, 5.0)
        std = scores.std(1, unbiased=False) if scores.shape[1] > 1 else torch.zeros(len(x))
        return scores.mean(1).float(), std.float()

    def score(self, x: Tensor, pessimism: float) -> Tensor:
        """The reward-ready prediction: mean - pessimism * std, within 1..5."""
        mean, std = self.predict(x)
        return (mean - pessimism * std).clamp(1.0, 5.0)

    def state_dict(self) -> dict[str, Tensor]:
        return {"mu": self.mu, "sd": self.sd, "weights": self.weights, "biases": self.biases,
                "strength": torch.tensor(self.strength), "n": torch.tensor(self.n),
                "consistency": torch.tensor(math.nan if self.consistency is None
                                            else self.consistency)}

    @classmethod
    def from_state_dict(cls, state: dict[str, Tensor]) -> "RatingModel":
        consistency = float(state["consistency"])
        return cls(state["mu"], state["sd"], state["weights"], state["biases"],
                   float(state["strength"]), int(state["n"]),
                   None if math.isnan(consistency) else consistency)


def fit_rating_model(x: Tensor, y: Sequence[float], *, heads: int = 5, seed: int = 0,
                     cross_validate: bool = True) -> RatingModel:
    """Fit the ensemble on features ``x`` (n, D) and scores ``y``; with ``cross_validate``,
    also measure its consistency (k-fold Spearman, the strength chosen inside each fold)."""
    y_t = torch.tensor([float(v) for v in y], dtype=torch.float64)
    x = x.double()
    if len(y_t) < 2:
        raise ValueError("the rating model needs at least two ratings")
    strength = choose_strength(x, y_t)
    mu, sd = _standardise(x)
    xs = (x - mu) / sd
    gen = torch.Generator().manual_seed(seed)
    fits = [_fit(xs, y_t, strength)]  # head 0: all the data; the rest: bootstrap resamples
    for _ in range(max(heads, 1) - 1):
        idx = torch.randint(len(y_t), (len(y_t),), generator=gen)
        fits.append(_fit(xs[idx], y_t[idx], strength))
    consistency = cross_validated_spearman(x, y_t, seed=seed) if cross_validate else None
    return RatingModel(mu.float(), sd.float(), torch.stack([f.w for f in fits]).float(),
                       torch.tensor([f.b for f in fits]).float(), strength, len(y_t),
                       consistency)


def cross_validated_spearman(x: Tensor, y: Tensor, *, seed: int = 0,
                             folds: int | None = None) -> float | None:
    """Spearman between each rating and its prediction by a model that never saw it:
    leave-one-out up to LOO_UP_TO ratings (a few ratings are too precious to hold out five
    at a time), FOLDS folds beyond."""
    n = len(y)
    if n < 4 or float(y.max()) == float(y.min()):
        return None
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    k = min(folds or (n if n <= LOO_UP_TO else FOLDS), n)
    predictions = torch.zeros(n, dtype=torch.float64)
    for f in range(k):
        test = order[f::k]
        train = torch.tensor(sorted(set(order.tolist()) - set(test.tolist())))
        xt, yt = x[train].double(), y[train].double()
        if float(yt.max()) == float(yt.min()):
            predictions[test] = float(yt.mean())
            continue
        strength = choose_strength(xt, yt)
        mu, sd = _standardise(xt)
        fit = _fit((xt - mu) / sd, yt, strength)
        # Without the fold's intercept (its training mean): leaving a rating out moves
        # that mean against the rating, which on a handful of ratings anti-correlates the
        # predictions with the truth by itself. Ranks need no common offset.
        predictions[test] = ((x[test].double() - mu) / sd) @ fit.w
    return spearman(predictions.tolist(), y.tolist())


# --- rank correlation -------------------------------------------------------------------------

def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation (ties get their average rank); None when either side is
    constant or there are fewer than 3 pairs (it is undefined then)."""
    if len(x) != len(y) or len(x) < 3:
        return None
    rx, ry = rank(x), rank(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return sxy / math.sqrt(sxx * syy)


def spearman_ceiling(y: Sequence[float]) -> float | None:
    """The best Spearman a predictor that never predicts ties can reach against ``y``.

    A ridge head predicts continuous scores, so within a group of equal ratings it ranks
    replies apart that the person did not. With ratings that take two values, a share p of
    them high, a perfect such predictor scores sqrt(3 p (1 - p)): 0.87 at p = 0.5 and 0.69
    at p = 0.8, the balance a person's ratings reach once the policy mostly gives what they
    like. Compare ``rating_model_consistency`` with this, not with 1.
    """
    ordered = sorted(range(len(y)), key=lambda i: (y[i], i))  # a perfect ranking, no ties
    position = [0.0] * len(y)
    for k, i in enumerate(ordered):
        position[i] = float(k)
    return spearman(position, list(y))


def rank(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing the mean of their positions (as scipy's rankdata)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks
