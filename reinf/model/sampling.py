"""Sampling and scoring: one batched KV-cache decoder for the engine and for rollouts, and
one ``token_logprobs`` for everything that scores given replies (PPO, the KL to the base,
the fluency gate, the benchmarks).

The engine's chat reply is a batch of one that reads each token as it comes; a training
round's rollouts are batches of k replies to the same prompts. Both run ``decode`` below,
so what a reply records can't drift between the two. Scoring calls the model's own
forward too (never a decoder plus a hand-kept LM head), so any family's logit scaling or
soft cap is applied exactly as when the reply was sampled.

Behaviour log-probs, the quantity PPO divides by: for each sampled token,
``log_softmax(logits.float() / temperature)[token]``, in fp32, *before* top-p filtering.
The token itself is drawn from the top-p renormalised distribution. PPO recomputes
``logp_new`` with a plain forward and ``log_softmax(logits / T)`` without top-p, so the
stored number is that same quantity and the ratio starts at 1, up to floating-point noise
(top-p makes the true sampling distribution differ slightly in the tail; this is the usual
choice of RLHF libraries).

Prompts of different lengths share a batch by left padding: the attention mask hides the
padding and the position ids count real tokens only, so each row is computed as if it
were alone.

The model's forward is called through ``ForwardArgs``, which knows this transformers
version's name for the KV cache (``cache`` from 5.24 on, ``past_key_values`` before) and
whether the model takes ``logits_to_keep``. Both are read from the underlying model, not a
PEFT wrapper, whose ``forward`` only declares ``**kwargs`` and passes them on.
"""
from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

__all__ = ["ForwardArgs", "Scored", "Step", "decode", "eos_token_ids", "kl_per_token",
           "sample_top_p", "sample_top_p_rows", "token_logprobs"]


def base_model(model):
    """The transformers model under a PEFT wrapper (or ``model`` itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


class ForwardArgs:
    """How to call ``model``'s forward with a KV cache, on any supported transformers."""

    def __init__(self, model):
        # The class's forward: an instance attribute may be a wrapper (a test's hook).
        params = inspect.signature(type(base_model(model)).forward).parameters
        self.cache_name = "cache" if "cache" in params else "past_key_values"
        self.keeps_logits = "logits_to_keep" in params

    def step(self, cache, *, last_only: bool = True) -> dict:
        """Keyword arguments for one cached forward step; ``last_only`` asks for the last
        position's logits alone, where the model can skip the others."""
        kwargs = {self.cache_name: cache, "use_cache": True}
        if last_only and self.keeps_logits:
            kwargs["logits_to_keep"] = 1
        return kwargs

    def cache_of(self, out):
        """The KV cache a forward returned."""
        return out.cache if self.cache_name == "cache" else out.past_key_values


@dataclass
class Step:
    """One decoding step of a batch of B rows."""
    tokens: torch.Tensor      # (B,) the sampled token; meaningful only where ``live``
    logprobs: torch.Tensor    # (B,) its behaviour log-prob (fp32); 0 where not ``live``
    live: torch.Tensor        # (B,) bool: the row was still generating at this step
    ended: torch.Tensor       # (B,) bool: the row sampled an end-of-reply token here


@torch.no_grad()
def decode(model, prompts: Sequence[Sequence[int]], *, temperature: float, top_p: float,
           max_new_tokens: int, generator: torch.Generator, eos_ids: set[int],
           pad_id: int = 0, ignore_eos: bool = False) -> Iterator[Step]:
    """Sample up to ``max_new_tokens`` tokens after each prompt from ``model`` as it is
    (adapter included), yielding one ``Step`` per token position.

    A row stops at its first end-of-reply token (``eos_ids``) unless ``ignore_eos``; the
    generator returns once every row has stopped. Stopping early is the caller's choice:
    leave the loop (the engine does, when a person presses Stop).
    """
    device = next(model.parameters()).device
    args = ForwardArgs(model)
    b = len(prompts)
    width = max(len(p) for p in prompts)
    input_ids = torch.full((b, width), pad_id, dtype=torch.long)
    attention = torch.zeros(b, width, dtype=torch.long)
    for i, prompt in enumerate(prompts):
        input_ids[i, width - len(prompt):] = torch.as_tensor(list(prompt), dtype=torch.long)
        attention[i, width - len(prompt):] = 1
    input_ids, attention = input_ids.to(device), attention.to(device)
    positions = (attention.cumsum(1) - 1).clamp_min(0)
    eos = torch.tensor(sorted(eos_ids) if eos_ids and not ignore_eos else [-1], device=device)
    done = torch.zeros(b, dtype=torch.bool, device=device)
    cache = None
    step_ids, step_pos = input_ids, positions
    for _ in range(max_new_tokens):
        out = model(input_ids=step_ids, attention_mask=attention, position_ids=step_pos,
                    **args.step(cache))
        cache = args.cache_of(out)
        logp = torch.log_softmax(out.logits[:, -1].float() / temperature, dim=-1)  # (B, V)
        token = sample_top_p_rows(logp, top_p, generator)                          # (B,)
        live = ~done
        ended = live & torch.isin(token, eos)
        yield Step(tokens=token, logprobs=torch.where(live, logp.gather(1, token[:, None])
                                                      .squeeze(1), torch.zeros_like(logp[:, 0])),
                   live=live, ended=ended)
        done = done | ended
        if bool(done.all()):
            return
        step_ids = token[:, None]
        step_pos = step_pos[:, -1:] + 1
        attention = torch.cat([attention, attention.new_ones(b, 1)], dim=1)


def sample_top_p(logp: torch.Tensor, top_p: float, gen: torch.Generator) -> int:
    """Draw a token from ``exp(logp)`` restricted to the smallest set of top tokens whose
    mass reaches ``top_p`` (the most likely token is always kept). ``logp``: (V,)."""
    return int(sample_top_p_rows(logp[None], top_p, gen)[0])


def sample_top_p_rows(logp: torch.Tensor, top_p: float, gen: torch.Generator) -> torch.Tensor:
    """``sample_top_p`` for a batch: one token per row of ``logp`` (B, V) -> (B,).
    The rows are unnormalised after the cut; multinomial does not need them normalised."""
    probs = logp.exp()
    if top_p >= 1.0:
        return torch.multinomial(probs, 1, generator=gen).squeeze(1)
    sorted_p, order = probs.sort(dim=-1, descending=True)       # (B, V)
    keep = (sorted_p.cumsum(-1) - sorted_p) < top_p
    choice = torch.multinomial(sorted_p * keep, 1, generator=gen)  # (B, 1)
    return order.gather(1, choice).squeeze(1)


def eos_token_ids(model, tokenizer) -> set[int]:
    """Every token id that ends a reply: generation_config's and config's eos_token_id (an
    int or a list, as Llama-3's) and the tokenizer's."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        value = getattr(source, "eos_token_id", None)
        ids.update([value] if isinstance(value, int) else value or [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


# --- scoring: log-probs of given replies -----------------------------------------------------

@dataclass
class Scored:
    """What one forward pass gives for B replies of up to T tokens."""
    logp: torch.Tensor              # (B, T) fp32: log-prob of each reply token, tempered
    entropy: torch.Tensor | None    # (B, T) fp32: entropy of the tempered distribution
    hidden: torch.Tensor | None     # (B, T, H): the decoder's last hidden state there
    logits: torch.Tensor | None     # (B, K, V) in the model's dtype, when kept (exact KL)
    index: torch.Tensor | None      # (B, T): where each reply token's logits are in K


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   positions: torch.Tensor, actions: torch.Tensor, mask: torch.Tensor,
                   temperature: torch.Tensor, *, hidden: bool = False, entropy: bool = True,
                   entropy_grad: bool = False, keep_logits: bool = False) -> Scored:
    """Log-probs of ``actions`` (B, T) under ``model`` as it is (adapter included), by the
    model's own forward: whatever a family does to its logits (scaling, a final soft cap)
    is done here exactly as when the reply was sampled.

    ``input_ids`` (B, L) are left-padded prompt + reply; ``positions`` (B, T) the column
    whose logits predict reply token t (``mask`` marks real ones). Left padding ends every
    row at column L - 1, so the model is asked for the last K columns' logits only
    (``logits_to_keep``): K = the longest reply + 1, never the prompt's columns.

    Log-probs come from ``_LogProbAt``: the tempered log-softmax at the chosen token, taken
    row by row in fp32 and differentiated from the kept logits alone, so no (B, K, V) fp32
    tensor is made, in the forward or the backward. Entropy is taken the same way, without
    grad unless ``entropy_grad`` (an entropy bonus; that path keeps one fp32 copy).
    """
    b, width = input_ids.shape
    real = mask > 0
    first = int(positions[real].min()) if bool(real.any()) else width - 1
    keep = width - first                                            # K
    args = ForwardArgs(model)
    kwargs = {"logits_to_keep": keep} if args.keeps_logits else {}
    captured: list[torch.Tensor] = []
    hook = _capture_last_hidden(model, captured) if hidden else None
    if hidden and hook is None:  # no decoder to listen to: every layer's states, the last used
        kwargs["output_hidden_states"] = True
    try:
        out = model(input_ids=input_ids, attention_mask=attention_mask,
                    position_ids=(attention_mask.cumsum(1) - 1).clamp_min(0), use_cache=False,
                    **kwargs)
    finally:
        if hook is not None:
            hook.remove()
    logits = out.logits[:, -keep:]                                   # (B, K, V)
    index = (positions - first).clamp(0, keep - 1)                   # (B, T)
    temp = temperature.float()[:, None].expand_as(index)            # (B, T)
    logp = _LogProbAt.apply(logits, index, actions, temp)
    ent = None
    if entropy:
        with contextlib.nullcontext() if entropy_grad else torch.no_grad():
            ent = _entropy_at(logits, index, temp)
    h = None
    if hidden:
        last = captured[-1] if captured else out.hidden_states[-1]
        h = last.gather(1, positions.clamp(0, width - 1)[..., None]
                        .expand(-1, -1, last.shape[-1]))           # (B, T, H)
    return Scored(logp, ent, h, logits if keep_logits else None,
                  index if keep_logits else None)


def kl_per_token(new: Scored, ref: Scored, temperature: torch.Tensor | None = None, *,
                 grad: bool = False) -> torch.Tensor:
    """Exact KL(new || ref) over the vocabulary at each reply token (B, T), from two
    ``token_logprobs(..., keep_logits=True)`` results, both divided by ``temperature`` (B,)
    (None: 1); one row's fp32 copy at a time. ``grad``: differentiable in both sides' logits
    (KL(base || policy) as a loss is ``kl_per_token(base, policy, grad=True)``)."""
    rows = []
    with contextlib.nullcontext() if grad else torch.no_grad():
        for i in range(new.index.shape[0]):
            t_i = 1.0 if temperature is None else float(temperature[i])
            p = torch.log_softmax(new.logits[i, new.index[i]].float() / t_i, -1)  # (T, V)
            q = torch.log_softmax(ref.logits[i, ref.index[i]].float() / t_i, -1)
            rows.append((p.exp() * (p - q)).sum(-1))
    return torch.stack(rows)


class _LogProbAt(torch.autograd.Function):
    """``log_softmax(logits[b, index[b, t]] / temp[b, t])[actions[b, t]]`` -> (B, T) fp32,
    divided as the sampler divides, so the numbers match it to the last bit the maths allows.

    Saves only ``logits`` (in their own dtype) for the backward, which rebuilds the
    softmax one row at a time: d/dlogits = (onehot(action) - softmax) * grad / temp."""

    @staticmethod
    def forward(ctx, logits, index, actions, temp):
        out = torch.empty(index.shape, dtype=torch.float32, device=logits.device)
        for i in range(index.shape[0]):
            x = logits[i, index[i]].float() / temp[i, :, None]            # (T, V)
            out[i] = x.gather(1, actions[i, :, None]).squeeze(1) - torch.logsumexp(x, -1)
        ctx.save_for_backward(logits, index, actions, temp)
        return out

    @staticmethod
    def backward(ctx, grad):
        logits, index, actions, temp = ctx.saved_tensors
        grad_logits = torch.zeros_like(logits)
        for i in range(index.shape[0]):
            g = grad[i].float() / temp[i]                                  # (T,)
            x = logits[i, index[i]].float() / temp[i, :, None]             # (T, V)
            d = -torch.softmax(x, -1) * g[:, None]
            d.scatter_add_(1, actions[i, :, None], g[:, None])
            # several reply tokens never share a column, but padded ones (masked, zero
            # grad) may land on the same one: accumulate
            grad_logits[i].index_add_(0, index[i], d.to(logits.dtype))
        return grad_logits, None, None, None


def _entropy_at(logits, index, temp) -> torch.Tensor:
    rows = []
    for i in range(index.shape[0]):
        logp = torch.log_softmax(logits[i, index[i]].float() / temp[i, :, None], -1)  # (T, V)
        rows.append(-(logp.exp() * logp).sum(-1))
    return torch.stack(rows)


def _capture_last_hidden(model, captured: list):
    """A hook on the decoder (the model under its LM head) that keeps its last hidden
    state, the input of the LM head; None where the model has no ``get_decoder``."""
    base = base_model(model)
    decoder = base.get_decoder() if hasattr(base, "get_decoder") else None
    if decoder is None or decoder is base:
        return None

    def keep(_module, _args, output):
        state = getattr(output, "last_hidden_state", None)
        captured.append(state if state is not None else output[0])
    return decoder.register_forward_hook(keep)
