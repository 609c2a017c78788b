"""The anchor: the base model's own text, which PPO keeps likely while it learns a style.

Learning a person's style through the chat template also moves the model on everything
else: on SmolLM2-135M, six rounds of a style raised the perplexity of plain prose by 4-10%
(``reinf bench learn``'s general-text figure, docs/benchmarks.md). The KL terms of the loss
cannot stop that, because they read only the replies being trained on. The anchor reads
other text: ``ANCHOR_TEXTS`` passages the *base* model writes itself, unconditioned (from
the token that starts a document, temperature 1, the adapter off), sampled once per model
and kept in the data directory (``anchor/<key>.json``).

With ``ppo.anchor_coef`` > 0, each optimizer step also backpropagates that weight times
the exact KL(base || policy) over the vocabulary at each token of ``batch_size`` of those
passages (reinf.training.ppo.anchor_loss; the round reports it as ``anchor_kl``): the
policy's next-token distribution on the base's own text is kept the base's, whatever the
person's style. The whole distribution, not the sampled tokens' likelihood: on a few
hundred passages that would teach the passages themselves, which on the tiny test model
moved other text further than no anchor at all (docs/benchmarks.md, "The anchor").

The passages are the model's own, never the benchmark's general text: the figure that
measures the drift must stay held out.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)

ANCHOR_TEXTS = 256     # passages sampled once per model
ANCHOR_TOKENS = 48     # tokens each (fewer where the base chose to stop)
ANCHOR_SEED = 20261130
VERSION = 1            # bump when what is sampled changes: older files are sampled again
DOCUMENT_STARTS = ("<|endoftext|>", "</s>", "<|end_of_text|>")


def document_start(tokenizer) -> int:
    """The token the base's own text starts from: the tokenizer's document separator
    (pretraining text is joined with it), else its BOS, else its EOS."""
    for token in DOCUMENT_STARTS:
        found = tokenizer.convert_tokens_to_ids(token)
        # an unknown token maps to the UNK id; SmolLM2's UNK *is* its <|endoftext|>
        if isinstance(found, int) and tokenizer.convert_ids_to_tokens(found) == token:
            return found
    for found in (tokenizer.bos_token_id, tokenizer.eos_token_id):
        if found is not None:
            return int(found)
    raise ValueError("the tokenizer has no document separator, BOS or EOS token to start the "
                     "anchor's text from")


def anchor_key(name: str, model, tokenizer, start: int) -> str:
    """What the passages depend on: the model (its name, size and vocabulary), the start
    token and how they are sampled."""
    n_params = sum(p.numel() for p in model.parameters())
    what = {"model": str(name), "params": n_params, "vocab": len(tokenizer), "start": start,
            "texts": ANCHOR_TEXTS, "tokens": ANCHOR_TOKENS, "seed": ANCHOR_SEED,
            "version": VERSION}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def anchor_episodes(config, session, *, report: Callable[[dict], None] | None = None
                    ) -> list[tuple]:
    """The anchor passages as episodes (prompt = the start token, reply = the passage, its
    log-probs under the base, temperature 1, reward 0, weight 1): read from the data
    directory, or sampled now (and kept) the first time this model trains with them."""
    from reinf.training.rollouts import sample_rollouts

    model, tokenizer = session.policy.model, session.loaded.tokenizer
    start = document_start(tokenizer)
    key = anchor_key(session.loaded.name, model, tokenizer, start)
    path = Path(config.data_dir) / "anchor" / f"{key}.json"
    texts = _read(path)
    if texts is None:
        if report:
            report({"stage": "anchor", "done": 0, "total": ANCHOR_TEXTS})
        with model.disable_adapter():  # the base's text, whatever adapter is loaded
            sampled = sample_rollouts(
                model, tokenizer, [[start]], ANCHOR_TEXTS, temperature=1.0, top_p=1.0,
                max_new_tokens=ANCHOR_TOKENS, seed=ANCHOR_SEED,
                batch_size=config.training.rollout_batch_size,
                progress=(lambda done, n: report({"stage": "anchor", "done": done, "total": n}))
                if report else None)
        texts = [{"ids": r.reply_ids, "logprobs": r.logprobs} for r in sampled
                 if len(r.reply_ids) >= 2]
        _write(path, {"model": str(session.loaded.name), "start": start, "texts": texts})
    return as_episodes(start, texts)


def as_episodes(start: int, texts: list[dict]) -> list[tuple]:
    """Passages as episodes: prompt = the start token, reply = the passage, its log-probs
    under the base, temperature 1, reward 0, weight 1."""
    return [([start], t["ids"], t["logprobs"], 1.0, 0.0, 1.0) for t in texts]


def read_episodes(path: str | Path) -> list[tuple]:
    """A kept passages file (``<data_dir>/anchor/<key>.json``) as episodes, for studies
    of a run's checkpoints against the passages that run read."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return as_episodes(data["start"], data["texts"])


def _read(path: Path) -> list[dict] | None:
    """The kept passages, or None (absent, or unreadable: sampled again)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        texts = data["texts"]
        if not texts or not all(len(t["ids"]) == len(t["logprobs"]) >= 2 for t in texts):
            raise ValueError("a passage's ids and log-probs disagree")
        return texts
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("the anchor's passages in %s are unreadable (%s): sampling them again",
                    path, exc)
        return None


def _write(path: Path, data: dict) -> None:
    """Atomically, so a killed round never leaves half a file; private like the rest of
    the data directory (reinf.storage.permissions)."""
    from reinf.storage.permissions import PRIVATE_DIR, open_private

    path.parent.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open_private(tmp) as f:
        f.write(json.dumps(data))
    os.replace(tmp, path)
