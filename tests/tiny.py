"""Tiny random models for tests: a Qwen2 causal LM, its tokenizer, and LoRA adapters.

Nothing here downloads anything or needs the demo model. ``make_tiny_model`` saves a
random-init Qwen2ForCausalLM (~30k parameters) with a byte-level BPE tokenizer that
carries a ChatML chat template, in exactly the layout ``from_pretrained`` reads from a
hub snapshot. ``make_adapter`` saves a random, non-zero LoRA adapter in PEFT's format,
the way a checkpoint directory of the trainer holds one.

    from tiny import make_tiny_model, make_adapter
    model_dir = make_tiny_model(tmp_path / "tiny")
    ckpt = make_adapter(model_dir, tmp_path / "ckpt-1", seed=1)
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

PAD, BOS, EOS = "<|endoftext|>", "<|im_start|>", "<|im_end|>"

# ChatML, as Qwen2 models use it.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# A fixed text to learn a few BPE merges from, so prompts are not one token per byte.
_TEXT = (
    "The quick brown fox jumps over the lazy dog. Hello, how are you today? "
    "Tell me about the weather, the sea and the mountains. What is a language model? "
    "A language model predicts the next token. Please answer in one short sentence. "
    "Thank you! You are welcome. Write a list: one, two, three. Why is the sky blue?"
)

TINY_DIMS = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=64)


def build_tiny_tokenizer(vocab_size: int = 400, max_positions: int = 256):
    """A byte-level BPE ``Qwen2Tokenizer`` with ChatML special tokens and chat template.

    It is trained with the same normalizer and pre-tokenizer that Qwen2Tokenizer rebuilds
    on load, so it encodes identically after a save/load round trip.
    """
    return build_chat_tokenizer(CHAT_TEMPLATE, [PAD, BOS, EOS], eos=EOS, pad=PAD,
                                vocab_size=vocab_size, max_positions=max_positions)


def build_chat_tokenizer(chat_template: str, specials: list[str], *, eos: str, pad: str,
                         bos: str | None = None, vocab_size: int = 400,
                         max_positions: int = 256):
    """The tiny byte-level BPE with any family's special tokens (ids 0, 1, ... in the order
    of ``specials``) and chat template, as a ``Qwen2Tokenizer``: what matters to Reinf is
    the template and the token ids, not the tokenizer class."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials),
                                  show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([_TEXT] * 4, trainer)
    trained = json.loads(bpe.to_str())["model"]
    extra = [t for t in specials if t not in (eos, pad)]
    return Qwen2Tokenizer(vocab=trained["vocab"], merges=[tuple(m) for m in trained["merges"]],
                          eos_token=eos, pad_token=pad, unk_token=None, bos_token=bos,
                          extra_special_tokens=extra, chat_template=chat_template,
                          model_max_length=max_positions)


def save_causal_lm(path, model_class, config, tokenizer, *, eos_ids, seed: int = 0) -> Path:
    """Save a random-init ``model_class(config)`` with ``tokenizer`` and a generation
    config whose ``eos_token_id`` is ``eos_ids`` (a list, as Llama-3's) to ``path``."""
    from transformers import GenerationConfig

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(path)
    torch.manual_seed(seed)
    model = model_class(config)
    model.generation_config = GenerationConfig(eos_token_id=list(eos_ids),
                                               pad_token_id=config.pad_token_id)
    model.save_pretrained(path)
    return path


def make_tiny_model(path, *, seed: int = 0, vocab_source=None, max_positions: int = 256,
                    **dims) -> Path:
    """Save a random-init tiny Qwen2 causal LM and its tokenizer to ``path``; return it.

    ``vocab_source``: a model directory whose tokenizer files are copied instead of
    building the tiny BPE (e.g. the demo model's), so prompts tokenize as there.
    ``dims`` override ``TINY_DIMS`` (hidden_size, num_hidden_layers, ...).
    """
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if vocab_source is not None:
        for f in Path(vocab_source).iterdir():
            if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges",
                                  "chat_template")):
                shutil.copy2(f, path / f.name)
        tokenizer = AutoTokenizer.from_pretrained(path)
    else:
        tokenizer = build_tiny_tokenizer(max_positions=max_positions)
        tokenizer.save_pretrained(path)
    eos_id = tokenizer.convert_tokens_to_ids(EOS)
    config = Qwen2Config(
        vocab_size=len(tokenizer), max_position_embeddings=max_positions,
        tie_word_embeddings=True, rope_theta=10000.0, attention_dropout=0.0,
        bos_token_id=tokenizer.convert_tokens_to_ids(BOS), eos_token_id=eos_id,
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD), **{**TINY_DIMS, **dims})
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=eos_id,
                                               pad_token_id=config.pad_token_id)
    model.save_pretrained(path)
    return path


def make_adapter(model_dir, out_dir, *, seed: int, r: int = 4, alpha: int = 8,
                 target_modules=("q_proj", "v_proj"), scale: float = 0.5) -> Path:
    """Save a random LoRA adapter for ``model_dir`` in PEFT format into ``out_dir``.

    PEFT initialises lora_B to zero (an adapter that changes nothing), so B is drawn at
    random too. Like a trainer checkpoint, the directory also holds a value head file,
    which the engine must ignore.
    """
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    out_dir = Path(out_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    torch.manual_seed(seed)
    peft_model = get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0,
                                                  target_modules=list(target_modules)))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * scale)
    peft_model.save_pretrained(out_dir)
    hidden = model.config.hidden_size
    save_file({"summary.weight": torch.zeros(1, hidden), "summary.bias": torch.zeros(1)},
              str(out_dir / "value_head.safetensors"))
    (out_dir / "metrics.json").write_text(json.dumps({"seed": seed}))
    return out_dir
