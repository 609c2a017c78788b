"""PPO on rated replies: value head, advantages (GAE or RLOO), losses, KL control, update loop.

Read it top to bottom like CleanRL's ppo.py: the round's batch (``b_*`` tensors), the
no-grad pass that gives the old policy, the reference and the values, the advantages,
whitening, then epochs over shuffled minibatches (``mb_*`` tensors, one
``minibatch_loss`` each), then the log.

Each rated turn is one episode: the prompt is the state, the reply tokens are the actions,
the mapped rating is the reward at the last reply token. Shapes: B rated turns, T reply
tokens (right-padded, ``mask`` marks real ones), L prompt+reply tokens, H hidden, V vocab.

Three log-probs per reply token, all ``log_softmax(logits / temperature)`` in fp32 with the
sample's own sampling temperature:
- behaviour: stored when the reply was sampled, under whatever adapter was live then. The
  PPO ratio ``exp(logp_new - logp_behaviour)`` is taken against it, because ratings arrive
  after the adapter may have changed (the off-policy correction; it is 1, up to float
  noise, when the adapter has not changed since). A round's own rollouts were sampled by
  the adapter the round starts from, so their behaviour policy *is* the old one: their
  episodes carry ``None`` for log-probs and take the round-start pass's (``logp_old``), so
  that the sampler's numerics (its batched pass; bf16 on a GPU) are not mistaken for
  staleness;
- old: under the adapter as it is at the start of the round (no grad). It feeds the KL
  penalty and ``approx_kl``, which measures how far *this round* moved the policy;
- ref: the same model with the adapter disabled (no second copy of the model).

Advantages (``Hyper.advantage``), both whitened over real tokens with the sample weights:
- ``"gae"``: per-token rewards ``-kl_coef (logp_old - logp_ref)`` plus the reward at the last
  token, GAE(gamma, lam) against the value head, which the clipped value loss trains;
- ``"rloo"``: REINFORCE leave-one-out (Ahmadian et al. 2024, "Back to Basics"). An
  episode's return is its reward minus ``kl_coef * sum_t (logp_old - logp_ref)``; every
  token of episode i gets ``return_i`` minus the mean return of the *other* episodes of its
  group (``Rollout.groups``: k replies to one prompt), or minus the mean of every other
  episode of the batch when it is alone in its group. No value head: it is neither read nor
  trained, and ``value_loss`` and ``explained_variance`` are nan (null in JSON).

The loss adds, with weight ``kl_loss_coef``, the k3 estimate of KL(new || ref) on each
sampled token (as GRPO does): the penalty in the return only tells a whole reply that it
strayed; this term pulls every token back towards the base, low-variance. The gap to the
base is capped at 20 nats like the ratio, so padding (masked out) cannot make it inf.

Demonstrations (the person's rewrites, reinf.training.rewrites, and with
``training.imitate_rated`` their best-rated replies) are episodes like the others; for
those ``Rollout.demos`` flags (every one, or under the ``once`` rule only those new to the
adapter the round starts from) the loss also adds, with weight
``imitation_coef``, their negative log-likelihood per token (``imitation_loss``), unclipped;
with ``imitation_until_likely`` only on the tokens less likely than the policy's own replies'
(``imitation_target``, from ``own_nll``; ``imitation_active``: the share pushed), and
without it so only for the demonstrations ``Rollout.until`` flags (the model's own replies
asked for in a style, whichever rule the rewrites follow). The clipped
surrogate raises a demonstration's tokens by at most the clip range a round, which cannot
teach a token the policy gives 0.1% (a list where it never writes one); this term can,
while the KL terms and the gate bound how far the adapter goes (as InstructGPT mixed a
likelihood term into PPO).

The anchor (``anchor_coef``, reinf.training.anchor): every optimizer step also adds, with
that weight, the exact KL(base || policy) over the vocabulary at each token of a minibatch
of passages the base model wrote itself, unconditioned (``anchor_kl``, per token). The
reply KL terms read only the replies trained on; this reads text that has nothing to do
with the person's style and keeps the policy's next-token distribution there the base's.
Its gradient is taken apart from the replies' (``anchor_cosine``: their cosine, about 0
on the real model: the two do not pull against each other).

Diagnostics, each named by the policy it is measured against (weighted means over real
reply tokens; per-minibatch figures are averaged over the round):
- ``approx_kl``: k3 estimate ``(r - 1) - log r``, r = new / old: this round's movement;
  the early stop (``target_kl``) reads it: under ``early_stop`` "epoch" an epoch's mean,
  under "step" the mean of the last ``STOP_WINDOW`` minibatches after every optimizer step,
  over the tokens of the episodes that are not demonstrations (the imitation term is meant
  to move those far);
- ``old_approx_kl``: CleanRL's ``-log r`` mean, r = new / old, the same movement;
- ``clipfrac``: fraction of tokens whose ratio new / *behaviour* (the one PPO clips) lies
  outside 1 ± ppo_clip, so it is above 0 for stale samples even before the first step;
- ``staleness``: mean ``|logp_old - logp_behaviour|`` once per round: how far the adapter
  moved since the rated replies were sampled, and any disagreement of serving and training
  numerics (bf16 vs fp32); 0 for a round's own rollouts;
- ``explained_variance`` (GAE): of the round's returns by the value head's round-start
  values, i.e. by the head as the earlier rounds left it: 0 for a fresh (zero) head, 1 for
  a perfect one, below 0 when it predicts worse than the mean return.

KL figures (``kl``, ``kl_target``, ``kl_max``) are per reply token, averaged over the
round's tokens, in nats: ``kl`` is the exact KL(policy || base) over the whole vocabulary
at each reply position, measured after the update; it drives the promotion gate and the
adaptive controller. The per-token penalty uses the sampled-token estimate
``logp_old - logp_ref``.

A non-finite minibatch loss or gradient norm raises ``NonFiniteLoss``; ``train_policy``
catches it once, stops the round without applying that step and reports ``nan: True``
with ``nan_reason`` (which term, which epoch and step), which the gate's message repeats.
"""
from __future__ import annotations

import contextlib
import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
from torch import Tensor, nn

from reinf.model.sampling import Scored, kl_per_token, token_logprobs


# --- the round's batch ------------------------------------------------------------------

@dataclass
class Rollout:
    """B rated turns as tensors (on the training device): prompt + reply left-padded, so
    every row ends at the last column and the model is asked for its last columns' logits
    only (reinf.model.sampling.token_logprobs); the per-token tensors are right-padded."""
    input_ids: Tensor       # (B, L) prompt + reply, left-padded with 0
    attention_mask: Tensor  # (B, L)
    positions: Tensor       # (B, T) column of input_ids whose logits predict reply token t
    actions: Tensor         # (B, T) reply token ids
    mask: Tensor            # (B, T) 1.0 on real reply tokens
    logp_behaviour: Tensor  # (B, T) stored behaviour log-probs
    temperature: Tensor     # (B,) sampling temperature of each reply
    rewards: Tensor         # (B,) mapped reward, given at the last reply token
    weights: Tensor         # (B,) sample weights from the reward mapper
    groups: Tensor | None = None  # (B,) long: episodes with one id are replies to one prompt
    demos: Tensor | None = None   # (B,) 1.0 for a demonstration the imitation term reads, else 0
    written: Tensor | None = None  # (B,) 1.0 for a demonstration the policy did not sample
    until: Tensor | None = None    # (B,) 1.0 for a demonstration imitated only until likely

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, idx: Tensor) -> "Rollout":
        """The rows ``idx``, trimmed to their own longest sequence (columns dropped on the
        left, where the padding is) and reply."""
        width = self.input_ids.shape[1]
        cut = width - int(self.attention_mask[idx].sum(1).max())
        n_reply = int(self.mask[idx].sum(1).max())
        return Rollout(self.input_ids[idx, cut:], self.attention_mask[idx, cut:],
                       (self.positions[idx, :n_reply] - cut).clamp_min(0),
                       self.actions[idx, :n_reply],
                       self.mask[idx, :n_reply], self.logp_behaviour[idx, :n_reply],
                       self.temperature[idx], self.rewards[idx], self.weights[idx],
                       None if self.groups is None else self.groups[idx],
                       None if self.demos is None else self.demos[idx],
                       None if self.written is None else self.written[idx],
                       None if self.until is None else self.until[idx])

    def chunks(self, size: int) -> Iterator[tuple[Tensor, "Rollout"]]:
        """The rows in order, ``size`` at a time: (their indices, ``select`` of them)."""
        for start in range(0, len(self), size):
            idx = torch.arange(start, min(start + size, len(self)), device=self.mask.device)
            yield idx, self.select(idx)


def build_rollout(episodes: Sequence[tuple], device: torch.device | str = "cpu",
                  groups: Sequence[int] | None = None,
                  demos: Sequence[bool] | None = None,
                  until: Sequence[bool] | None = None) -> Rollout:
    """``episodes``: (prompt_ids, reply_ids, logprobs, temperature, reward, weight) each;
    ``groups``: one id per episode, shared by the k replies to one prompt (for RLOO);
    ``demos``: True for an episode that is a demonstration (the imitation term reads it): a
    rewrite (``logprobs`` None: ``written``, not sampled by the policy) or a well-rated reply;
    ``until``: True for a demonstration imitated only until likely whatever
    ``imitation_until_likely`` says (a reply the model wrote in a style).
    ``logprobs`` None: sampled by the adapter the round starts from (a fresh rollout), or a
    demonstration; its behaviour log-probs are NaN here and ``train_policy`` takes the
    round-start pass's."""
    if groups is not None and len(groups) != len(episodes):
        raise ValueError(f"groups has {len(groups)} ids for {len(episodes)} episodes: "
                         "give one group id per episode")
    n_ctx = max(len(p) + len(r) for p, r, *_ in episodes)
    n_reply = max(len(r) for _, r, *_ in episodes)
    b = len(episodes)
    input_ids = torch.zeros(b, n_ctx, dtype=torch.long)
    attention = torch.zeros(b, n_ctx, dtype=torch.long)
    positions = torch.zeros(b, n_reply, dtype=torch.long)
    actions = torch.zeros(b, n_reply, dtype=torch.long)
    mask = torch.zeros(b, n_reply)
    logp = torch.zeros(b, n_reply)
    for i, (prompt, reply, lps, *_rest) in enumerate(episodes):
        p, r = len(prompt), len(reply)
        pad = n_ctx - p - r
        input_ids[i, pad:] = torch.tensor(list(prompt) + list(reply))
        attention[i, pad:] = 1
        positions[i, :r] = torch.arange(pad + p - 1, pad + p + r - 1)  # column j predicts j+1
        actions[i, :r] = torch.tensor(list(reply))
        mask[i, :r] = 1.0
        logp[i, :r] = math.nan if lps is None else torch.tensor(list(lps), dtype=torch.float32)
    temps, rewards, weights = (torch.tensor([float(e[k]) for e in episodes]) for k in (3, 4, 5))
    b_groups = None if groups is None else torch.tensor(list(groups), dtype=torch.long)
    if demos is not None and len(demos) != len(episodes):
        raise ValueError(f"demos has {len(demos)} flags for {len(episodes)} episodes")
    b_demos = None if demos is None or not any(demos) else \
        torch.tensor([float(bool(d)) for d in demos])
    b_written = None if b_demos is None else \
        torch.tensor([float(bool(d) and e[2] is None) for d, e in zip(demos, episodes)])
    if until is not None and len(until) != len(episodes):
        raise ValueError(f"until has {len(until)} flags for {len(episodes)} episodes")
    b_until = None if b_demos is None or until is None or not any(until) else \
        torch.tensor([float(bool(d) and bool(u)) for d, u in zip(demos, until)])
    return Rollout(*(t.to(device) for t in (input_ids, attention, positions, actions, mask, logp,
                                            temps, rewards, weights)),
                   groups=None if b_groups is None else b_groups.to(device),
                   demos=None if b_demos is None else b_demos.to(device),
                   written=None if b_written is None else b_written.to(device),
                   until=None if b_until is None else b_until.to(device))


# --- the policy: LoRA model + value head --------------------------------------------------

class ValueHead(nn.Module):
    """A linear value estimate on the policy's last hidden states, zero-initialised so the
    first round's advantages are the plain returns."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.summary = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.summary.weight)
        nn.init.zeros_(self.summary.bias)

    def forward(self, hidden: Tensor) -> Tensor:  # (B, T, H) -> (B, T), fp32
        return self.summary(hidden.float()).squeeze(-1)


@dataclass
class Step:
    """What one forward pass gives for the reply tokens."""
    logp: Tensor                    # (B, T) log-prob of each reply token
    entropy: Tensor | None          # (B, T) entropy of the tempered distribution, if asked
    values: Tensor | None           # (B, T)
    scored: Scored | None = None    # the kept logits, when asked for (exact KL)


@dataclass
class Policy:
    model: nn.Module                   # PEFT-wrapped causal LM
    value_head: ValueHead
    amp_dtype: torch.dtype | None = None  # bf16 autocast on CUDA
    detach_value: bool = True          # value loss trains the head only, never the adapter

    def forward(self, mb: Rollout, *, adapter: bool = True, values: bool = True,
                full: bool = False, entropy: bool = True, entropy_grad: bool = False) -> Step:
        device = mb.input_ids.device
        off = self.model.disable_adapter() if not adapter else contextlib.nullcontext()
        amp = (torch.autocast(device.type, dtype=self.amp_dtype) if self.amp_dtype
               else contextlib.nullcontext())
        with off, amp:
            # The model's own forward, through the one scoring path the sampler agrees with.
            out = token_logprobs(self.model, mb.input_ids, mb.attention_mask, mb.positions,
                                 mb.actions, mb.mask, mb.temperature, hidden=values,
                                 entropy=entropy, entropy_grad=entropy_grad, keep_logits=full)
        v = None
        if values:
            v = self.value_head(out.hidden.detach() if self.detach_value else out.hidden)
        return Step(out.logp, out.entropy, v, out if full else None)

    def parameters(self) -> list[nn.Parameter]:
        """Trainable tensors in a fixed order (the optimizer state depends on it)."""
        lora = [p for _, p in sorted(self.model.named_parameters()) if p.requires_grad]
        return lora + list(self.value_head.parameters())


@contextlib.contextmanager
def update_mode(model: nn.Module, gradient_checkpointing: bool = False):
    """Dropout off while gradients flow. eval() does it, but transformers only checkpoints
    activations in train mode, so then we stay in train mode with every dropout at 0."""
    was_training = model.training
    saved: list[tuple[nn.Module, str, float]] = []
    if gradient_checkpointing:
        model.train()
        for module in model.modules():
            for name in ("p", "attention_dropout"):
                value = getattr(module, name, None)
                if (name == "p" and isinstance(module, nn.Dropout)) or \
                        (name == "attention_dropout" and isinstance(value, float)):
                    saved.append((module, name, value))
                    setattr(module, name, 0.0)
    else:
        model.eval()
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)
        model.train(was_training)


# --- rewards, advantages (GAE or RLOO), whitening -------------------------------------------

def build_token_rewards(rewards: Tensor, logp: Tensor, logp_ref: Tensor, mask: Tensor,
                        kl_coef: float) -> Tensor:
    """r_t = -kl_coef (logp_t - logp_ref_t) on each reply token, + the reward at the last."""
    token_rewards = -kl_coef * (logp - logp_ref) * mask  # (B, T)
    last = (mask.sum(1).long() - 1).clamp_min(0)         # (B,)
    token_rewards[torch.arange(len(rewards)), last] += rewards
    return token_rewards


def compute_gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float
                ) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over right-padded episodes -> (advantages, returns).

    The value after an episode's last token is 0 (the episode ends there).
    """
    advantages = torch.zeros_like(rewards)
    last_gae = torch.zeros_like(rewards[:, 0])
    n = rewards.shape[1]
    for t in reversed(range(n)):
        next_mask = mask[:, t + 1] if t + 1 < n else torch.zeros_like(mask[:, 0])
        next_value = values[:, t + 1] * next_mask if t + 1 < n else torch.zeros_like(last_gae)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        last_gae = delta + gamma * lam * next_mask * last_gae
        advantages[:, t] = last_gae * mask[:, t]
    return advantages, (advantages + values) * mask


def compute_rloo(rewards: Tensor, logp: Tensor, logp_ref: Tensor, mask: Tensor, kl_coef: float,
                 groups: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """REINFORCE leave-one-out advantages -> (advantages (B, T), returns (B,)).

    An episode's return is its reward minus ``kl_coef * sum_t (logp_t - logp_ref_t)`` over
    its reply tokens (the undiscounted sum of ``build_token_rewards``). Its baseline is the
    plain mean return of the other episodes of its group; an episode alone in its group
    (every one when ``groups`` is None) gets the mean of every other episode in the batch
    instead (0 for a batch of one). Every real reply token
    carries its episode's advantage; padding is 0.
    """
    returns = rewards - kl_coef * ((logp - logp_ref) * mask).sum(1)       # (B,)
    if groups is None:
        groups = torch.arange(len(returns), device=returns.device)
    _, member = torch.unique(groups, return_inverse=True)               # (B,) dense group index
    n_groups = int(member.max()) + 1
    size = returns.new_zeros(n_groups).index_add_(0, member, torch.ones_like(returns))[member]
    total = returns.new_zeros(n_groups).index_add_(0, member, returns)[member]
    others = (total - returns) / (size - 1).clamp_min(1)                # mean of the rest
    # Alone in its group: the mean of every other episode in the batch (leave-one-out
    # there too: a baseline that contains the episode itself shrinks its advantage).
    n = len(returns)
    rest = (returns.sum() - returns) / max(n - 1, 1) if n > 1 else torch.zeros_like(returns)
    baseline = torch.where(size > 1, others, rest)
    return (returns - baseline)[:, None] * mask, returns


def own_nll(b: "Rollout", logp: Tensor) -> float | None:
    """The policy's negative log-likelihood per token of the batch's episodes that it
    sampled (its own replies, rated or not: about its entropy), None when there are none. A
    demonstration as likely as this reads to the policy like a reply of its own."""
    own = b.mask if b.written is None else b.mask * (1 - b.written)[:, None]
    if not bool(own.any()):
        return None
    return float(weighted_mean(-logp, own, b.weights))


def weighted_mean(x: Tensor, mask: Tensor, weights: Tensor) -> Tensor:
    """Mean of x (B, T) over real tokens, each episode counted with its weight (B,)."""
    w = mask * weights[:, None]
    return (x * w).sum() / w.sum().clamp_min(1e-8)


def whiten(x: Tensor, mask: Tensor, weights: Tensor, eps: float = 1e-8) -> Tensor:
    """(x - mean) / std with the sample weights, over real tokens; padding stays 0."""
    mean = weighted_mean(x, mask, weights)
    var = weighted_mean((x - mean) ** 2, mask, weights)
    return (x - mean) * torch.rsqrt(var + eps) * mask


# --- losses and diagnostics ---------------------------------------------------------------

def check_dual_clip(dual_clip: float) -> None:
    """0 is off and c > 1 is on; anything else would be silently no dual clip."""
    if not (dual_clip == 0 or dual_clip > 1):
        raise ValueError(f"dual_clip {dual_clip} is not a dual clip: set 0 (off) or a bound "
                         "above 1 (3 is usual)")


def policy_loss(logratio: Tensor, advantages: Tensor, clip: float, dual_clip: float = 0.0
                ) -> Tensor:
    """Per-token clipped surrogate, as a loss (B, T). ``dual_clip`` c > 1 also bounds the
    loss of a negative advantage at -c·A, so a stale sample with a huge ratio cannot blow
    up the step (Ye et al. 2020); 0 turns it off. A c in (0, 1] is refused, not ignored: such
    a bound would sit at or below the clipped loss and flatten every negative advantage."""
    check_dual_clip(dual_clip)
    ratio = logratio.exp()
    loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip, 1 + clip))
    if dual_clip > 1:
        loss = torch.where(advantages < 0, torch.min(loss, -dual_clip * advantages), loss)
    return loss


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, clip: float) -> Tensor:
    """Per-token clipped value loss (B, T): 0.5 max((v - R)^2, (v_clipped - R)^2)."""
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    return 0.5 * torch.max((values - returns) ** 2, (clipped - returns) ** 2)


def approx_kl(logratio: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(old || new): (r - 1) - log r, never negative."""
    return (logratio.exp() - 1) - logratio


def explained_variance(y_pred: Tensor, y_true: Tensor, mask: Tensor) -> float:
    y_pred, y_true = y_pred[mask > 0], y_true[mask > 0]
    var_y = y_true.var(unbiased=False) if y_true.numel() else torch.tensor(0.0)
    return math.nan if var_y == 0 else float(1 - (y_true - y_pred).var(unbiased=False) / var_y)


# --- state that crosses rounds ------------------------------------------------------------

@dataclass
class KLController:
    """Adaptive KL coefficient (Ziegler et al. 2019): proportional control towards the
    target, stepped once per PPO pass (``train_policy``; once a round unless
    ``training.rollout_iterations`` > 1) with the pass's measured KL, never below ``floor``
    (the configured ``kl_coef``):

    coef <- max(floor, coef (1 + clip(kl / target - 1, -0.2, 0.2) / horizon))

    ``horizon`` counts passes: at 1 the clipped error is closed in one pass, so KL at twice
    the target raises the coefficient by 20% a pass (x1.73 over three), and KL at half of
    it lowers a raised one by 20% a pass (x0.51 over three) until it is back at the floor.
    Ziegler's horizon counts samples, for an update every batch of a long run; Reinf
    measures KL once a round, a round is tens of samples, and a horizon of 1000 samples
    moved the coefficient by at most 1.6% a round.

    Why a floor: KL starts near 0 because the adapter starts at zero, not because the
    penalty holds it there. A controller free to go down cut kl_coef from 0.1 to 0.023 in
    the first eight rounds (prefers-terse, demo model), and KL then overshot to twice the
    target and stayed there while the coefficient climbed back (final KL 0.108 against
    0.041). With the floor, it stays at kl_coef until KL passes the target and then brakes
    (docs/training.md).
    """
    coef: float
    target: float
    horizon: int = 1
    adaptive: bool = True
    floor: float | None = None  # None: the starting coef

    def __post_init__(self) -> None:
        if self.floor is None:
            self.floor = self.coef

    def update(self, kl: float) -> float:
        """One round's step from that round's KL (per token); the new coefficient."""
        if self.adaptive and self.target > 0 and math.isfinite(kl):
            error = min(max(kl / self.target - 1, -0.2), 0.2)
            self.coef = max(self.floor, self.coef * (1 + error / self.horizon))
        return self.coef

    def state_dict(self) -> dict:
        return {"coef": self.coef}

    def load_state_dict(self, state: dict) -> None:
        """The saved coefficient, raised to the floor (a kl_coef raised since counts now)."""
        self.coef = max(self.floor, float(state["coef"]))


@dataclass
class RunningMoments:
    """Running mean / variance of rewards (Welford, merged a batch at a time)."""
    count: float = 0.0
    mean: float = 0.0
    m2: float = 0.0

    def update(self, values: Tensor) -> None:
        values = values.double().flatten()
        n = values.numel()
        if n == 0:
            return
        b_mean = float(values.mean())
        b_m2 = float(((values - b_mean) ** 2).sum())
        total = self.count + n
        delta = b_mean - self.mean
        self.mean += delta * n / total
        self.m2 += b_m2 + delta ** 2 * self.count * n / total
        self.count = total

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.count) if self.count > 0 else 1.0

    def state_dict(self) -> dict:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    def load_state_dict(self, state: dict) -> None:
        self.count, self.mean, self.m2 = (float(state[k]) for k in ("count", "mean", "m2"))


# --- the update loop --------------------------------------------------------------------

ADVANTAGES = ("gae", "rloo")
# When ``target_kl`` is checked: after each epoch, on its mean approx_kl (CleanRL's rule), or
# after every optimizer step, on the mean approx_kl of the last STOP_WINDOW minibatches over
# the policy-gradient tokens only (a demonstration is imitated to move far; Spinning Up's
# PPO checks after every step too).
EARLY_STOPS = ("epoch", "step")
STOP_WINDOW = 4
ANCHOR_SEED_OFFSET = 7919  # the anchor's draws: a generator of their own


@dataclass
class Hyper:
    """The PPO numbers a round uses, read once from config.ppo."""
    batch_size: int = 8                     # rated turns per forward/backward minibatch
    gradient_accumulation_steps: int = 1    # minibatches per optimizer step
    ppo_epochs: int = 4                     # passes over the round's batch
    ppo_clip: float = 0.2                   # clip range of the ratio new / behaviour
    value_clip: float = 0.2                 # clip range of the value update
    vf_coef: float = 0.5                    # weight of the value loss (gae only)
    ent_coef: float = 0.0                   # weight of the entropy bonus
    kl_loss_coef: float = 0.0               # weight of the KL-to-base term in the loss
    anchor_coef: float = 0.0                # weight of KL(base || policy) on the anchor text
    dual_clip: float = 3.0                  # bound c > 1 on stale samples' loss; 0 = off
    max_grad_norm: float = 1.0              # gradient-norm clip; 0 = none
    target_kl: float = 0.0                  # stop when approx_kl exceeds it; 0 = never
    early_stop: str = "epoch"               # check target_kl after each "epoch" or "step"
    gamma: float = 1.0                      # GAE discount
    lam: float = 0.95                       # GAE lambda
    gradient_checkpointing: bool = False    # recompute activations in the backward pass
    advantage: str = "gae"                  # baseline: "gae" (value head) or "rloo" (groups)
    imitation_coef: float = 0.0             # weight of the demonstrations' log-likelihood
    imitation_until_likely: bool = False    # imitate a demonstration's token only while it is
                                            # less likely than the policy's own replies' are
                                            # (False: only Rollout.until's demonstrations)

    def __post_init__(self) -> None:
        if self.advantage not in ADVANTAGES:
            raise ValueError(f"advantage {self.advantage!r} is not one of {', '.join(ADVANTAGES)}")
        if self.early_stop not in EARLY_STOPS:
            raise ValueError(f"early_stop {self.early_stop!r} is not one of "
                             f"{', '.join(EARLY_STOPS)}")
        check_dual_clip(self.dual_clip)

    @classmethod
    def from_config(cls, ppo) -> "Hyper":
        """Every field ``ppo`` has; a field it lacks keeps the default here."""
        return cls(**{n: getattr(ppo, n) for n in cls.__dataclass_fields__ if hasattr(ppo, n)})


class NonFiniteLoss(ArithmeticError):
    """A minibatch loss or a gradient norm is inf or nan: the round stops before that step."""


def evaluate(policy: Policy, b: Rollout, batch_size: int, *, adapter: bool = True,
             values: bool = True) -> tuple[Tensor, Tensor]:
    """No-grad log-probs (B, T) and values (B, T) of the whole batch (values 0 if not asked)."""
    logp, vals = torch.zeros_like(b.mask), torch.zeros_like(b.mask)
    with torch.no_grad():
        for idx, mb in b.chunks(batch_size):
            out = policy.forward(mb, adapter=adapter, values=values, entropy=False)
            logp[idx, :out.logp.shape[1]] = out.logp * mb.mask
            if values:
                vals[idx, :out.values.shape[1]] = out.values * mb.mask
    return logp, vals


def measure_kl(policy: Policy, b: Rollout, batch_size: int) -> Tensor:
    """Exact KL(policy || base) over the vocabulary at each reply position (B, T), no grad."""
    kl = torch.zeros_like(b.mask)
    with torch.no_grad():
        for idx, mb in b.chunks(batch_size):
            new = policy.forward(mb, values=False, full=True, entropy=False).scored
            ref = policy.forward(mb, adapter=False, values=False, full=True,
                                 entropy=False).scored
            part = kl_per_token(new, ref, mb.temperature)                # (b, T)
            kl[idx, :part.shape[1]] = part * mb.mask
    return kl


# Per-minibatch diagnostics averaged into the round's metrics (see the module docstring).
DIAGNOSTICS = ("policy_loss", "value_loss", "entropy", "approx_kl", "old_approx_kl", "clipfrac")


def minibatch_loss(policy: Policy, mb: Rollout, mb_advantages: Tensor, mb_logp_old: Tensor,
                   mb_logp_ref: Tensor, mb_values: Tensor, mb_returns: Tensor, hp: Hyper,
                   imitation_target: float | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """Forward one minibatch -> (loss with grad, no-grad scalar diagnostics).

    The ``mb_*`` tensors are (b, T) slices of the round's batch, trimmed like ``mb``.
    ``imitation_target``: a negative log-likelihood per token; a demonstration's token already
    at or below it is not imitated (None: every token of every flagged demonstration is).
    Raises NonFiniteLoss before anything is backpropagated if the loss is inf or nan.
    """
    gae = hp.advantage == "gae"
    out = policy.forward(mb, values=gae, entropy_grad=hp.ent_coef > 0)
    # PPO's ratio is new / behaviour: the policy that sampled the reply (off-policy correction).
    logratio = (out.logp - mb.logp_behaviour).clamp(-20, 20)  # (b, T)
    pg = weighted_mean(policy_loss(logratio, mb_advantages, hp.ppo_clip, hp.dual_clip),
                       mb.mask, mb.weights)
    if gae:
        vf = weighted_mean(value_loss(out.values, mb_values, mb_returns, hp.value_clip),
                           mb.mask, mb.weights)
    else:  # RLOO's baseline is the other replies to the prompt: no value head to fit
        vf = torch.zeros((), device=pg.device)
    ent = weighted_mean(out.entropy, mb.mask, mb.weights)
    # KL(new || base) on the sampled tokens, k3 (never negative); its gradient pulls each
    # sampled token's probability back towards the base's, a low-variance pull that the
    # sequence-level penalty in the return lacks. The gap is bounded like the ratio: at
    # padding the forward scores the pad id, whose log-prob can sit below -88, and exp of
    # that gap would be inf, which the mask's 0 turns into NaN; bounded, padding adds 0.
    gap = (mb_logp_ref - out.logp).clamp(max=20)
    kl = weighted_mean(approx_kl(gap), mb.mask, mb.weights)
    loss = pg + hp.vf_coef * vf - hp.ent_coef * ent + hp.kl_loss_coef * kl
    # Imitation: the demonstrations' mean negative log-likelihood per token, unclipped. The
    # clipped surrogate raises a demonstration's tokens by at most the clip range a round,
    # which cannot teach a token the policy gives 0.1%; this term can (the KL terms and the
    # gate still bound how far the adapter goes).
    demo = mb.demos is not None and hp.imitation_coef > 0 and bool(mb.demos.any())
    nll = torch.zeros((), device=pg.device)
    if demo:
        demo_w = mb.mask * mb.demos[:, None] * mb.weights[:, None]  # its tokens, weighted
        demo_total = demo_w.sum().clamp_min(1e-8)
        nll = (-out.logp * demo_w).sum() / demo_total
        pushed = demo_w
        if imitation_target is not None:
            # until likely: only the tokens the policy still finds less likely than it finds
            # its own replies' tokens on average; a learnt token is not pushed further (by
            # heart), and one it has drifted away from is pushed again
            unlikely = (-out.logp.detach() > imitation_target).to(demo_w.dtype)
            if not hp.imitation_until_likely and mb.until is not None:
                # the other rule for the rest: every token of theirs, every step
                unlikely = torch.where(mb.until[:, None] > 0, unlikely, torch.ones_like(unlikely))
            pushed = demo_w * unlikely
        # the sum over the pushed tokens, over every demonstration token: a token's pull is
        # the same whichever of its neighbours are learnt already (no target: the nll itself)
        loss = loss + hp.imitation_coef * (-out.logp * pushed).sum() / demo_total
    if not torch.isfinite(loss):
        parts = (float(x.detach()) for x in (loss, pg, vf, ent, kl, nll))
        raise NonFiniteLoss("minibatch loss is {} (policy {}, value {}, entropy {}, KL {}, "
                            "imitation {})".format(*parts))
    with torch.no_grad():
        old_logratio = out.logp - mb_logp_old  # new / old (round start): this round's movement
        stats = {
            "policy_loss": pg.detach(), "value_loss": vf.detach(), "entropy": ent.detach(),
            "approx_kl": weighted_mean(approx_kl(old_logratio), mb.mask, mb.weights),
            # the same over the episodes PPO alone moves (the step rule of the early stop)
            "approx_kl_policy": weighted_mean(
                approx_kl(old_logratio), mb.mask,
                mb.weights if mb.demos is None else mb.weights * (1 - mb.demos)),
            "old_approx_kl": weighted_mean(-old_logratio, mb.mask, mb.weights),
            # against the behaviour policy, like the ratio that policy_loss clips
            "clipfrac": weighted_mean(((logratio.exp() - 1).abs() > hp.ppo_clip).float(),
                                      mb.mask, mb.weights),
            "kl": kl.detach(),  # live KL to the base on the sampled tokens, for progress
        }
        if demo:
            stats["imitation_loss"] = nll.detach()
            # the share of this minibatch's demonstration tokens the term pushed up
            stats["imitation_active"] = pushed.sum() / demo_total
    return loss, stats


def gradient_pair(a: list[Tensor], b: list[Tensor]) -> tuple[float, float, float]:
    """The 2-norms of two gradients given as one tensor a parameter, and their cosine (0 if
    either is zero): one pass over the tensors and one read from the device."""
    aa, bb, ab = torch.stack([torch.stack(((x * x).sum(), (y * y).sum(), (x * y).sum()))
                              for x, y in zip(a, b)]).double().sum(0).tolist()
    norm_a, norm_b = math.sqrt(aa), math.sqrt(bb)
    return norm_a, norm_b, (ab / (norm_a * norm_b) if norm_a * norm_b else 0.0)


def cosine(a: list[Tensor], b: list[Tensor]) -> float:
    return gradient_pair(a, b)[2]


def norm(grads: list[Tensor]) -> float:
    return gradient_pair(grads, grads)[0]


def anchor_loss(policy: Policy, amb: Rollout) -> Tensor:
    """Exact KL(base || policy) over the vocabulary at each token of the anchor passages
    ``amb`` (reinf.training.anchor), their weighted mean per token, with grad through the
    policy. The whole distribution, not the sampled token's likelihood: on a few hundred
    passages that would teach the passages themselves (the policy grows surer of them than
    the base) and move it on all other text."""
    new = policy.forward(amb, values=False, full=True, entropy=False).scored
    with torch.no_grad():
        ref = policy.forward(amb, adapter=False, values=False, full=True, entropy=False).scored
    return weighted_mean(kl_per_token(ref, new, grad=True), amb.mask, amb.weights)


Progress = Callable[[dict], None]


def train_policy(policy: Policy, optimizer: torch.optim.Optimizer, b: Rollout,
                 kl_ctl: KLController, hp: Hyper, *, seed: int = 0,
                 progress: Progress | None = None, anchor: Rollout | None = None) -> dict:
    """One PPO round over the prepared batch ``b``; returns CleanRL-named metrics.

    ``anchor``: the base model's own passages (reinf.training.anchor); with
    ``hp.anchor_coef`` > 0 every optimizer step adds that weight times KL(base || policy)
    on ``hp.batch_size`` of them (``anchor_loss``), drawn by a generator of their own (so
    the PPO minibatches are the same with or without it). The two gradients are taken
    apart before they are added and clipped together, so every round reports their
    cosine and norms (``anchor_cosine``, ``reply_grad_norm``, ``anchor_grad_norm``)."""
    started = time.perf_counter()
    anchored = anchor is not None and len(anchor) > 0 and hp.anchor_coef > 0
    anchor_gen = torch.Generator().manual_seed(seed + ANCHOR_SEED_OFFSET)
    gae = hp.advantage == "gae"
    # 1. Old policy, reference and values, before any update (CleanRL's rollout phase).
    with update_mode(policy.model):
        b_logp_old, b_values = evaluate(policy, b, hp.batch_size, values=gae)
        b_logp_ref, _ = evaluate(policy, b, hp.batch_size, adapter=False, values=False)
    # a fresh rollout's behaviour policy is the round-start one (build_rollout: NaN)
    b.logp_behaviour = torch.where(b.logp_behaviour.isnan(), b_logp_old, b.logp_behaviour)
    staleness = float(weighted_mean((b_logp_old - b.logp_behaviour).abs(), b.mask, b.weights))
    # 2. Advantages with the per-token KL penalty folded in, then weighted whitening.
    if gae:
        b_token_rewards = build_token_rewards(b.rewards, b_logp_old, b_logp_ref, b.mask,
                                              kl_ctl.coef)
        b_advantages, b_returns = compute_gae(b_token_rewards, b_values, b.mask, hp.gamma, hp.lam)
    else:
        b_advantages, _ = compute_rloo(b.rewards, b_logp_old, b_logp_ref, b.mask, kl_ctl.coef,
                                       b.groups)
        b_returns = b_values  # unused: no value loss
    b_adv_white = whiten(b_advantages, b.mask, b.weights)
    # until likely: the level a demonstration is imitated to, fixed for the round
    target = own_nll(b, b_logp_old) if b.demos is not None and (
        hp.imitation_until_likely or b.until is not None) else None
    # 3. Epochs over shuffled minibatches. The minibatches of each optimizer step are the
    #    same every epoch (only which samples fill them is reshuffled).
    params = policy.parameters()
    adapter = params[:len(params) - len(list(policy.value_head.parameters()))]
    generator = torch.Generator().manual_seed(seed)
    n_mb = math.ceil(len(b) / hp.batch_size)
    total = hp.ppo_epochs * n_mb
    acc = hp.gradient_accumulation_steps
    step_groups = [range(s, min(s + acc, n_mb)) for s in range(0, n_mb, acc)]
    log: dict[str, list[float]] = {k: [] for k in (*DIAGNOSTICS, "grad_norm", "clipped")}
    steps, epochs_run, early_stopped, nan = 0, 0, False, False
    recent: deque[float] = deque(maxlen=STOP_WINDOW)  # the step rule's latest approx_kl
    nan_reason = None
    try:
        with update_mode(policy.model, hp.gradient_checkpointing):
            for epoch in range(hp.ppo_epochs):
                epochs_run = epoch + 1
                b_inds = torch.randperm(len(b), generator=generator).to(b.mask.device)
                epoch_kl = []
                for group in step_groups:
                    optimizer.zero_grad(set_to_none=True)
                    for j in group:
                        mb_inds = b_inds[j * hp.batch_size:(j + 1) * hp.batch_size]
                        mb = b.select(mb_inds)
                        n_t = mb.mask.shape[1]
                        loss, stats = minibatch_loss(
                            policy, mb, b_adv_white[mb_inds, :n_t], b_logp_old[mb_inds, :n_t],
                            b_logp_ref[mb_inds, :n_t], b_values[mb_inds, :n_t],
                            b_returns[mb_inds, :n_t], hp, imitation_target=target)
                        (loss / len(group)).backward()
                        for name in DIAGNOSTICS:
                            log[name].append(float(stats[name]))
                        for name in ("imitation_loss", "imitation_active"):
                            if name in stats:
                                log.setdefault(name, []).append(float(stats[name]))
                        epoch_kl.append(float(stats["approx_kl"]))
                        recent.append(float(stats["approx_kl_policy"]))
                        if progress:
                            progress({"stage": "update", "epoch": epoch + 1,
                                      "epochs": hp.ppo_epochs, "done": epoch * n_mb + j + 1,
                                      "total": total, "loss": float(loss.detach()),
                                      "approx_kl": float(stats["approx_kl"]),
                                      "kl": float(stats["kl"])})
                    if anchored:
                        rows = torch.randperm(len(anchor), generator=anchor_gen)[:hp.batch_size]
                        kl_base = anchor_loss(policy, anchor.select(rows.to(anchor.mask.device)))
                        if not torch.isfinite(kl_base):
                            raise NonFiniteLoss(f"the anchor's KL is {float(kl_base)}")
                        # the adapter's gradients apart (the value head has no anchor's)
                        step = [p.grad if p.grad is not None else torch.zeros_like(p)
                                for p in adapter]
                        for p in adapter:
                            p.grad = None
                        (hp.anchor_coef * kl_base).backward()
                        pull = [p.grad if p.grad is not None else torch.zeros_like(p)
                                for p in adapter]
                        for p, g_anchor, g_step in zip(adapter, pull, step):
                            p.grad = g_anchor + g_step
                        anchor_norm, reply_norm, cos = gradient_pair(pull, step)
                        log.setdefault("reply_grad_norm", []).append(reply_norm)
                        log.setdefault("anchor_grad_norm", []).append(anchor_norm)
                        log.setdefault("anchor_kl", []).append(float(kl_base.detach()))
                        log.setdefault("anchor_cosine", []).append(cos)
                    grad_norm = nn.utils.clip_grad_norm_(params, hp.max_grad_norm or float("inf"))
                    if not torch.isfinite(grad_norm):
                        raise NonFiniteLoss(f"gradient norm is {float(grad_norm)}")
                    log["grad_norm"].append(float(grad_norm))
                    log["clipped"].append(float(bool(hp.max_grad_norm)
                                                and float(grad_norm) > hp.max_grad_norm))
                    optimizer.step()
                    steps += 1
                    if hp.early_stop == "step" and hp.target_kl \
                            and sum(recent) / len(recent) > hp.target_kl:
                        early_stopped = True
                        break
                if early_stopped:
                    break
                if hp.early_stop == "epoch" and hp.target_kl and epoch_kl \
                        and sum(epoch_kl) / len(epoch_kl) > hp.target_kl:
                    early_stopped = True
                    break
    except NonFiniteLoss as error:
        nan = True  # the failed step is never applied; the trainer's gate rejects the round
        nan_reason = f"{error} at epoch {epochs_run}, step {steps + 1}"
    finally:
        optimizer.zero_grad(set_to_none=True)
    # 4. Where the round left the policy: exact KL to the base, then the controller.
    with update_mode(policy.model):
        b_kl = measure_kl(policy, b, hp.batch_size)
    kl = float(weighted_mean(b_kl, b.mask, torch.ones_like(b.weights)))
    kl_coef_used = kl_ctl.coef
    kl_ctl.update(kl)
    mean = {k: (sum(v) / len(v) if v else math.nan) for k, v in log.items()}
    if not nan and not all(torch.isfinite(p).all() for p in params):
        nan, nan_reason = True, "a trained weight is not finite"
    return {
        "reward_mean": float(b.rewards.mean()), "kl": kl, "approx_kl": mean["approx_kl"],
        "old_approx_kl": mean["old_approx_kl"], "clipfrac": mean["clipfrac"],
        "staleness": staleness, "policy_loss": mean["policy_loss"],
        # the value head's figures where it was trained (GAE), nan where it was not (RLOO)
        "value_loss": mean["value_loss"] if gae else math.nan,
        "explained_variance": (explained_variance(b_values, b_returns, b.mask) if gae
                               else math.nan),
        "entropy": mean["entropy"], "samples": len(b), "tokens": int(b.mask.sum()),
        "kl_coef": kl_coef_used, "kl_coef_next": kl_ctl.coef, "grad_norm": mean["grad_norm"],
        # the share of optimizer steps whose gradient max_grad_norm scaled down
        "clipped": mean["clipped"],
        "epochs_run": epochs_run, "steps": steps, "early_stopped": early_stopped,
        "early_stop_epoch": epochs_run if early_stopped else None,
        "early_stop_step": steps if early_stopped else None, "nan": nan,
        "nan_reason": nan_reason,
        # the demonstrations' mean negative log-likelihood per token (None: no imitation)
        "imitation_loss": mean.get("imitation_loss"),
        # until likely: the level (the policy's own replies' NLL per token at the round's
        # start) and the share of demonstration tokens, over the minibatches, still above it
        "imitation_target": target,
        "imitation_active": mean.get("imitation_active"),
        # the anchor (None: off): KL(base || policy) per token on the base's own passages,
        # the minibatches' mean over the round (each measured before its step)
        "anchor_kl": mean.get("anchor_kl"),
        # the cosine of the anchor's gradient and the replies' at each step, the round's
        # mean: below 0, the anchor pulls back against what the replies teach
        "anchor_cosine": mean.get("anchor_cosine"),
        # the two gradients' norms apart (round means)
        "reply_grad_norm": mean.get("reply_grad_norm"),
        "anchor_grad_norm": mean.get("anchor_grad_norm"),
        "update_seconds": time.perf_counter() - started,
    }
