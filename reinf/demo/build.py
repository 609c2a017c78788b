"""Build the built-in demo model, ``models/reinf-demo`` (docs/design.md §8).

The demo model is a ~1M parameter Qwen2 causal LM with its own byte-level BPE tokenizer and a
ChatML chat template, trained from scratch on the synthetic corpus of ``reinf.demo.corpus``. It
exists so that Reinf installs, runs and passes its tests offline: nothing is downloaded.

The build is seeded and deterministic (same seed, steps and environment give identical
weights), is sized to take under 2 minutes on 2 CPU cores (measured figures are in
models/README.md), and writes atomically: everything goes into a temporary directory beside
``out_dir`` that is renamed into place only when complete.

    python -m reinf.demo.build [--out models/reinf-demo] [--seed 0] [--steps N]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

from reinf.demo import corpus

DEMO_NAME = "reinf-demo"
INFO_FILE = "reinf_demo.json"
PAD_TOKEN, BOS_TOKEN, EOS_TOKEN = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, BOS_TOKEN, EOS_TOKEN]

# ChatML, as used by Qwen2. The {% generation %} markers let
# ``apply_chat_template(..., return_assistant_tokens_mask=True)`` find the assistant tokens
# (content and <|im_end|>), which is what the build trains on and what an SFT baseline needs.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- generation -%}{{- message['content'] + '<|im_end|>' -}}{%- endgeneration -%}"
    "{{- '\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# A few system prompts appear in training so that an engine that sends one still gets a
# sensible reply; most examples have none.
SYSTEM_PROMPTS = (
    "You are Reinf, a helpful assistant.",
    "You are a helpful assistant.",
    "You are Reinf, a small local assistant. Answer the user.",
)


@dataclass(frozen=True)
class DemoConfig:
    """Sizes and training settings of the demo model; the defaults are the committed build."""

    vocab_size: int = 1024
    """BPE vocabulary size, special tokens included."""
    hidden_size: int = 128
    """Width of the residual stream."""
    num_layers: int = 4
    """Transformer blocks."""
    num_heads: int = 4
    """Query heads (head dim = hidden_size / num_heads)."""
    num_kv_heads: int = 2
    """Key/value heads (grouped-query attention, as in Qwen2)."""
    intermediate_size: int = 384
    """Width of the SwiGLU MLP."""
    max_positions: int = 512
    """Longest sequence the model accepts (rotary positions)."""
    corpus_size: int = 8000
    """Conversation items generated; 5% are held out for the fluency measurement."""
    steps: int = 600
    """Optimizer steps."""
    row_tokens: int = 256
    """Length of a packed training row (several conversations each)."""
    rows_per_step: int = 8
    """Packed rows per optimizer step (about 34 conversations)."""
    lr: float = 5e-3
    """Peak AdamW learning rate; linear warm-up then cosine decay to 0."""
    warmup_steps: int = 50
    """Linear warm-up steps."""
    weight_decay: float = 0.01
    """AdamW weight decay on matrices."""
    system_prompt_rate: float = 0.15
    """Share of training conversations that start with a system prompt."""
    multi_turn_rate: float = 0.3
    """Share of training conversations that carry earlier user/assistant exchanges."""
    max_history: int = 3
    """Most earlier exchanges in such a conversation (1 to this many, uniformly)."""


def build_tokenizer(texts: list[str], vocab_size: int):
    """Train a byte-level BPE on ``texts`` and wrap it as a ``Qwen2Tokenizer``.

    The BPE is trained with exactly the normalizer and pre-tokenizer that transformers'
    Qwen2Tokenizer rebuilds on load (NFC, Qwen's split regex, byte-level; digits are single
    tokens). ``AutoTokenizer`` always loads a qwen2 model's tokenizer as Qwen2Tokenizer, so a
    tokenizer trained any other way would silently encode differently after a round trip.
    """
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # any byte can be encoded
    )
    bpe.train_from_iterator(texts, trainer)
    trained = json.loads(bpe.to_str())["model"]
    return Qwen2Tokenizer(
        vocab=trained["vocab"], merges=[tuple(m) for m in trained["merges"]],
        eos_token=EOS_TOKEN, pad_token=PAD_TOKEN, unk_token=None, bos_token=None,
        extra_special_tokens=[BOS_TOKEN], chat_template=CHAT_TEMPLATE,
        model_max_length=DemoConfig.max_positions,
    )


def build_model(tokenizer, cfg: DemoConfig, seed: int):
    """A freshly initialised Qwen2ForCausalLM sized by ``cfg`` (seeded)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    model_config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads, intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_positions, tie_word_embeddings=True,
        rope_theta=10000.0, attention_dropout=0.0,
        bos_token_id=tokenizer.convert_tokens_to_ids(BOS_TOKEN),
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(model_config)


def build_examples(items: list[dict], tokenizer, cfg: DemoConfig,
                   rng: random.Random | None) -> list[tuple[list[int], list[int]]]:
    """Tokenize items as chats: (input_ids, labels) with -100 on every non-assistant token.

    With ``rng``, some examples get a system prompt or earlier exchanges (drawn from
    ``items``), so the model answers the last message of the contexts an engine sends; the
    loss covers the earlier replies too. Without ``rng``, each item is a plain single-turn
    chat (used for the held-out measurement).
    """
    examples = []
    for item in items:
        messages = []
        if rng is not None and rng.random() < cfg.system_prompt_rate:
            messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
        history = rng.sample(items, rng.randint(1, cfg.max_history)) \
            if rng is not None and rng.random() < cfg.multi_turn_rate else []
        last = [{"role": "user", "content": item["prompt"]},
                {"role": "assistant", "content": item["reply"]}]
        while True:
            chat = messages + [{"role": role, "content": prev[key]} for prev in history
                               for role, key in (("user", "prompt"), ("assistant", "reply"))] + last
            enc = tokenizer.apply_chat_template(chat, tokenize=True, return_dict=True,
                                                return_assistant_tokens_mask=True)
            if len(enc["input_ids"]) <= cfg.row_tokens or not history:
                break
            history = history[1:]  # too long for a training row: drop the oldest exchange
        ids, mask = enc["input_ids"], enc["assistant_masks"]
        examples.append((ids, [t if m else -100 for t, m in zip(ids, mask)]))
    return examples


def _packed_batches(examples, cfg: DemoConfig, pad_id: int, rng: random.Random):
    """Endless batches of packed rows: (input_ids, position_ids, labels), each (R, row_tokens).

    Conversations are packed several to a row, and each restarts its position ids at 0, which
    transformers turns into a block-diagonal causal mask (no attention across conversations).
    Packing wastes little compute on padding, and unlike length-bucketing it keeps every batch
    a random mix of styles: bucketing makes batches all-terse or all-chatty (their lengths
    differ), and the model's style odds then follow whichever bucket came last.
    """
    width = cfg.row_tokens
    while True:
        order = list(range(len(examples)))
        rng.shuffle(order)
        rows: list[list[int]] = []
        open_rows: list[tuple[int, list[int]]] = []  # (tokens used, example indices)
        for i in order:
            need = min(len(examples[i][0]), width)
            for k, (used, members) in enumerate(open_rows):  # first fit among a few open rows
                if used + need <= width:
                    open_rows[k] = (used + need, members + [i])
                    break
            else:
                open_rows.append((need, [i]))
                if len(open_rows) > 8:
                    rows.append(open_rows.pop(0)[1])
        rows += [members for _, members in open_rows]
        rng.shuffle(rows)
        for start in range(0, len(rows) - cfg.rows_per_step + 1, cfg.rows_per_step):
            yield _collate_packed(examples, rows[start:start + cfg.rows_per_step], width, pad_id)


def _collate_packed(examples, rows: list[list[int]], width: int, pad_id: int):
    """Rows of back-to-back examples: input_ids, position_ids, labels, each (R, width)."""
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    positions = torch.zeros((len(rows), width), dtype=torch.long)
    for r, members in enumerate(rows):
        at = 0
        for i in members:
            x, y = (seq[:width] for seq in examples[i])
            ids[r, at:at + len(x)] = torch.tensor(x)
            labels[r, at:at + len(y)] = torch.tensor(y)
            positions[r, at:at + len(x)] = torch.arange(len(x))
            at += len(x)
        positions[r, at:] = torch.arange(width - at)  # padding is a segment of its own
    return ids, positions, labels


@torch.no_grad()
def evaluate_loss(model, examples, pad_id: int, batch_size: int = 64) -> float:
    """Mean next-token loss over the labelled (assistant) tokens of ``examples``."""
    model.eval()
    total, count = 0.0, 0
    for start in range(0, len(examples), batch_size):
        rows = [[i] for i in range(start, min(start + batch_size, len(examples)))]
        width = max(len(examples[i][0]) for (i,) in rows)
        ids, positions, labels = _collate_packed(examples, rows, width, pad_id)
        logits = model(input_ids=ids, position_ids=positions, use_cache=False).logits
        logits = logits[:, :-1]  # (B, T-1, V): position t predicts token t+1
        targets = labels[:, 1:]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                                 targets.reshape(-1), reduction="sum")
        total += loss.item()
        count += int((targets != -100).sum())
    return total / max(count, 1)


def train(model, examples, cfg: DemoConfig, steps: int, seed: int, pad_id: int,
          progress: bool = True) -> float:
    """Train on assistant tokens with AdamW + cosine schedule; return the final smoothed loss."""
    from tqdm.auto import tqdm

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=cfg.lr, betas=(0.9, 0.95))

    def lr_at(step: int) -> float:
        if step < cfg.warmup_steps:
            return cfg.lr * (step + 1) / cfg.warmup_steps
        frac = (step - cfg.warmup_steps) / max(1, steps - cfg.warmup_steps)
        return cfg.lr * 0.5 * (1 + math.cos(math.pi * frac))  # to 0: the last steps settle

    batches = _packed_batches(examples, cfg, pad_id, random.Random(f"batches-{seed}"))
    model.train()
    smoothed = None
    bar = tqdm(range(steps), desc=f"training {DEMO_NAME}", disable=not progress,
               file=sys.stderr, mininterval=2.0)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        ids, positions, labels = next(batches)
        # No attention mask and no cache: that is how transformers detects packed rows.
        loss = model(input_ids=ids, position_ids=positions, labels=labels, use_cache=False).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        smoothed = loss.item() if smoothed is None else 0.95 * smoothed + 0.05 * loss.item()
        bar.set_postfix(loss=f"{smoothed:.3f}", refresh=False)
    bar.close()
    model.eval()
    return float(smoothed if smoothed is not None else float("nan"))


def _write_model(out: Path, cfg: DemoConfig, seed: int, steps: int, progress: bool) -> dict:
    """Generate the corpus, train tokenizer and model, and save everything into ``out``."""
    from transformers import GenerationConfig

    started = time.perf_counter()
    items = corpus.generate_corpus(seed=seed, n=cfg.corpus_size)
    train_items, heldout_items = corpus.split_corpus(items, seed=seed)
    texts = [t for it in train_items for t in (it["prompt"], it["reply"])] + list(SYSTEM_PROMPTS)
    tokenizer = build_tokenizer(texts, cfg.vocab_size)
    train_examples = build_examples(train_items, tokenizer, cfg, random.Random(f"chats-{seed}"))
    heldout_examples = build_examples(heldout_items, tokenizer, cfg, rng=None)
    model = build_model(tokenizer, cfg, seed)

    train_started = time.perf_counter()
    final_loss = train(model, train_examples, cfg, steps, seed, tokenizer.pad_token_id, progress)
    train_seconds = time.perf_counter() - train_started
    heldout_loss = evaluate_loss(model, heldout_examples, tokenizer.pad_token_id)

    model.generation_config = GenerationConfig(
        do_sample=True, temperature=0.8, top_p=0.95, max_new_tokens=96,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.convert_tokens_to_ids(BOS_TOKEN),
    )
    _save_quietly(model, tokenizer, out, quiet=not progress)
    info = {
        "name": DEMO_NAME,
        "seed": seed,
        "steps": steps,
        "corpus_size": len(items),
        "train_examples": len(train_examples),
        "heldout_examples": len(heldout_examples),
        "final_loss": round(final_loss, 4),
        "heldout_loss": round(heldout_loss, 4),
        "heldout_perplexity": round(math.exp(heldout_loss), 3),
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_seconds": round(train_seconds, 1),
        "build_seconds": round(time.perf_counter() - started, 1),
        "torch_threads": torch.get_num_threads(),
        "versions": {"torch": torch.__version__,
                     "transformers": importlib.metadata.version("transformers")},
        "config": dataclasses.asdict(cfg),
        "styles": {"length": list(corpus.LENGTHS), "format": list(corpus.FORMATS),
                   "question": list(corpus.QUESTIONS)},
        "kinds": list(corpus.KINDS),
    }
    (out / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    return info


def _save_quietly(model, tokenizer, out: Path, quiet: bool) -> None:
    """save_pretrained, without transformers' own progress bar when the build is quiet."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    if quiet:
        hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    finally:
        if quiet and was_enabled:
            hf_logging.enable_progress_bar()
    for path in out.iterdir():
        path.chmod(0o644)  # safetensors writes 0600; a model directory is meant to be shared


def build_demo_model(out_dir: str | os.PathLike, seed: int = 0, steps: int | None = None,
                     progress: bool = True, config: DemoConfig | None = None) -> Path:
    """Build the demo model into ``out_dir`` atomically and return its path.

    ``steps`` overrides the training length (tests build a mini model with a few steps). The
    build runs on 2 CPU threads, which keeps it deterministic and within its time budget.
    """
    cfg = config or DemoConfig()
    steps = cfg.steps if steps is None else steps
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the budget is 2 cores; the thread count also fixes float sums
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.building-", dir=out_dir.parent))
    try:
        info = _write_model(tmp, cfg, seed, steps, progress)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; a model dir should be readable
        _swap_into_place(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        torch.set_num_threads(threads)
    if progress:
        print(f"built {out_dir} in {info['build_seconds']}s: {info['parameters']:,} parameters, "
              f"final loss {info['final_loss']}, held-out perplexity {info['heldout_perplexity']}",
              file=sys.stderr)
    return out_dir


def _swap_into_place(tmp: Path, out_dir: Path) -> None:
    """Rename the finished build to ``out_dir``; an existing model is moved aside first.

    A directory cannot be replaced in one rename, so there is a short moment with no model
    at ``out_dir``, but never a half-written one.
    """
    old = None
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}-{time.time_ns()}")
        os.rename(out_dir, old)
    os.rename(tmp, out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def load_demo_info(model_dir: str | os.PathLike) -> dict | None:
    """The build record of a demo model directory, or None if it is not a demo build."""
    path = Path(model_dir) / INFO_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reinf.demo.build",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(Path("models") / DEMO_NAME), help="output directory")
    parser.add_argument("--seed", type=int, default=0, help="seed for corpus, init and order")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"optimizer steps (default {DemoConfig.steps})")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    args = parser.parse_args(argv)
    path = build_demo_model(args.out, seed=args.seed, steps=args.steps, progress=not args.quiet)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
