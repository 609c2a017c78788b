"""`reinf bench rating-model` on the demo model, small: the report is well formed, its figures
are the ones the study defines, and bad input is one clear line."""
from __future__ import annotations

import json

import pytest
import trainkit as tk

pytestmark = pytest.mark.e2e
restore_threads = pytest.fixture(autouse=True)(tk.threads_restored)


def test_the_study_reports_each_rater_by_number_of_ratings(invoke):
    result = invoke("bench", "rating-model", "--model", "reinf-demo", "--rater",
                    "prefers-terse,unseen", "--prompts", "16", "--replies", "3", "--ratings",
                    "4,8", "--draws", "2", "--pairs-every", "2", "--threads", "1", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["prompts"] == 16 and report["replies_per_prompt"] == 3
    assert 0 < report["replies"] <= 48 and report["ratings"] == [4, 8]
    raters = report["raters"]
    assert list(raters)[0] == "prefers-terse" and raters["prefers-terse"]["unseen"] is False
    assert "arithmetic" in raters and raters["arithmetic"]["unseen"] is True  # `unseen` expanded
    assert "bullets" not in raters  # read to build the real model's style learning
    assert "casual" not in raters                                     # formal mirrored
    assert "length-graded" not in raters                             # a tuning rater is not
    for name, r in raters.items():
        assert set(r["by_ratings"]) == {"4", "8"}, name
        for f in r["by_ratings"].values():
            assert 0 <= f["all_alike"] <= 1
            assert set(f["with_pairs"]) == set(f) - {"with_pairs"}  # the same figures
            if f["within_prompt_accuracy"] is not None:
                assert 0 <= f["within_prompt_accuracy"] <= 1 and f["pairs"] > 0
            if f["weighted_accuracy"] is not None:
                assert 0 <= f["weighted_accuracy"] <= 1 and f["pairs"] > 0
                assert 0 <= f["push_share"] <= f["weighted_accuracy"]
            if f["spearman"] is not None and f["ceiling"] is not None:
                assert -1 <= f["spearman"] <= 1 and 0 < f["ceiling"] <= 1


@pytest.mark.parametrize("args, words", [
    (("--ratings", "8,20", "--prompts", "12"), "must exceed the largest --ratings (20)"),
    (("--ratings", "eight"), "--ratings takes a comma list"),
    (("--rater", "nobody"), "unknown rater 'nobody'"),
    (("--prompts", "400"), "training-side prompts"),  # more would repeat texts on both sides
])
def test_bad_input_is_one_line_with_the_fix(invoke, args, words):
    result = invoke("bench", "rating-model", "--model", "reinf-demo", *args)
    assert result.exit_code != 0
    assert words in result.output and "Traceback" not in result.output
