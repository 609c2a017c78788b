"""The built-in demo model: a mini build is deterministic and loadable; the committed model
loads and its sampled replies cover every style value (docs/design.md §8)."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from reinf.demo import build as demo
from reinf.demo.corpus import detect_styles, sample_prompts
from reinf.demo.build import DEMO_NAME, DemoConfig, build_demo_model

pytestmark = pytest.mark.e2e

COMMITTED = Path(__file__).resolve().parents[2] / "models" / DEMO_NAME
# A mini build: a small corpus and a few steps, so two builds take seconds.
MINI = dataclasses.replace(DemoConfig(), corpus_size=400, rows_per_step=2)


def _load(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    return tokenizer, model


def test_mini_build_is_deterministic_and_loadable(tmp_path):
    first = build_demo_model(tmp_path / "a", seed=3, steps=4, progress=False, config=MINI)
    second = build_demo_model(tmp_path / "b", seed=3, steps=4, progress=False, config=MINI)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]  # no temp dirs left

    from safetensors.torch import load_file

    weights_a = load_file(first / "model.safetensors")
    weights_b = load_file(second / "model.safetensors")
    assert weights_a.keys() == weights_b.keys()
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)
    assert (first / "tokenizer.json").read_text() == (second / "tokenizer.json").read_text()

    tokenizer, model = _load(first)
    info = json.loads((first / demo.INFO_FILE).read_text())
    assert info["seed"] == 3 and info["steps"] == 4 and info["corpus_size"] == 400
    assert info["parameters"] == sum(p.numel() for p in model.parameters())
    assert info["styles"]["length"] == ["terse", "chatty"]

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
                    "<|im_start|>assistant\n")
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                        return_dict=True)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token_id != tokenizer.eos_token_id
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    out = model.generate(**ids, max_new_tokens=5, do_sample=False)
    assert out.shape[1] > ids["input_ids"].shape[1]


def test_failed_build_keeps_the_previous_model(tmp_path, monkeypatch):
    target = build_demo_model(tmp_path / DEMO_NAME, seed=0, steps=1, progress=False, config=MINI)
    before = (target / "model.safetensors").read_bytes()

    def boom(*args, **kwargs):
        raise RuntimeError("interrupted")

    monkeypatch.setattr(demo, "train", boom)
    with pytest.raises(RuntimeError, match="interrupted"):
        build_demo_model(target, seed=1, steps=1, progress=False, config=MINI)
    assert (target / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [DEMO_NAME]


@pytest.fixture(scope="module")
def committed():
    if not (COMMITTED / "model.safetensors").is_file():
        pytest.fail(f"no demo model at {COMMITTED}; build it with `python -m reinf.demo.build`")
    return _load(COMMITTED)


def test_committed_model_is_small_and_documented(committed):
    _, model = committed
    size = sum(p.stat().st_size for p in COMMITTED.iterdir())
    assert size < 10 * 2**20
    info = demo.load_demo_info(COMMITTED)
    assert info["parameters"] == sum(p.numel() for p in model.parameters())
    assert 0.5e6 < info["parameters"] < 2e6
    assert model.config.model_type == "qwen2" and model.config.max_position_embeddings >= 512


def test_committed_model_samples_every_style(committed):
    tokenizer, model = committed
    prompts = sample_prompts(seed=11, n=48)
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}],
                                           add_generation_prompt=True, tokenize=False)
             for p in prompts]
    tokenizer.padding_side = "left"  # batched generation continues from the right edge
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(**batch, do_sample=True, temperature=0.8, top_p=0.95,
                             max_new_tokens=80)
    replies = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    counts = Counter()
    for reply in replies:
        for key, value in detect_styles(reply).items():
            counts[key, value] += 1
    print(sorted(counts.items(), key=str))
    for key, values in {"length": ("terse", "chatty"), "format": ("plain", "bulleted"),
                        "question": (False, True)}.items():
        for value in values:
            assert counts[key, value] >= 5, (key, value, counts)
    # Replies read as sentences: they end in punctuation and are not empty.
    finished = [r for r in replies if r.strip() and r.strip()[-1] in ".!?"]
    assert len(finished) >= 0.9 * len(replies)
