"""The drift budget: how far a round may move the model on text that is not the person's.

A style learned through the chat template also moves the model on everything else, and
on SmolLM2-135M the rounds' updates wander (two runs of one seed end with nearly unrelated
adapters), so that cost grows round by round: 4-10% on plain prose after six rounds
(docs/benchmarks.md). The anchor (``ppo.anchor_coef``) pulls against it at every step and
slows the learning with it. The budget instead bounds the result: with
``training.drift_budget`` > 0, after a round's PPO passes and before its gate, it measures

    drift = exp(KL(base || policy) per token) - 1

on the first ``DRIFT_TEXTS`` of the anchor's passages (reinf.training.anchor: text the base
model wrote itself, unconditioned), from each passage's ``DRIFT_FROM + 1``-th token on. For
text drawn from the base, the mean of log p_base - log p_policy per token *is* that KL, so
``drift`` is the rise in perplexity the base's own writing sees under the adapter, in
expectation. The exact KL over the vocabulary is used rather than those sampled tokens'
log-probs: the same figure with less noise.

Why not the first tokens: a passage's first few tokens are where it chooses what kind of
text it is, and a style the person rewards (a list, a heading, an example) moves exactly
those. On SmolLM2-135M, 38% of a round's KL on the base's passages sat at their first three
tokens (2.9 nats a token at the second), while on general text the rise was spread evenly;
counted from the fourth token, the drift tracked general text's perplexity at 0.61-0.99 of
it against 0.23-0.69 with every token (docs/benchmarks.md, "The drift budget"). So the
budget bounds what carries over to other text and leaves the style's opening alone.

Where the round's adapter is over the budget, the whole adapter is scaled towards the
base: every LoRA up-projection (``lora_B``) times one factor, which scales the adapter's
change to every weight, ``B @ A``, by exactly that factor. The factor is the largest found
within the budget in a few measured tries: the first guess takes KL to grow as the square
of the factor (as it does near the base), later ones the power the measures so far show
(nearer 1 on SmolLM2-135M where a round moved some tokens far).
The next round continues from the scaled adapter.

The passages are the model's own, never the benchmark's general text: the figure that
measures the drift in ``reinf bench learn`` stays held out.
"""
from __future__ import annotations

import math
import time
from typing import Callable

import torch
from torch import Tensor, nn

DRIFT_TEXTS = 32     # of the anchor's passages, the first: the same ones every round
DRIFT_FROM = 3       # each passage's first tokens, not counted (where its kind is chosen)
TRIES = 5            # measured scales at most, after the unscaled one
CLOSE_ENOUGH = 0.8   # a scale whose KL is within this share of the budget's is kept
MARGIN = 0.97        # each guess aims a little under the budget
NO_BUDGET = {"drift": None, "drift_scale": None, "drift_after": None, "drift_tries": None,
             "drift_seconds": None}


def up_projections(model: nn.Module) -> list[Tensor]:
    """Every LoRA up-projection of ``model`` (peft's ``lora_B`` and, for an embedding
    layer, ``lora_embedding_B``): the adapter's change to a weight is B @ A times a
    constant, so scaling all of them by ``s`` scales every change by ``s``."""
    return [p for name, p in model.named_parameters()
            if ".lora_B." in name or ".lora_embedding_B." in name]


def scale_adapter(model: nn.Module, factor: float) -> None:
    with torch.no_grad():
        for weight in up_projections(model):
            weight.mul_(factor)


def drift_kl(policy, amb, batch_size: int, base: list | None = None) -> float:
    """KL(base || policy) per token on the passages ``amb`` (a Rollout), from each one's
    token ``DRIFT_FROM`` on (counting from 0), weighted mean, no grad, dropout off.
    ``base``: the base's scores of those passages, minibatch by minibatch
    (``base_scores``), so a search over scales runs the base once."""
    from reinf.model.sampling import kl_per_token
    from reinf.training.ppo import update_mode

    base = base if base is not None else base_scores(policy, amb, batch_size)
    total = weight = 0.0
    with torch.no_grad(), update_mode(policy.model):
        for (idx, ref) in base:
            mb = amb.select(idx)
            new = policy.forward(mb, values=False, full=True, entropy=False).scored
            w = mb.mask * mb.weights[:, None]
            w[:, :DRIFT_FROM] = 0.0                 # replies are left-aligned: column = token
            total += float((kl_per_token(ref, new) * w).sum())
            weight += float(w.sum())
    return total / max(weight, 1e-8)


def base_scores(policy, amb, batch_size: int) -> list:
    """The base model's scores (kept logits) of ``amb``, as (rows, Scored) a minibatch."""
    from reinf.training.ppo import update_mode

    with torch.no_grad(), update_mode(policy.model):
        return [(idx, policy.forward(mb, adapter=False, values=False, full=True,
                                     entropy=False).scored)
                for idx, mb in amb.chunks(batch_size)]


def hold_to_budget(policy, amb, budget: float, batch_size: int,
                   report: Callable[[dict], None] | None = None) -> dict:
    """Measure the adapter's drift on ``amb`` and, above ``budget`` (a share: 0.03 = the
    base's own text 3% less likely per token), scale it down until it is within. Returns
    the round's figures: ``drift`` (before), ``drift_scale`` (the factor kept, 1.0 when
    within), ``drift_after``, ``drift_tries`` (scales measured) and ``drift_seconds``."""
    started = time.perf_counter()
    limit = math.log1p(budget)                      # the budget as KL per token
    if report:
        report({"stage": "drift"})
    base = base_scores(policy, amb, batch_size)
    first = drift_kl(policy, amb, batch_size, base)
    kept, kept_kl, tries = 1.0, first, 0            # the scale in place, its KL, tries
    if first > limit:
        low, low_kl, high = 0.0, 0.0, 1.0           # within at low, over at high
        last, last_kl, power = 1.0, first, 2.0      # KL ~ c * scale^power, power from data
        guess = (limit / first) ** (1 / power) * MARGIN
        for tries in range(1, TRIES + 1):
            scale_adapter(policy.model, guess / kept)
            kept = guess
            kl = drift_kl(policy, amb, batch_size, base)
            if kl <= limit:
                low, low_kl = guess, kl
                if kl >= CLOSE_ENOUGH * limit:
                    break
            else:
                high = guess
            # the power through the last two measures (2 near the base, nearer 1 where the
            # adapter moved some tokens far), then a guess kept strictly inside the bracket
            if kl > 0 and last_kl > 0 and guess != last:
                power = min(max(math.log(kl / last_kl) / math.log(guess / last), 0.5), 3.0)
            last, last_kl = guess, kl
            aim = guess * (limit / max(kl, 1e-12)) ** (1 / power) * MARGIN
            guess = min(max(aim, low + 0.1 * (high - low)), low + 0.9 * (high - low))
        if kept != low:                             # the last try was over: back to low
            scale_adapter(policy.model, low / kept)  # kept > 0: every guess is above low
            kept = low
        kept_kl = low_kl
    return {"drift": math.expm1(first), "drift_scale": kept,
            "drift_after": math.expm1(kept_kl), "drift_tries": tries,
            "drift_seconds": time.perf_counter() - started}
