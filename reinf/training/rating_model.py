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
- log(1 + reply tokens) (how long it is),
- the largest value of each input-embedding dimension over the reply (which tokens occur at
  all: a mean over a hundred tokens dilutes one telling "!" or digit a hundredfold),
- a bag of the reply's tokens and of its pairs of neighbouring tokens: one column per
  hash bucket (``BAG_BUCKETS``), 1 where the reply has a token or pair that falls in it
  (which words and two-token phrases occur, exactly; the classic text classifier's features,
  chosen for no preference in particular).

They are numbered as a set (``FEATURE_SET``); a model fitted on another set is refused when
read (``RatingModel.from_state_dict``), and the next round fits a new one.

**The head** is ridge regression on standardised features, fitted in closed form in its
dual (n x n) form: a person gives tens or hundreds of ratings, and the features have a few
hundred to a few thousand dimensions. The ridge strength is chosen by leave-one-out error,
which ridge gives in closed form. A bootstrap ensemble of ``heads`` ridge fits gives a
spread; the reward of a fresh reply is pessimistic, ``mean - pessimism * std``, so a
reply the model is unsure of is not over-rewarded.

**Pairs** (the person's picks between two replies to one prompt: compare, regenerate) add a
Bradley-Terry term over the head's scores: P(a preferred to b) = sigmoid((s_a - s_b) /
BT_SCALE), with s in rating points, so a one-point gap is a 73% preference. A pick adds the
logistic loss of that probability, a tie (and a "both bad", which says neither is better)
the cross-entropy with 1/2, which pulls the two scores together. The head minimises

    sum_i (y_i - b - s_i)^2 + lam |w|^2 + beta * sum_k loss_k(s_a(k) - s_b(k))

with beta = 2 x the ratings' leave-one-out squared error x training.pair_weight (1): the
ridge objective is 2 sigma^2 x the ratings' Gaussian negative log-likelihood, so at weight 1
the sum is the joint likelihood of ratings and picks (``pair_scale``). The fit starts from
the ridge solution and takes a few damped Newton steps in the same dual form (w is a
combination of the rated and the paired replies' features, so the system is n + p square).
The ridge strength is still the one the ratings choose by leave-one-out; the intercept is
still the ratings' mean (the features are standardised on the rated rows, so no slope moves
it). Without pairs the fit is the ridge one, unchanged.

**Consistency** is the cross-validated Spearman correlation between the predicted and the
real scores of held-out ratings (leave-one-out up to 48 ratings, 10 folds beyond; the ridge
strength is chosen inside each fold, so the figure is honest; pairs that hold a held-out
reply are left out of its fold). Its ceiling is below 1 when ratings tie
(``spearman_ceiling``: 0.87 for ratings split evenly between two values). It decides whether
the round may trust the model (see ``reinf.training.plan``) and is reported as the
"reward consistency" figure. **Pairwise accuracy** is its counterpart for pairs: the share of
held-out picks (ties left out) whose winner a model fitted without them scores higher,
beside the same figure for the ratings alone (``cross_validated_pair_accuracy``).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from reinf.model.sampling import ForwardArgs

#: Ridge strengths tried, as multiples of the mean diagonal of the feature kernel.
RIDGE_GRID = (1e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0, 100.0)
FOLDS = 10              # cross-validation folds once there are more than LOO_UP_TO ratings
LOO_UP_TO = 48          # up to here every rating is its own fold (leave-one-out)
BT_SCALE = 1.0          # rating points of score gap per unit of Bradley-Terry log-odds
NEWTON_STEPS = 12       # damped Newton steps on the pairs term (it converges in 3-6)
PAIR_FOLDS = 10         # cross-validation folds over pairs (leave-one-out below 10 pairs)
BAG_BITS = 14           # the bag of tokens and token pairs has 2**BAG_BITS hash buckets
BAG_BUCKETS = 1 << BAG_BITS
#: Which features a rating model was fitted on: 1, the hidden states and length alone; 2,
#: with the embeddings' max and the bag (docs/benchmarks.md, "A bag of tokens and
#: the embeddings' max: feature set 2").
FEATURE_SET = 2


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


def reply_batch(chunk: Sequence[tuple[Sequence[int], Sequence[int]]]):
    """(prompt_ids, reply_ids) pairs as one right-padded batch: input ids, attention mask,
    a float mask of the reply's positions, each row's last position and reply length."""
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
    return input_ids, attention, reply_mask, last, lengths


def _features(base, chunk, device) -> Tensor:
    input_ids, attention, reply_mask, last, lengths = reply_batch(chunk)
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
    embedded = hidden[0].float().masked_fill(mask == 0, -math.inf).amax(1).cpu()
    return torch.cat([pooled(hidden[0]), pooled(hidden[len(hidden) // 2]), pooled(hidden[-1]),
                      final, torch.log1p(lengths)[:, None], embedded,
                      _bag([reply for _, reply in chunk])], dim=1)


# Multipliers of the bag's hash (odd 32-bit constants: Knuth's multiplicative hashing).
_MIX_A, _MIX_B = 0x9E3779B1, 0x85EBCA77


def _bucket(key: int) -> int:
    """One of BAG_BUCKETS, from the top bits of a 32-bit multiplicative hash of ``key``."""
    return ((key * _MIX_A) & 0xFFFFFFFF) >> (32 - BAG_BITS)


def _bag(replies: Sequence[Sequence[int]]) -> Tensor:
    """(B, BAG_BUCKETS): 1 in the bucket of each token a reply has and of each pair of
    neighbouring tokens (hashed apart from the tokens), else 0. A fixed width, so a model
    fitted in one round scores replies of any later one; two keys share a bucket now and
    then, which costs a little sharpness and nothing else."""
    out = torch.zeros(len(replies), BAG_BUCKETS)
    for i, ids in enumerate(replies):
        ids = [int(t) for t in ids]
        keys = {_bucket(t) for t in ids}
        keys.update(_bucket((a * _MIX_B + b + 1) & 0xFFFFFFFF) for a, b in zip(ids, ids[1:]))
        out[i, sorted(keys)] = 1.0
    return out


# --- ridge regression -----------------------------------------------------------------------

@dataclass
class _Ridge:
    """One standardised ridge fit, kept in primal form: y = ((x - mu) / sd) . w + b."""
    w: Tensor   # (D,)
    b: float


def _varying(x: Tensor) -> Tensor:
    """A mask of the columns whose value differs between rows of ``x``. A column with one
    value in every row standardises to 0 in each, so it adds nothing to a kernel or a fit;
    the fits drop such columns first, which changes nothing but rounding and saves their
    cost (most of the bag's buckets are empty in any one set of replies)."""
    return (x != x[:1]).any(0) if len(x) else torch.zeros(x.shape[1], dtype=torch.bool)


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


def _loo_errors(k: Tensor, y: Tensor, strength: float) -> Tensor:
    """Leave-one-out residuals of a ridge fit on kernel ``k`` (xs @ xs.T of the standardised
    features), in closed form: (y - yhat) / (1 - H_ii)."""
    n = len(y)
    lam = strength * float(k.diagonal().mean().clamp_min(1e-6))
    yc = y - y.mean()
    hat = k @ torch.linalg.inv(k + lam * torch.eye(n, dtype=k.dtype))
    # Centring y costs one degree of freedom: count it in the leverage.
    leverage = hat.diagonal() + 1.0 / n
    return (yc - hat @ yc) / (1 - leverage).clamp_min(1e-6)


def choose_strength(x: Tensor, y: Tensor) -> float:
    """The ridge strength from RIDGE_GRID with the lowest leave-one-out squared error."""
    return ridge_choice(x, y)[0]


def ridge_choice(x: Tensor, y: Tensor) -> tuple[float, float]:
    """(the strength choose_strength picks, its mean leave-one-out squared error)."""
    mu, sd = _standardise(x)
    xs = ((x - mu) / sd).double()
    yd = y.double()
    k = xs @ xs.T  # once: each strength only changes the n x n system
    errors = [float((_loo_errors(k, yd, s) ** 2).mean()) for s in RIDGE_GRID]
    best = min(range(len(errors)), key=errors.__getitem__)
    return RIDGE_GRID[best], errors[best]


def pair_scale(loo_error: float, pair_weight: float) -> float:
    """The weight of a pick's log-loss beside squared rating errors. The ridge objective is
    2 sigma^2 x the ratings' Gaussian negative log-likelihood (sigma^2: their noise, which
    the leave-one-out error estimates), so 2 sigma^2 x the picks' log-loss makes the sum the
    joint likelihood; ``pair_weight`` (training.pair_weight) scales that. The error counts
    as at least 0.05, so ratings a head fits (nearly) perfectly leave the picks a say."""
    return pair_weight * 2 * max(loo_error, 0.05)


# --- pairs: a Bradley-Terry term on the head's scores ------------------------------------------

@dataclass(frozen=True)
class PairSet:
    """The person's picks as rows of the feature matrix: reply ``a[k]`` against ``b[k]``,
    ``target[k]`` = 1 when a was preferred, 0 when b was, 0.5 for a tie (or both bad)."""
    a: Tensor        # (m,) long
    b: Tensor        # (m,) long
    target: Tensor   # (m,) float64

    @classmethod
    def of(cls, rows: Sequence[tuple[int, int, float]]) -> "PairSet":
        return cls(torch.tensor([r[0] for r in rows], dtype=torch.long),
                   torch.tensor([r[1] for r in rows], dtype=torch.long),
                   torch.tensor([float(r[2]) for r in rows], dtype=torch.float64))

    def __len__(self) -> int:
        return len(self.target)

    def take(self, idx: Tensor) -> "PairSet":
        return PairSet(self.a[idx], self.b[idx], self.target[idx])


def _fit_pairs(k: Tensor, xs: Tensor, y: Tensor, counts: Tensor, pairs: PairSet,
               pair_counts: Tensor, strength: float, beta: float) -> _Ridge:
    """The head with the pairs term, in dual form: w = Xs^T g over all N rows of ``xs``
    (the n rated ones first, ``y`` their scores, ``counts`` their bootstrap weights; then
    rows only pairs name), ``k`` = Xs Xs^T. Starts from the ridge solution of the ratings,
    then damped Newton steps on J(g) = sum c (yc - f)^2 + sum q loss(d) + lam g^T K g,
    f = K g, d = (f_a - f_b) / BT_SCALE, q = beta x the pairs' bootstrap counts. A Newton
    step in the dual solves (H_f K + 2 lam I) step = -(grad_f + 2 lam g), H_f being the
    Hessian of the data terms in f."""
    n, big_n = len(y), len(k)
    c = counts.double()
    b = float((c * y).sum() / c.sum())
    yc = y - b
    lam = strength * float(((c * k.diagonal()[:n]).sum() / c.sum()).clamp_min(1e-6))
    q = beta * pair_counts.double()
    a_idx, b_idx, t = pairs.a, pairs.b, pairs.target

    def objective(g: Tensor) -> tuple[float, Tensor]:
        f = k @ g
        d = (f[a_idx] - f[b_idx]) / BT_SCALE
        loss = t * torch.nn.functional.softplus(-d) + (1 - t) * torch.nn.functional.softplus(d)
        value = float((c * (yc - f[:n]) ** 2).sum() + (q * loss).sum() + lam * (g @ f))
        return value, f

    g = torch.zeros(big_n, dtype=torch.float64)
    g[:n] = torch.linalg.solve(c[:, None] * k[:n, :n] + lam * torch.eye(n, dtype=k.dtype),
                               c * yc)
    value, f = objective(g)
    eye = torch.eye(big_n, dtype=k.dtype)
    for _ in range(NEWTON_STEPS):
        d = (f[a_idx] - f[b_idx]) / BT_SCALE
        p = torch.sigmoid(d)
        grad = torch.zeros(big_n, dtype=torch.float64)
        grad[:n] = -2 * c * (yc - f[:n])
        slope = q * (p - t) / BT_SCALE                         # dJ/d(f_a - f_b)
        grad.index_add_(0, a_idx, slope).index_add_(0, b_idx, -slope)
        curve = q * p * (1 - p) / BT_SCALE ** 2               # d2J/d(f_a - f_b)^2
        # H_f K without the (N, N) H_f: its diagonal on the rated rows, and for each pair
        # +-curve x (K[a] - K[b]) on rows a and b
        hk = torch.zeros(big_n, dtype=torch.float64)
        hk[:n] = 2 * c
        hk = hk[:, None] * k
        rows = curve[:, None] * (k[a_idx] - k[b_idx])           # (m, N)
        hk.index_add_(0, a_idx, rows).index_add_(0, b_idx, -rows)
        step = torch.linalg.solve(hk + 2 * lam * eye, -(grad + 2 * lam * g))
        for _ in range(30):  # halve until the objective does not rise (it is convex)
            new_value, new_f = objective(g + step)
            if new_value <= value:
                break
            step = step / 2
        else:
            break
        g, done = g + step, value - new_value <= 1e-10 * (1 + abs(value))
        value, f = new_value, new_f
        if done:
            break
    return _Ridge(xs.T @ g, b)


def _cuts(n: int, folds: int, seed: int) -> list[Tensor]:
    """``folds`` (at most n) disjoint test sets covering 0..n-1, seeded."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    k = min(folds, n)
    return [order[f::k] for f in range(k)]


def _without(x: Tensor, n: int, y: Tensor, pairs: PairSet, out: Tensor
             ) -> tuple[Tensor, Tensor, PairSet]:
    """The problem without rated rows ``out`` and the pairs that name one of them."""
    keep = torch.ones(len(x), dtype=torch.bool)
    keep[out] = False
    remap = torch.cumsum(keep.long(), 0) - 1
    ok = keep[pairs.a] & keep[pairs.b]
    rows = pairs.take(ok.nonzero().flatten())
    return x[keep], y[keep[:n]], PairSet(remap[rows.a], remap[rows.b], rows.target)


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
    pairs: int = 0      # picks it was fitted on (not saved: the round reports it)
    pair_scale: float = 0.0  # the weight of a pick's log-loss it used (pair_scale)

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
                                            else self.consistency),
                "feature_set": torch.tensor(FEATURE_SET)}

    @classmethod
    def from_state_dict(cls, state: dict[str, Tensor]) -> "RatingModel":
        """The model saved by ``state_dict``. ValueError if it was fitted on another set of
        features (an earlier Reinf's): its weights would score the wrong columns."""
        fitted_on = int(state["feature_set"]) if "feature_set" in state else 1
        if fitted_on != FEATURE_SET:
            raise ValueError(f"it was fitted on feature set {fitted_on} (an earlier Reinf's), "
                             f"and this Reinf computes set {FEATURE_SET}; the next training "
                             "round fits a new one")
        consistency = float(state["consistency"])
        return cls(state["mu"], state["sd"], state["weights"], state["biases"],
                   float(state["strength"]), int(state["n"]),
                   None if math.isnan(consistency) else consistency)


def fit_rating_model(x: Tensor, y: Sequence[float], *, heads: int = 5, seed: int = 0,
                     cross_validate: bool = True, pairs: PairSet | None = None,
                     pair_weight: float = 1.0) -> RatingModel:
    """Fit the ensemble on features ``x`` and scores ``y``; with ``cross_validate``, also
    measure its consistency (k-fold Spearman, the strength chosen inside each fold).

    ``x`` is (N, D): its first ``len(y)`` rows are the rated replies; ``pairs`` (rows of
    ``x``) may name those and the rows after them (replies only paired, never rated). Each
    bootstrap head resamples the ratings and the pairs."""
    y_t = torch.tensor([float(v) for v in y], dtype=torch.float64)
    n = len(y_t)
    if n < 2:
        raise ValueError("the rating model needs at least two ratings")
    full, varying = x.double(), _varying(x)
    x = full[:, varying]
    pairs = pairs if pairs is not None and len(pairs) and pair_weight > 0 else None
    strength, loo_error = ridge_choice(x[:n], y_t)
    beta = pair_scale(loo_error, pair_weight)
    mu, sd = _standardise(x[:n])
    xs = (x - mu) / sd
    gen = torch.Generator().manual_seed(seed)
    if pairs is None:
        fits = [_fit(xs[:n], y_t, strength)]  # head 0: all the data; then bootstrap resamples
        for _ in range(max(heads, 1) - 1):
            idx = torch.randint(n, (n,), generator=gen)
            fits.append(_fit(xs[idx], y_t[idx], strength))
    else:
        k = xs @ xs.T
        ones = torch.ones(len(pairs), dtype=torch.float64)
        fits = [_fit_pairs(k, xs, y_t, torch.ones(n), pairs, ones, strength, beta)]
        for _ in range(max(heads, 1) - 1):
            counts = torch.bincount(torch.randint(n, (n,), generator=gen), minlength=n)
            drawn = torch.randint(len(pairs), (len(pairs),), generator=gen)
            fits.append(_fit_pairs(k, xs, y_t, counts, pairs,
                                   torch.bincount(drawn, minlength=len(pairs)), strength,
                                   beta))
    consistency = cross_validated_spearman(x, y_t, seed=seed, pairs=pairs,
                                           pair_weight=pair_weight) if cross_validate else None
    # Back to the full width: a dropped column is its one value, scaled by 1, weighted 0.
    mu_full, sd_full = full[0].clone(), torch.ones(full.shape[1], dtype=torch.float64)
    mu_full[varying], sd_full[varying] = mu, sd
    weights = torch.zeros(len(fits), full.shape[1], dtype=torch.float64)
    weights[:, varying] = torch.stack([f.w for f in fits])
    return RatingModel(mu_full.float(), sd_full.float(), weights.float(),
                       torch.tensor([f.b for f in fits]).float(), strength, n, consistency,
                       pairs=len(pairs) if pairs is not None else 0,
                       pair_scale=beta if pairs is not None else 0.0)


def _fit_one(x: Tensor, y: Tensor, pairs: PairSet | None, pair_weight: float,
             choice: tuple[float, float] | None = None) -> tuple[Tensor, Tensor, _Ridge]:
    """One head (no bootstrap) on ``x`` (rated rows first): (mu, sd, fit). ``choice``:
    ridge_choice of the ratings, when known."""
    n = len(y)
    strength, loo_error = ridge_choice(x[:n], y) if choice is None else choice
    mu, sd = _standardise(x[:n])
    xs = (x - mu) / sd
    if pairs is None or not len(pairs) or pair_weight <= 0:
        return mu, sd, _fit(xs[:n], y, strength)
    return mu, sd, _fit_pairs(xs @ xs.T, xs, y, torch.ones(n), pairs,
                              torch.ones(len(pairs), dtype=torch.float64), strength,
                              pair_scale(loo_error, pair_weight))


def cross_validated_spearman(x: Tensor, y: Tensor, *, seed: int = 0,
                             folds: int | None = None, pairs: PairSet | None = None,
                             pair_weight: float = 1.0) -> float | None:
    """Spearman between each rating and its prediction by a model that never saw it:
    leave-one-out up to LOO_UP_TO ratings (a few ratings are too precious to hold out five
    at a time), FOLDS folds beyond. ``x`` may hold paired-only rows after the ``len(y)``
    rated ones; a fold's model learns from the pairs that name none of its held-out
    replies."""
    n = len(y)
    if n < 4 or float(y.max()) == float(y.min()):
        return None
    x, y = x.double(), y.double()
    x = x[:, _varying(x)]
    pairs = pairs if pairs is not None and len(pairs) else PairSet.of([])
    predictions = torch.zeros(n, dtype=torch.float64)
    for test in _cuts(n, folds or (n if n <= LOO_UP_TO else FOLDS), seed):
        xt, yt, pt = _without(x, n, y, pairs, test)
        if float(yt.max()) == float(yt.min()):
            predictions[test] = float(yt.mean())
            continue
        mu, sd, fit = _fit_one(xt, yt, pt, pair_weight)
        # Without the fold's intercept (its training mean): leaving a rating out moves
        # that mean against the rating, which on a handful of ratings anti-correlates the
        # predictions with the truth by itself. Ranks need no common offset.
        predictions[test] = ((x[test] - mu) / sd) @ fit.w
    return spearman(predictions.tolist(), y.tolist())


def cross_validated_pair_accuracy(x: Tensor, y: Sequence[float], pairs: PairSet, *,
                                  pair_weight: float = 1.0, seed: int = 0
                                  ) -> tuple[float | None, float | None, int]:
    """How often the model scores the person's pick higher, on picks it never saw:
    (accuracy with the pairs term, accuracy of the ratings alone, held-out picks counted).
    Folds over the pairs (leave-one-out below PAIR_FOLDS pairs); every rating stays in;
    ties and "both bad" train but are not scored. A model that scores both equally counts
    half. (None, None, 0) with fewer than 2 decisive picks."""
    y_t = torch.tensor([float(v) for v in y], dtype=torch.float64)
    decisive = (pairs.target != 0.5).nonzero().flatten()
    if len(decisive) < 2 or len(y_t) < 2:
        return None, None, 0
    n, x = len(y_t), x.double()
    x = x[:, _varying(x)]
    strength, loo_error = ridge_choice(x[:n], y_t)  # the ratings' choice: no pair is in it
    beta = pair_scale(loo_error, pair_weight)
    mu, sd = _standardise(x[:n])
    xs = (x - mu) / sd
    k = xs @ xs.T  # every fold keeps every rating: one standardisation, one kernel
    base = xs @ _fit(xs[:n], y_t, strength).w
    right = right_alone = 0.0
    for test in _cuts(len(pairs), PAIR_FOLDS, seed):
        test = test[pairs.target[test] != 0.5]
        if not len(test):
            continue
        train = torch.ones(len(pairs), dtype=torch.bool)
        train[test] = False
        kept = pairs.take(train.nonzero().flatten())
        fit = _fit_pairs(k, xs, y_t, torch.ones(n), kept,
                         torch.ones(len(kept), dtype=torch.float64), strength, beta)
        held = pairs.take(test)
        right += _agree(xs @ fit.w, held)
        right_alone += _agree(base, held)
    return right / len(decisive), right_alone / len(decisive), len(decisive)


def _agree(scores: Tensor, pairs: PairSet) -> float:
    """Picks whose winner scores higher (a draw counts half)."""
    d = (scores[pairs.a] - scores[pairs.b]) * torch.where(pairs.target > 0.5, 1.0, -1.0)
    return float((d > 0).sum() + 0.5 * (d == 0).sum())


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
