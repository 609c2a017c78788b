"""Simulated raters for ``reinf bench learn``: ``(prompt, reply) -> int`` in 1..5.

The built-in raters read a reply's style with ``reinf.demo.corpus.detect_styles`` (the demo
corpus's three style dimensions, documented in models/README.md) and give 5 to a reply in
the preferred style and 1 to any other, so the mean rating of a window is
``1 + 4 x (share of preferred replies)``:

| name | rates 5 | rates 1 |
| --- | --- | --- |
| prefers-terse | terse replies (body of at most 15 words) | chatty ones |
| prefers-chatty | chatty replies | terse ones |
| prefers-bullets | bulleted replies (a line starting "- ") | plain ones |
| prefers-plain | plain replies | bulleted ones |
| dislikes-questions | replies that do not end with "?" | replies ending with a closing question |
| noisy | as prefers-terse, but 20% of its ratings are flipped (5 <-> 1), seeded | |

``--rater path/to/file.py:function`` loads any function with the same signature. It may
carry a ``preferred(reply) -> bool`` attribute; without one, the report's "preferred
share" is the share of replies the rater rated 4 or 5.
"""
from __future__ import annotations

import importlib.util
import operator
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from reinf.demo.corpus import detect_styles
from reinf.errors import BadInput

RaterFn = Callable[[str, str], int]
NOISE = 0.2  # the noisy rater is right 80% of the time


@dataclass
class Rater:
    """A rater and what the report needs to know about it."""
    name: str
    rate: RaterFn                                  # (prompt, reply) -> 1..5
    preferred: Callable[[str], bool] | None        # is a reply in the preferred style?
    description: str

    def __call__(self, prompt: str, reply: str) -> int:
        return check_rating(self.rate(prompt, reply), self.name)

    def is_preferred(self, reply: str, score: int) -> bool:
        """In the preferred style (built-ins), or rated 4-5 (a rater without ``preferred``)."""
        return bool(self.preferred(reply)) if self.preferred is not None else score >= 4


def check_rating(value, name: str) -> int:
    """The rater's answer as an int 1..5 (numpy integers too), or BadInput naming the rater."""
    try:
        score = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        score = None
    if score is None or not 1 <= score <= 5:
        raise BadInput(f"rater {name} returned {value!r}; a rating must be a whole number "
                       "from 1 to 5", fix="make the rater return an int 1..5")
    return int(score)


# --- the built-ins ---------------------------------------------------------------------------

def _style_rater(dimension: str, value) -> tuple[RaterFn, Callable[[str], bool]]:
    def preferred(reply: str) -> bool:
        return detect_styles(reply)[dimension] == value

    def rate(prompt: str, reply: str) -> int:
        return 5 if preferred(reply) else 1
    return rate, preferred


def _build_noisy(seed: int) -> Rater:
    rate_terse, terse = _style_rater("length", "terse")
    rng = random.Random(f"noisy-rater-{seed}")

    def rate(prompt: str, reply: str) -> int:
        score = rate_terse(prompt, reply)
        return 6 - score if rng.random() < NOISE else score
    return Rater("noisy", rate, terse, "prefers terse replies, but 20% of its ratings are "
                 "flipped (5 <-> 1) at random (seeded)")


BUILTINS: dict[str, tuple[str, object, str]] = {
    "prefers-terse": ("length", "terse", "5 for a terse reply, 1 for a chatty one"),
    "prefers-chatty": ("length", "chatty", "5 for a chatty reply, 1 for a terse one"),
    "prefers-bullets": ("format", "bulleted", "5 for a bulleted reply, 1 for a plain one"),
    "prefers-plain": ("format", "plain", "5 for a plain reply, 1 for a bulleted one"),
    "dislikes-questions": ("question", False, "1 for a reply ending with a question, else 5"),
}
NAMES = tuple(BUILTINS) + ("noisy",)


def load_rater(spec: str, *, seed: int = 0) -> Rater:
    """A built-in rater by name, or ``path/to/file.py:function``. Each call gives a fresh
    rater (the noisy one restarts its seeded random stream)."""
    spec = (spec or "").strip()
    if spec == "noisy":
        return _build_noisy(seed)
    if spec in BUILTINS:
        dimension, value, text = BUILTINS[spec]
        rate, preferred = _style_rater(dimension, value)
        return Rater(spec, rate, preferred, text)
    return load_rater_file(spec)


def load_rater_file(spec: str) -> Rater:
    """``path/to/file.py:function`` (``file.py`` alone means its ``rate`` function)."""
    path_text, sep, function = spec.rpartition(":")
    if not sep or not function.isidentifier():
        path_text, function = spec, "rate"
    if not path_text.endswith(".py"):
        raise BadInput(f"unknown rater {spec!r}",
                       fix="use one of " + ", ".join(NAMES) + ", or path/to/file.py:function")
    path = Path(path_text).expanduser().resolve()
    if not path.is_file():
        raise BadInput(f"rater file {path} not found", fix="check the path in --rater")
    name = f"reinf_rater_{abs(hash(str(path)))}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the person's file: one line, where it broke
        sys.modules.pop(name, None)
        line = _line_in(exc, path)
        raise BadInput(f"rater file {path}{f', line {line}' if line else ''}: "
                       f"{type(exc).__name__}: {exc}", fix="fix the file and run again") from None
    fn = getattr(module, function, None)
    if not callable(fn):
        raise BadInput(f"rater file {path} has no function {function!r}",
                       fix=f"define {function}(prompt, reply) -> int 1..5, or name it after "
                           "the colon")
    preferred = getattr(fn, "preferred", None)
    return Rater(f"{path.name}:{function}", fn, preferred if callable(preferred) else None,
                 (fn.__doc__ or "").strip().split("\n")[0] or f"{function} from {path}")


def _line_in(exc: BaseException, path: Path) -> int | None:
    if isinstance(exc, SyntaxError):
        return exc.lineno
    tb, line = exc.__traceback__, None
    while tb is not None:
        if Path(tb.tb_frame.f_code.co_filename).resolve() == path:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line
