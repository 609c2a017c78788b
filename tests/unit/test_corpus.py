"""The demo corpus: determinism, balance, correctness, and the style detector (no model load)."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from reinf.demo import corpus
from reinf.demo.corpus import (
    KINDS,
    STYLE_COMBOS,
    detect_styles,
    generate_corpus,
    sample_prompts,
    split_corpus,
)


@pytest.fixture(scope="module")
def items():
    return generate_corpus(seed=0)


def _style_key(styles: dict) -> tuple:
    return styles["length"], styles["format"], styles["question"]


def test_corpus_is_deterministic_per_seed(items):
    assert generate_corpus(seed=0) == items
    other = generate_corpus(seed=1)
    assert len(other) == len(items)
    assert other != items


def test_items_have_the_documented_shape(items):
    for it in items[:500]:
        assert set(it) == {"kind", "prompt", "reply", "styles"}
        assert it["kind"] in KINDS
        assert it["prompt"].strip() and it["reply"].strip()
        assert it["styles"]["length"] in ("terse", "chatty")
        assert it["styles"]["format"] in ("plain", "bulleted")
        assert isinstance(it["styles"]["question"], bool)


def test_every_kind_and_style_combination_occurs_balanced_within_its_kind(items):
    counts = Counter((it["kind"], _style_key(it["styles"])) for it in items)
    assert len(counts) == len(KINDS) * len(STYLE_COMBOS)
    for kind in KINDS:
        per_style = [counts[kind, _style_key(styles)] for styles in STYLE_COMBOS]
        print(kind, per_style)
        assert min(per_style) >= 0.9 * max(per_style) and min(per_style) >= 50, (kind, per_style)
    kinds = Counter(it["kind"] for it in items)
    assert min(kinds.values()) >= 0.05 * len(items)  # every kind is well represented


def test_each_prompt_is_answered_in_balanced_styles(items):
    # A small model memorises per-prompt style mixes, so the corpus keeps them uniform.
    by_prompt: dict[str, Counter] = {}
    for it in items:
        by_prompt.setdefault(it["prompt"], Counter())[_style_key(it["styles"])] += 1
    for prompt, counts in by_prompt.items():
        assert len(set(counts.values())) == 1 and len(counts) == len(STYLE_COMBOS), prompt


def test_detect_styles_recovers_corpus_labels(items):
    hits = sum(detect_styles(it["reply"]) == it["styles"] for it in items)
    accuracy = hits / len(items)
    print(f"detect_styles accuracy on the corpus: {accuracy:.4f} ({hits}/{len(items)})")
    assert accuracy >= 0.99


def test_style_markers_appear_early_and_rules_have_margin(items):
    for it in items:
        reply, styles = it["reply"], it["styles"]
        first_line = reply.splitlines()[0]
        if styles["format"] == "bulleted":
            assert reply.splitlines()[1].startswith("- ")  # lead line, then bullets
            assert not first_line.startswith("- ")
        else:
            assert "\n" not in reply
        if styles["length"] == "chatty":
            openers = corpus.OPENERS + tuple(g[1] for g in corpus.GREETINGS)
            assert first_line.split("!")[0] + "!" in openers
        # Word counts keep a margin of 3 from the threshold, so sloppy output still classifies.
        body = reply
        for closer in (*corpus.CLOSERS, corpus.GREETING_CLOSER):
            body = body.removesuffix(closer)
        words = len(re.findall(r"[A-Za-z0-9']+", body.replace("- ", " ")))
        if styles["length"] == "terse":
            assert words <= corpus.TERSE_MAX_WORDS - 3, reply
        else:
            assert words >= corpus.TERSE_MAX_WORDS + 3, reply


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("The capital of France is Paris.", ("terse", "plain", False)),
        ("Paris. Anything else you'd like to know?", ("terse", "plain", True)),
        ("In short:\n- Paris is the capital.", ("terse", "bulleted", False)),
        (("Great question! Here are the key points:\n- Paris is the capital of France.\n"
          "- It is famous for the Eiffel Tower.\n- Paris sits on the river Seine.\n"
          "Does that help?"),
         ("chatty", "bulleted", True)),
        (("Happy to help! Walk for thirty minutes each day. Eat plenty of fruit and vegetables. "
          "Drink enough water through the day."), ("chatty", "plain", False)),
        # Imperfect model output: stray spaces, a "*" bullet, a cut-off reply, an empty one.
        ("  In short:\n  * Paris  \n", ("terse", "bulleted", False)),
        ("Great question! The capital of France is Paris. It is famous for the Eiffel Tower and",
         ("chatty", "plain", False)),
        ("", ("terse", "plain", False)),
        ("Who knows?", ("terse", "plain", True)),
    ],
)
def test_detect_styles_rules(reply, expected):
    assert _style_key(detect_styles(reply)) == expected


def _expected_answer(prompt: str) -> int:
    a, b = (int(x) for x in re.findall(r"\d+", prompt))
    if "subtract" in prompt.lower():
        a, b = b, a  # "Can you subtract b from a?"
    if any(w in prompt for w in ("plus", "+", "add")):
        return a + b
    if any(w in prompt for w in ("minus", "-", "subtract")):
        return a - b
    return a * b


def test_arithmetic_answers_are_correct(items):
    arithmetic = [it for it in items if it["kind"] == "arithmetic"]
    assert len(arithmetic) > 100
    for it in arithmetic:
        match = re.search(r"(\d+) (plus|minus|times) (\d+) is (\d+)\.", it["reply"])
        assert match, it["reply"]
        a, op, b, c = int(match[1]), match[2], int(match[3]), int(match[4])
        assert c == {"plus": a + b, "minus": a - b, "times": a * b}[op]
        assert c == _expected_answer(it["prompt"]), it


def test_split_is_deterministic_disjoint_and_by_prompt(items):
    train, heldout = split_corpus(items, heldout_fraction=0.05, seed=0)
    assert (train, heldout) == split_corpus(items, heldout_fraction=0.05, seed=0)
    assert len(train) + len(heldout) == len(items)
    assert 0.04 * len(items) <= len(heldout) <= 0.07 * len(items)
    assert not {it["prompt"] for it in train} & {it["prompt"] for it in heldout}
    assert split_corpus(items, seed=1)[1] != heldout


def test_sample_prompts(items):
    prompts = sample_prompts(seed=3, n=200)
    assert prompts == sample_prompts(seed=3, n=200)
    assert len(prompts) == 200 and len(set(prompts)) > 100
    train, _ = split_corpus(items)
    train_prompts = {it["prompt"] for it in train}
    novel = [p for p in prompts if p not in train_prompts]
    assert 0 < len(novel) < len(prompts)  # mostly familiar, some new to the model
    only_math = sample_prompts(seed=3, n=20, kinds=["arithmetic"])
    assert all(re.search(r"\d", p) for p in only_math)
    with pytest.raises(ValueError, match="unknown kind"):
        sample_prompts(seed=0, n=1, kinds=["poetry"])
