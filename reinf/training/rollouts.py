"""Rollouts, stage 2 of a round: fresh replies from the current adapter, never shown to anyone.

``sample_rollouts`` draws ``k`` replies for each of ``P`` prompts in batches, with a KV cache,
inside the trainer's process. Each sampled token's behaviour log-probability is recorded
exactly as the engine records it (``reinf.engine``): ``log_softmax(logits.float() / T)`` of
the sampled token, in fp32, before top-p filtering, while the token itself is drawn from
the top-p renormalised distribution. So a re-forward of the reply under the same adapter
(PPO's first pass) reproduces these numbers up to floating-point noise, and the PPO ratio
starts at 1.

Prompts of different lengths share a batch by left padding: the attention mask hides the
padding and the position ids count real tokens only, so every row is computed as if it
were alone. Rollouts live in memory for one round; they are never stored as turns.

``choose_prompts`` picks the P contexts: the newest rated prompts first (what the person
just reacted to), then prompts replayed from the rest of the rated history.
"""
from __future__ import annotations

import inspect
import random
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from reinf.engine import eos_token_ids, sample_top_p_rows


@dataclass
class RolloutReply:
    group: int                 # index of its prompt in the round's prompt list
    prompt_ids: list[int]
    reply_ids: list[int]       # includes the final EOS when the model chose to stop
    logprobs: list[float]      # behaviour log-prob of each reply token (fp32, before top-p)
    text: str
    finish_reason: str         # "stop" | "length"


def choose_prompts(samples: Sequence, n: int, *, newest: int, seed: int) -> list[list[int]]:
    """Up to ``n`` distinct prompts (token ids) from rated ``samples`` (newest rated first):
    the ``newest`` most recent ones, then a seeded random choice among the others."""
    seen: set[tuple[int, ...]] = set()
    distinct = []
    for s in samples:
        key = tuple(s.prompt_ids)
        if key and key not in seen:
            seen.add(key)
            distinct.append(list(s.prompt_ids))
    head, rest = distinct[:min(newest, n)], distinct[min(newest, n):]
    random.Random(seed).shuffle(rest)
    return head + rest[:n - len(head)]


@torch.no_grad()
def sample_rollouts(model, tokenizer, prompts: Sequence[Sequence[int]], k: int, *,
                    temperature: float, top_p: float, max_new_tokens: int, seed: int,
                    batch_size: int = 16, progress: Callable[[int, int], None] | None = None
                    ) -> list[RolloutReply]:
    """``k`` replies to each prompt from ``model`` as it is (adapter included), batched."""
    device = next(model.parameters()).device
    eos = eos_token_ids(model, tokenizer)
    jobs = [(g, list(p)) for g, p in enumerate(prompts) for _ in range(k)]
    gen = torch.Generator(device=device).manual_seed(seed)
    keep = {"logits_to_keep": 1} if "logits_to_keep" in \
        inspect.signature(model.forward).parameters else {}
    was_training = model.training
    model.eval()
    out: list[RolloutReply] = []
    try:
        for start in range(0, len(jobs), batch_size):
            chunk = jobs[start:start + batch_size]
            out += _sample_batch(model, tokenizer, chunk, eos, gen, device, keep,
                                 temperature=temperature, top_p=top_p,
                                 max_new_tokens=max_new_tokens)
            if progress:
                progress(len(out), len(jobs))
    finally:
        model.train(was_training)
    return out


def _sample_batch(model, tokenizer, chunk, eos: set[int], gen, device, keep, *,
                  temperature: float, top_p: float, max_new_tokens: int) -> list[RolloutReply]:
    b = len(chunk)
    width = max(len(p) for _, p in chunk)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    input_ids = torch.full((b, width), pad, dtype=torch.long)
    attention = torch.zeros(b, width, dtype=torch.long)
    for i, (_, prompt) in enumerate(chunk):
        input_ids[i, width - len(prompt):] = torch.tensor(prompt)
        attention[i, width - len(prompt):] = 1
    input_ids, attention = input_ids.to(device), attention.to(device)
    positions = (attention.cumsum(1) - 1).clamp_min(0)
    eos_t = torch.tensor(sorted(eos) or [-1], device=device)
    tokens = torch.zeros(b, max_new_tokens, dtype=torch.long, device=device)
    logps = torch.zeros(b, max_new_tokens, device=device)
    lengths = torch.zeros(b, dtype=torch.long, device=device)
    done = torch.zeros(b, dtype=torch.bool, device=device)
    stopped = torch.zeros(b, dtype=torch.bool, device=device)
    past = None
    step_ids, step_pos = input_ids, positions
    for t in range(max_new_tokens):
        out = model(input_ids=step_ids, attention_mask=attention, position_ids=step_pos,
                    past_key_values=past, use_cache=True, **keep)
        past = out.past_key_values
        logp = torch.log_softmax(out.logits[:, -1].float() / temperature, dim=-1)  # (b, V)
        token = sample_top_p_rows(logp, top_p, gen)                                  # (b,)
        live = ~done
        tokens[:, t] = torch.where(live, token, torch.full_like(token, pad))
        logps[:, t] = torch.where(live, logp.gather(1, token[:, None]).squeeze(1),
                                  torch.zeros_like(logps[:, t]))
        lengths += live.long()
        hit = live & torch.isin(token, eos_t)
        stopped |= hit
        done |= hit
        if bool(done.all()):
            break
        step_ids = token[:, None]
        step_pos = step_pos[:, -1:] + 1
        attention = torch.cat([attention, torch.ones(b, 1, dtype=attention.dtype,
                                                     device=device)], dim=1)
    replies = []
    for i, (group, prompt) in enumerate(chunk):
        n = int(lengths[i])
        ids = tokens[i, :n].tolist()
        text_ids = ids[:-1] if stopped[i] else ids
        replies.append(RolloutReply(group, prompt, ids, logps[i, :n].tolist(),
                                    tokenizer.decode(text_ids, skip_special_tokens=True,
                                                     clean_up_tokenization_spaces=False),
                                    "stop" if stopped[i] else "length"))
    return replies

