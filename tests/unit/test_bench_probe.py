"""reinf.bench.probe's general-text passages: the data file the general-text perplexity
reads (the figure itself is checked on the demo model in tests/e2e/test_bench_general_text.py)."""
from __future__ import annotations

import json
from collections import Counter
from importlib import resources


def passages() -> list[dict]:
    text = resources.files("reinf.bench").joinpath("data", "general_text.jsonl").read_text(
        encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_the_general_text_is_plain_prose_of_eight_kinds():
    items = passages()
    assert len(items) == 64
    assert set(Counter(i["kind"] for i in items).values()) == {8}
    for item in items:
        words = len(item["text"].split())
        assert 80 <= words <= 180, (words, item["text"][:60])
        # not written in any assistant style: no list, heading or bold
        assert "\n- " not in item["text"] and "**" not in item["text"]
        assert not item["text"].lstrip().startswith(("-", "#", "1."))
