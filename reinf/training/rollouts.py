"""Rollouts, stage 2 of a round: fresh replies from the current adapter, never shown to anyone.

``sample_rollouts`` draws ``k`` replies for each of ``P`` prompts in batches, with a KV cache,
inside the trainer's process, through the same decoder as the engine (``reinf.model.sampling``):
each sampled token's behaviour log-probability is recorded exactly as a chat reply records
it, so a re-forward of the reply under the same adapter (PPO's first pass) reproduces it up
to floating-point noise and the PPO ratio starts at 1. Rollouts live in memory for one
round; they are never stored as turns.

``choose_prompts`` picks the P contexts: the newest rated prompts first (what the person
just reacted to), then prompts replayed from the rest of the rated history.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from reinf.model.sampling import decode, eos_token_ids


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


def sample_rollouts(model, tokenizer, prompts: Sequence[Sequence[int]], k: int, *,
                    temperature: float, top_p: float, max_new_tokens: int, seed: int,
                    batch_size: int = 16, progress: Callable[[int, int], None] | None = None
                    ) -> list[RolloutReply]:
    """``k`` replies to each prompt from ``model`` as it is (adapter included), batched."""
    device = next(model.parameters()).device
    eos = eos_token_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    jobs = [(g, list(p)) for g, p in enumerate(prompts) for _ in range(k)]
    gen = torch.Generator(device=device).manual_seed(seed)
    was_training = model.training
    model.eval()
    out: list[RolloutReply] = []
    try:
        for start in range(0, len(jobs), batch_size):
            chunk = jobs[start:start + batch_size]
            out += _sample_batch(model, tokenizer, chunk, eos, gen, pad,
                                 temperature=temperature, top_p=top_p,
                                 max_new_tokens=max_new_tokens)
            if progress:
                progress(len(out), len(jobs))
    finally:
        model.train(was_training)
    return out


def _sample_batch(model, tokenizer, chunk, eos: set[int], gen, pad: int, *,
                  temperature: float, top_p: float, max_new_tokens: int) -> list[RolloutReply]:
    tokens, logps, lives = [], [], []
    stopped = None
    for step in decode(model, [p for _, p in chunk], temperature=temperature, top_p=top_p,
                       max_new_tokens=max_new_tokens, generator=gen, eos_ids=eos,
                       pad_id=pad):
        tokens.append(step.tokens)
        logps.append(step.logprobs)
        lives.append(step.live)
        stopped = step.ended if stopped is None else stopped | step.ended
    tokens_t = torch.stack(tokens, 1).cpu()            # (b, steps)
    logps_t = torch.stack(logps, 1).cpu()
    lengths = torch.stack(lives, 1).sum(1).cpu()        # a row's tokens up to its EOS
    stopped = stopped.cpu()
    replies = []
    for i, (group, prompt) in enumerate(chunk):
        n = int(lengths[i])
        ids = tokens_t[i, :n].tolist()
        text_ids = ids[:-1] if stopped[i] else ids
        replies.append(RolloutReply(group, prompt, ids, logps_t[i, :n].tolist(),
                                    tokenizer.decode(text_ids, skip_special_tokens=True,
                                                     clean_up_tokenization_spaces=False),
                                    "stop" if stopped[i] else "length"))
    return replies
