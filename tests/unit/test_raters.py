"""Simulated raters, rank correlation, the target rule and the baselines' data helpers of
`reinf bench learn` (no model load).

None of this needs the optional ``bench`` extra (trl, datasets, matplotlib, scipy): only
the comparison with scipy skips without it, and a meta-test runs this file with the
extra hidden to keep it that way.
"""
from __future__ import annotations

import builtins
import os
import random
import subprocess
import sys
import types

import pytest
from conftest import clean_env

from reinf.bench.aggregate import ratings_to_target
from reinf.bench.baselines import build_kto_rows, kto_weights
from reinf.bench.plot import build_svg
from reinf.demo.corpus import detect_styles, generate_corpus
from reinf.errors import BadInput
from reinf.bench.probe import rank, spearman
from reinf.bench.raters import NAMES, check_rating, load_rater


@pytest.fixture(scope="module")
def items():
    return generate_corpus(seed=3, n=400)


@pytest.mark.parametrize("name, dimension, value", [
    ("prefers-terse", "length", "terse"), ("prefers-chatty", "length", "chatty"),
    ("prefers-bullets", "format", "bulleted"), ("prefers-plain", "format", "plain"),
    ("dislikes-questions", "question", False)])
def test_builtin_raters_follow_the_corpus_styles(items, name, dimension, value):
    rater = load_rater(name)
    scores = [rater(it["prompt"], it["reply"]) for it in items]
    for it, score in zip(items, scores):
        liked = it["styles"][dimension] == value  # the corpus's own label, not the detector
        assert score == (5 if liked else 1), (name, it["reply"])
        assert rater.is_preferred(it["reply"], score) is liked
    assert 0.4 < scores.count(5) / len(scores) < 0.6  # the corpus is balanced


def test_the_noisy_rater_is_right_80_percent_of_the_time_and_seeded(items):
    replies = [it["reply"] for it in items] * 5
    truth = [5 if detect_styles(r)["length"] == "terse" else 1 for r in replies]
    first = [load_rater("noisy", seed=4)("p", r) for r in replies[:1]]
    rater = load_rater("noisy", seed=4)
    scores = [rater("p", r) for r in replies]
    again = load_rater("noisy", seed=4)
    assert [again("p", r) for r in replies] == scores       # a fresh rater replays its noise
    other = load_rater("noisy", seed=5)
    assert [other("p", r) for r in replies] != scores
    right = sum(s == t for s, t in zip(scores, truth)) / len(scores)
    assert 0.76 < right < 0.84
    assert set(scores) == {1, 5} and first[0] == scores[0]
    # The preferred style is the truth, whatever the noise says.
    assert all(rater.is_preferred(r, 1) == (t == 5) for r, t in zip(replies[:50], truth))


def test_every_builtin_name_loads():
    for name in NAMES:
        assert load_rater(name).name == name


def test_a_rater_file_is_loaded_by_path_and_function(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text("def rate(prompt, reply):\n    return 4 if 'Paris' in reply else 2\n\n"
                    "def strict(prompt, reply):\n    '''Only Paris.'''\n    return 5\n"
                    "strict.preferred = lambda reply: 'Paris' in reply\n")
    plain = load_rater(str(path))
    assert plain("q", "Paris.") == 4 and plain("q", "Rome.") == 2
    assert plain.is_preferred("Rome.", 4) and not plain.is_preferred("Paris.", 2)  # rated 4-5
    strict = load_rater(f"{path}:strict")
    assert strict.name == "mine.py:strict" and strict.description == "Only Paris."
    assert strict("q", "Rome.") == 5 and not strict.is_preferred("Rome.", 5)


@pytest.mark.parametrize("source, words", [
    ("def rate(prompt, reply):\n    return 6\n", "returned 6"),
    ("def rate(prompt, reply):\n    return 4.5\n", "whole number"),
    ("def rate(prompt, reply):\n    return True\n", "returned True"),
    ("def rate(prompt, reply):\n    return 1 / 0\n", None),
    ("def rate(prompt, reply)\n    return 3\n", "line 1"),
    ("x = 1\n", "no function 'rate'"),
])
def test_a_broken_rater_file_says_what_is_wrong(tmp_path, source, words):
    path = tmp_path / "bad.py"
    path.write_text(source)
    with pytest.raises((BadInput, ZeroDivisionError)) as info:
        load_rater(str(path))("q", "a reply")
    if words:
        assert words in str(info.value)


@pytest.mark.parametrize("spec", ["prefers-nothing", "missing.py:rate", "x.txt:rate"])
def test_an_unknown_rater_is_refused_with_the_choices(tmp_path, spec):
    with pytest.raises(BadInput) as info:
        load_rater(str(tmp_path / spec) if spec.startswith("missing") else spec)
    assert "prefers-terse" in str(info.value) or "not found" in str(info.value)


def test_check_rating_accepts_integer_types_only():
    import numpy as np

    assert check_rating(np.int64(3), "r") == 3
    for bad in (0, 6, 2.0, "5", None, False):
        with pytest.raises(BadInput):
            check_rating(bad, "r")


def test_spearman_matches_scipy_with_ties():
    scipy_stats = pytest.importorskip("scipy.stats", reason="needs the bench extra (scipy)")
    rng = random.Random(0)
    for _ in range(20):
        x = [rng.random() for _ in range(30)]
        y = [rng.choice([1, 2, 5]) for _ in range(30)]
        assert spearman(x, y) == pytest.approx(scipy_stats.spearmanr(x, y).statistic)


def test_spearman_matches_the_definition_with_ties():
    assert rank([3, 1, 3, 2]) == [3.5, 1.0, 3.5, 2.0]
    # Pearson's r of the ranks, worked by hand: ranks (1, 2.5, 2.5, 4) vs (1, 2, 3, 4).
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(4.5 / (4.5 * 5) ** 0.5)
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [5, 5, 5]) is None and spearman([1, 2], [1, 2]) is None


def test_the_spearman_ceiling_is_what_a_perfect_untied_predictor_scores():
    from reinf.training.rating_model import spearman_ceiling

    assert spearman_ceiling([1, 2, 3, 4, 5]) == pytest.approx(1.0)       # no ties: 1
    for p in (0.5, 0.8):  # two values, a share p high: sqrt(3 p (1 - p)) in the limit
        y = [5] * int(1000 * p) + [1] * int(1000 * (1 - p))
        assert spearman_ceiling(y) == pytest.approx((3 * p * (1 - p)) ** 0.5, abs=2e-3)
        # a predictor that ranks every pair of unequal ratings right reaches it exactly
        noisy = [s + i * 1e-6 for i, s in enumerate(y)]
        assert spearman(noisy, y) == pytest.approx(spearman_ceiling(y))
    assert spearman_ceiling([5, 5, 5]) is None


def test_ratings_to_target_uses_the_rolling_window():
    assert ratings_to_target([1, 1, 5, 5, 5, 5], window=4, target=4.0) == 5
    assert ratings_to_target([1, 1, 5, 5, 5, 5], window=4, target=4.5) == 6
    assert ratings_to_target([5, 5, 5, 5], window=4, target=4.0) == 4
    assert ratings_to_target([5, 5], window=4, target=4.0) == 2  # shorter than a window
    assert ratings_to_target([1, 5, 1, 5, 1], window=2, target=4.0) is None


def test_held_target_must_last_to_the_end():
    lucky = [1, 5, 5, 1, 1, 1, 5, 5, 5, 5]         # one lucky early window, then for real
    assert ratings_to_target(lucky, window=2, target=4.0) == 3
    assert ratings_to_target(lucky, window=2, target=4.0, held=True) == 8
    assert ratings_to_target([5, 5, 5, 1], window=2, target=4.0, held=True) is None
    assert ratings_to_target([5, 5, 5, 5], window=2, target=4.0, held=True) == 2


def test_kto_rows_drop_threes_and_label_by_score():
    class Tok:
        def decode(self, ids, skip_special_tokens=False):
            return "<" + ",".join(map(str, ids)) + ">"

    class S:
        def __init__(self, score, ids):
            self.score, self.prompt_ids, self.response = score, ids, f"reply {score}"
    kept = [(S(score, [score, 9]), None) for score in (1, 2, 3, 4, 5)] + [(S(5, []), None)]
    rows = build_kto_rows(kept, Tok(), seed=0)
    assert sorted((r["completion"], r["label"], r["prompt"]) for r in rows) == [
        ("reply 1", False, "<1,9>"), ("reply 2", False, "<2,9>"), ("reply 4", True, "<4,9>"),
        ("reply 5", True, "<5,9>")]
    assert build_kto_rows(kept, Tok(), seed=0) == rows  # the shuffle is seeded


def test_kto_weights_balance_the_larger_class():
    rows = [{"label": True}] * 6 + [{"label": False}] * 2
    assert kto_weights(rows) == (pytest.approx(2 / 6), 1.0)
    assert kto_weights([{"label": False}] * 3 + [{"label": True}]) == (1.0, pytest.approx(1 / 3))
    assert kto_weights([{"label": True}] * 3) == (1.0, 1.0)


def test_the_svg_fallback_draws_a_line_per_method():
    data = {"reinf": {"label": "Reinf (PPO)", "x": [0, 10, 20], "mean": [2.5, 3.5, 4.5],
                      "kl": [0.0, 0.01, 0.02]},
            "sft": {"label": "reward-weighted SFT", "x": [0, 10, 20], "mean": [2.5, 2.6, 3.0],
                    "kl": [0.0, 0.002, 0.004]}}
    svg = build_svg(data, {"rater": {"name": "prefers-terse"}})
    assert svg.startswith("<svg") and svg.count("<polyline") == 4
    assert "Reinf (PPO)" in svg and "reward-weighted SFT" in svg


def test_kto_without_trl_names_the_bench_extra(invoke, monkeypatch):
    # datasets is checked first: stand it in, so the message names trl with or without
    # the bench extra installed.
    monkeypatch.setitem(sys.modules, "datasets", types.ModuleType("datasets"))
    real_import = builtins.__import__

    def no_trl(name, *args, **kwargs):
        if name == "trl" or name.startswith("trl."):
            raise ImportError("No module named 'trl'", name="trl")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_trl)
    result = invoke("bench", "learn", "--ratings", "4", "--baselines", "kto")
    assert result.exit_code == 1
    assert 'pip install -e ".[bench]"' in result.output and "trl" in result.output


HIDE_BENCH_EXTRA = """
import importlib.abc, sys
import pytest

BENCH = ("trl", "datasets", "matplotlib", "scipy")

class HideBench(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BENCH:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, HideBench())
sys.exit(pytest.main(sys.argv[1:]))
"""


@pytest.mark.skipif(os.environ.get("REINF_BENCH_HIDDEN") == "1", reason="already hidden")
def test_this_file_passes_without_the_bench_extra(home):
    """Run this file with trl, datasets, matplotlib and scipy unimportable (as when the
    extra is not installed): everything passes but the one comparison with scipy."""
    proc = subprocess.run(
        [sys.executable, "-c", HIDE_BENCH_EXTRA, __file__, "-q", "-rs", "-p", "no:cacheprovider"],
        env=clean_env(home, REINF_BENCH_HIDDEN="1"), capture_output=True, text=True,
        timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    skipped = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert len(skipped) == 2, out  # the scipy comparison, and this test itself
    assert any("test_raters.py" in line and "bench extra (scipy)" in line for line in skipped)
