"""Automatic critics: score a reply without a human, and combine with the person's reward.

A critic is a plain function ``(prompt, response, metadata) -> float`` in [-1, 1]: +1 means
"good by this measure", -1 "bad", 0 "no opinion". The built-in ones read their settings
from ``metadata["settings"]`` (the rewards section of the config), so a custom critic in the
hook file has exactly the same inputs. Critics are off until config gives one a weight.
"""
from __future__ import annotations

import math
import re
from typing import Callable, Mapping

Critic = Callable[[str, str, dict], float]
COMBINES = ("weighted_average", "min", "consensus")
REPEAT_N = 3          # n of the n-grams the repetition critic counts
# Characters a finished sentence or block may end with.
_ENDINGS = set('.!?…:;)]}"\'`*»”’>|~') | {"\u3002", "\uff01", "\uff1f"}
_LIST_ITEM = re.compile(r"^\s*(?:[-*+•]|\d+[.)])\s+\S")
_WORD = re.compile(r"\w+|[^\w\s]")


def critic_length(prompt: str, response: str, metadata: dict) -> float:
    """+1 at ``length_target_chars``, 0 at half or double it, -1 at a quarter or four times.

    Symmetric in log scale because "twice as long" and "half as long" are equally far off.
    """
    target = float(metadata["settings"]["length_target_chars"])
    chars = len(response.strip())
    if chars == 0:
        return -1.0
    return _clip(1.0 - abs(math.log2(chars / target)))


def critic_repetition(prompt: str, response: str, metadata: dict) -> float:
    """+1 when no word n-gram repeats; falls linearly to -1 when half of them are repeats.

    The repeated n-gram ratio is 1 - distinct/total over word trigrams (punctuation counts
    as a word). Ordinary prose stays under ~0.05; a model stuck in a loop goes far above 0.25.
    """
    words = _WORD.findall(response.lower())
    grams = [tuple(words[i:i + REPEAT_N]) for i in range(len(words) - REPEAT_N + 1)]
    if not grams:
        return 1.0 if words else -1.0
    ratio = 1.0 - len(set(grams)) / len(grams)
    return _clip(1.0 - 4.0 * ratio)


def format_problems(response: str) -> list[str]:
    """What the format critic objects to, in words (empty list: nothing)."""
    text = response.strip()
    if not text:
        return ["empty reply"]
    problems = []
    if text.count("```") % 2:
        problems.append("unclosed code fence")
    elif not _ends_cleanly(text):
        problems.append("ends mid-sentence")
    prose = re.sub(r"```.*?```", "", text, flags=re.S)  # code may hold unpaired brackets
    for open_, close in ("()", "[]", "{}"):
        if prose.count(open_) != prose.count(close):
            problems.append(f"unbalanced {open_}{close}")
            break
    return problems


def critic_format(prompt: str, response: str, metadata: dict) -> float:
    """+1 for a reply that is well-formed; -1 for an empty one or one cut off mid-sentence
    or mid-code-block; -0.5 for unbalanced brackets alone."""
    problems = format_problems(response)
    if not problems:
        return 1.0
    if any(p in ("empty reply", "ends mid-sentence", "unclosed code fence") for p in problems):
        return -1.0
    return -0.5


def _ends_cleanly(text: str) -> bool:
    last_line = text.splitlines()[-1]
    if text.endswith("```") or _LIST_ITEM.match(last_line):
        return True  # a closed code block or a list item needs no full stop
    last = text[-1]
    return last in _ENDINGS or not (last.isalnum() or last in ",-–(")  # emoji, symbols: fine


BUILTIN: dict[str, Critic] = {
    "length": critic_length,
    "repetition": critic_repetition,
    "format": critic_format,
}


def enabled(weights: Mapping[str, float]) -> dict[str, float]:
    """The critics that are on: weight > 0, in config order."""
    return {name: float(w) for name, w in weights.items() if w > 0}


def combine(human: float, critics: Mapping[str, float], weights: Mapping[str, float],
            mode: str, human_weight: float = 1.0) -> tuple[float, bool]:
    """The reward from the human reward and the enabled critics' values, and whether the
    sample is kept.

    - ``weighted_average``: (human_weight·h + Σ wᵢ·cᵢ) / (human_weight + Σ wᵢ).
    - ``min``: the most pessimistic of h and the critics.
    - ``consensus``: h, kept only when no critic has the opposite sign to h. A 0 on either
      side is "no opinion" and never vetoes, so a score-3 rating (h = 0) is always kept.

    With no critic enabled every mode gives h, kept.
    """
    if mode not in COMBINES:
        raise ValueError(f"critic_combine must be one of {', '.join(COMBINES)}, got {mode!r}")
    values = {name: critics[name] for name in weights if weights[name] > 0}
    if not values:
        return human, True
    if mode == "weighted_average":
        total = human_weight + sum(weights[n] for n in values)
        return (human_weight * human + sum(weights[n] * v for n, v in values.items())) / total, True
    if mode == "min":
        return min([human, *values.values()]), True
    return human, all(v * human >= 0 for v in values.values())


def _clip(x: float) -> float:
    return max(-1.0, min(1.0, x))
