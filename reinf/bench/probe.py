"""What ``reinf bench learn`` measures about a policy besides its ratings.

After every training round, the bench loads the active checkpoint beside a fresh copy of the
base (``load_policy``) and measures, with no gradient:

- **KL to the base**: the exact KL(policy || base) over the vocabulary at every reply
  position of the probe replies (replies the current adapter sampled, with fixed seeds, for
  the probe prompts: held out, i.e. no probe prompt or near-duplicate of one is a training
  prompt of the run, nor, on the demo model, in its training split; see
  ``reinf.bench.prompts``), per reply token, in nats, at their sampling temperature: the
  trainer's own ``kl`` figure (``reinf.training.ppo.measure_kl``), on replies it never saw;
- **perplexity** on the held-out slice of the demo corpus (``split_corpus``: prompts the
  demo model was never trained on), on the assistant tokens only, at temperature 1: the
  same figure the demo build reports (``heldout_perplexity``). Those replies are the demo
  corpus's own styles (lists, "Happy to help!", a question back), so on a real model the
  figure falls where the person likes one of them and rises where they like another;
- **general-text perplexity** (``load_general_text``) on ``reinf/bench/data/general_text.jsonl``,
  64 passages written for this project in eight kinds (reference prose, news, fiction,
  letters, instructions, essays, dialogue, technical prose), read as plain text with no
  chat template: whether learning a person's style cost the model its language, the
  figure the goal reads ("held-out general text, not the person's style");
- **predicted reward**: the value head at the last reply token, i.e. the hidden state that
  has read the whole reply and predicts its final token. With gamma = 1 and a small KL
  penalty, V there is the critic's estimate of the reply's reward; the value at the first
  token sees only the prompt, so it can only predict the policy's average reward for that
  prompt, not this reply's. ``spearman`` ranks it against the rater's ratings.
"""
from __future__ import annotations

import copy
import json
import math
from importlib import resources
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from safetensors.torch import load_file

from reinf.demo.corpus import generate_corpus, split_corpus
from reinf.model.adapters import load_adapter
from reinf.model.modeling import load_model
from reinf.training.checkpoints import VALUE_HEAD
from reinf.training.ppo import (Policy, ValueHead, build_rollout, evaluate, measure_kl,
                                weighted_mean)
from reinf.training.rating_model import rank, spearman  # noqa: F401 (re-exported)

HELDOUT_ITEMS = 200
GENERAL_TEXT = ("data", "general_text.jsonl")   # under reinf/bench


@dataclass
class Heldout:
    """Held-out corpus chats as PPO-style episodes (temperature 1), with their text."""
    episodes: list[tuple]          # (prompt_ids, reply_ids, logprobs, 1.0, 0.0, 1.0)
    prompts: list[str]
    replies: list[str]


def load_heldout(tokenizer, n: int = HELDOUT_ITEMS, seed: int = 0) -> Heldout:
    """``n`` items spread evenly over the corpus's held-out slice, tokenized as the demo
    build tokenizes them (chat template, assistant tokens are the reply)."""
    _, held = split_corpus(generate_corpus(seed=seed), seed=seed)
    step = max(1, len(held) // max(1, n))
    items = held[::step][:n]
    episodes, prompts, replies = [], [], []
    for item in items:
        split = reply_tokens(tokenizer, item["prompt"], item["reply"])
        if split is None:
            continue
        prompt_ids, reply = split
        episodes.append((prompt_ids, reply, [0.0] * len(reply), 1.0, 0.0, 1.0))
        prompts.append(item["prompt"])
        replies.append(item["reply"])
    return Heldout(episodes, prompts, replies)


@dataclass
class GeneralText:
    """General-text passages as PPO-style episodes: a passage's first token is the prompt
    and the rest the reply, so every later token is scored (temperature 1)."""
    episodes: list[tuple]
    kinds: list[str]


def load_general_text(tokenizer) -> GeneralText:
    """The general-text passages, tokenized as plain text with no special token: models
    disagree on what starts a document (SmolLM2's BOS is its chat turn's start), and
    scoring from the second token on needs none. The figure is a change against the same
    model's base, never an absolute."""
    text = resources.files("reinf.bench").joinpath(*GENERAL_TEXT).read_text(encoding="utf-8")
    episodes, kinds = [], []
    for line in text.splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        ids = list(tokenizer(item["text"], add_special_tokens=False)["input_ids"])
        if len(ids) < 2:
            continue
        episodes.append((ids[:1], ids[1:], [0.0] * (len(ids) - 1), 1.0, 0.0, 1.0))
        kinds.append(item["kind"])
    return GeneralText(episodes, kinds)


def reply_tokens(tokenizer, prompt: str, reply: str) -> tuple[list[int], list[int]] | None:
    """(prompt ids, reply ids) of a one-turn chat in the model's own template: the reply is
    what the full chat adds after the prompt with its generation prompt. Any template works
    (not only those that mark assistant tokens); None if the two do not share that prefix."""
    user = [{"role": "user", "content": prompt}]
    head = list(tokenizer.apply_chat_template(user, tokenize=True, add_generation_prompt=True,
                                              return_dict=True)["input_ids"])
    full = list(tokenizer.apply_chat_template(user + [{"role": "assistant", "content": reply}],
                                              tokenize=True, return_dict=True)["input_ids"])
    reply_ids = full[len(head):]
    while reply_ids and not tokenizer.decode(reply_ids[-1:]).strip():
        reply_ids.pop()  # the template's newline after the end-of-turn token
    if full[:len(head)] != head or not reply_ids:
        return None
    return head, reply_ids


def load_policy(config, checkpoint_path: str | Path | None, *, cache: dict | None = None):
    """A Policy for measuring: a copy of the base with the checkpoint's adapter and value
    head, or the bare base (zero value head) when ``checkpoint_path`` is None. A checkpoint
    without a value head (an RLOO round trains none) gets the zero head too. ``cache``
    keeps the loaded base between calls (each call works on its own deep copy)."""
    cache = {} if cache is None else cache
    if "base_model" not in cache:
        cache["base_model"] = load_model(config)
    loaded = cache["base_model"]
    model = copy.deepcopy(loaded.model).eval()
    head = ValueHead(model.config.get_text_config().hidden_size)
    if checkpoint_path is not None:
        model = load_adapter(model, Path(checkpoint_path), Path(checkpoint_path).name)
        head_file = Path(checkpoint_path) / VALUE_HEAD
        if head_file.is_file():
            head.load_state_dict(load_file(str(head_file)))
    return Policy(model, head.to(loaded.device))


def measure_policy(policy, probe: Sequence[tuple], heldout: Heldout, *, adapter: bool,
                   batch_size: int = 16, general: GeneralText | None = None) -> dict:
    """KL per token on ``probe`` episodes, held-out perplexity (and each held-out reply's
    NLL and token count, for perplexity on a subset), the predicted reward of every
    probe reply and held-out reply (value at the last reply token), and with ``general``
    the general-text perplexity (``perplexity_general``)."""
    device = next(policy.model.parameters()).device
    out: dict = {}
    with torch.no_grad():
        policy.model.eval()
        if probe:
            b = build_rollout(probe, device)
            kl = measure_kl(policy, b, batch_size) if adapter else torch.zeros_like(b.mask)
            out["kl"] = float(weighted_mean(kl, b.mask, torch.ones_like(b.weights)))
            _, values = evaluate(policy, b, batch_size)
            out["probe_values"] = last_values(values, b.mask)
        b = build_rollout(heldout.episodes, device)
        logp, values = evaluate(policy, b, batch_size)
        out["perplexity"] = math.exp(-float((logp * b.mask).sum() / b.mask.sum()))
        out["heldout_nll"] = [float(x) for x in -(logp * b.mask).sum(1)]      # (B,) per reply
        out["heldout_tokens"] = [int(x) for x in b.mask.sum(1)]
        out["heldout_values"] = last_values(values, b.mask)
        if general is not None and general.episodes:
            b = build_rollout(general.episodes, device)
            logp, _ = evaluate(policy, b, batch_size, values=False)
            out["perplexity_general"] = math.exp(-float((logp * b.mask).sum() / b.mask.sum()))
    return out


def subset_perplexity(nll: Sequence[float], tokens: Sequence[int],
                      keep: Sequence[bool]) -> float | None:
    """Perplexity over the rows where ``keep`` is true (per token, as ``perplexity``)."""
    total = sum(n for n, k in zip(nll, keep) if k)
    count = sum(t for t, k in zip(tokens, keep) if k)
    return math.exp(total / count) if count else None


def last_values(values: torch.Tensor, mask: torch.Tensor) -> list[float]:
    """values (B, T) at each row's last real reply token -> B floats."""
    last = (mask.sum(1).long() - 1).clamp_min(0)
    return [float(v) for v in values[torch.arange(len(last)), last]]


# --- probe replies, sampled in batches --------------------------------------------------------

PROBE_BLOCK = 16       # probe prompts sampled together on a CPU; block b uses seed ``seed + b``
PROBE_BLOCK_GPU = 64   # on a GPU, where a batch of 64 costs about what one of 16 does


def probe_block(device) -> int:
    """How many probe prompts are sampled together on ``device`` (a torch device or name)."""
    return PROBE_BLOCK_GPU if torch.device(device).type == "cuda" else PROBE_BLOCK


@dataclass
class ProbeReply:
    """A probe reply, with what measuring it needs (the fields of the engine's replies)."""
    prompt: str
    text: str
    prompt_ids: list[int]
    reply_ids: list[int]
    logprobs: list[float]
    gen_params: dict


def sample_probe(engine, prompts: Sequence[str], start: int, n: int, *, seed: int,
                 progress: Callable[[int, int], None] | None = None) -> list[ProbeReply]:
    """Replies ``start .. n - 1`` to ``prompts`` from the engine's model as it is (the
    active adapter included), in batches (``Engine.replies``): whole blocks of
    ``probe_block`` prompts (16 on a CPU, 64 on a GPU), block b sampled with seed
    ``seed + b``, so reply j is the same whatever probe size asked for it on one device
    (replies beyond ``n`` in the last block are sampled and dropped). Batched, a real
    model answers a 64-prompt probe several times faster than one reply at a time."""
    size = probe_block(engine.device)
    out: list[ProbeReply] = []
    first = start - start % size
    for block_start in range(first, n, size):
        block = list(prompts[block_start:block_start + size])
        params = engine.generation_params(seed=seed + block_start // size)
        replies = engine.replies([engine.build_prompt([], p) for p in block], params)
        for j, (prompt, reply) in enumerate(zip(block, replies), start=block_start):
            if start <= j < n:
                out.append(ProbeReply(prompt, reply.text, list(reply.prompt_ids),
                                      list(reply.reply_ids), list(reply.logprobs),
                                      reply.gen_params))
        if progress:
            progress(min(n, block_start + size) - start, n - start)
    return out
