"""Simulated raters for ``reinf bench learn``: ``(prompt, reply) -> int`` in 1..5.

Each built-in rater is a plain function that knows nothing about the model.

**The demo raters** read a reply's style with ``reinf.demo.corpus.detect_styles`` (the demo
corpus's three style dimensions, documented in models/README.md) and give 5 to a reply in
the preferred style and 1 to any other, so the mean rating of a window is
``1 + 4 x (share of preferred replies)``:

| name | rates 5 | rates 1 |
| --- | --- | --- |
| prefers-terse | terse replies (body of at most 15 words) | chatty ones |
| prefers-chatty | chatty replies | terse ones |
| prefers-bullets | bulleted replies (a line starting "- ", "* " or "• ") | plain ones |
| prefers-plain | plain replies | bulleted ones |
| dislikes-questions | replies that do not end with "?" | replies ending with a closing question |
| noisy | as prefers-terse, but 20% of its ratings are flipped (5 <-> 1), seeded | |

**The raters over real text** (``reinf.bench.text_raters``, where each rule is described)
grade any reply on the whole scale: length-graded, bullets, no-question-back,
no-exclamation, answer-first, formal, casual, gives-example, arithmetic, context-length,
and ``noisy-graded`` (as length-graded, but 10% of its ratings off by one, seeded).

``TUNED_ON`` lists the raters that were used to choose Reinf's defaults (``kl_loss_coef``,
RLOO; bullets, gives-example and no-question-back the real model's style learning), whose
probe figures were read while comparing settings (length-graded and formal, on the real
model), or that were written to choose the rating model's features (the file raters);
``DERIVED`` those that rate by a tuned rater's rule; ``REWRITE_TUNED_ON`` those whose runs
with rewrites chose how rewrites are imitated (tuned only in a run with rewrites). Every
other one is *unseen*, and the report says which (``"unseen"``).

``--rater path/to/file.py:function`` loads any function with the same signature. It may
carry a ``preferred(prompt, reply) -> bool`` (or ``preferred(reply)``) attribute; without
one, the report's "preferred share" is the share of replies the rater rated 4 or 5.
"""
from __future__ import annotations

import importlib.util
import inspect
import operator
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from reinf.bench.text_raters import (BEST, REWRITERS, TEXT_RATERS, BestFn, RewriteFn,
                                     rate_length_graded)
from reinf.demo.corpus import detect_styles
from reinf.errors import BadInput

RaterFn = Callable[[str, str], int]
PreferredFn = Callable[[str, str], bool]          # (prompt, reply) -> in the preferred style?
NOISE = 0.2   # the noisy rater is right 80% of the time
SLIP = 0.1    # the noisy-graded rater is off by one 10% of the time
# The raters used to choose the defaults: kl_loss_coef (0.05, measured on all seven) and
# RLOO over GAE (prefers-terse and no_bang_q), docs/benchmarks.md. length_graded and
# no_bang_q are the two in docs/benchmarks/tuning_raters.py, named as --rater names them.
# length-graded and formal: the real model's settings sweep on a GPU (learning rate, epochs,
# KL penalty, rollouts, LoRA targets; docs/benchmarks.md, "On a GPU") read their probe and
# chose smollm2-135m's GPU round (catalog.KnownModel.gpu_settings). The last six file raters
# were written to choose the rating model's features and how it sees the prompt (reinf bench
# rating-model); together, a style the model seldom writes, to choose training.imitate_rated.
# bullets and gives-example: the style learning smollm2-135m has by default
# (catalog.STYLE_LEARNING) was built and its settings chosen reading their runs, and
# no-question-back's was read to decide to turn it on (docs/benchmarks.md, "Learning styles
# by default").
TUNED_ON = ("prefers-terse", "prefers-chatty", "prefers-bullets", "prefers-plain",
            "dislikes-questions", "tuning_raters.py:length_graded", "tuning_raters.py:no_bang_q",
            "length-graded", "formal", "tuning_raters.py:second_person",
            "tuning_raters.py:short_sentences", "tuning_raters.py:with_numbers",
            "tuning_raters.py:plain_words", "tuning_raters.py:you_for_advice",
            "tuning_raters.py:numbers_when_counting", "tuning_raters.py:together",
            "bullets", "gives-example", "no-question-back")
# The raters whose runs with rewrites (--rewrite-every) were read to choose how rewrites are
# imitated (training.rewrite_imitation_rule; every round, once, until likely: arithmetic's
# held-out perplexity and bullets' probe, docs/benchmarks.md). A run of theirs with rewrites
# is not unseen; one on ratings alone still is, since that choice does not touch it.
REWRITE_TUNED_ON = ("arithmetic", "bullets")
# rate with a tuned rater's rule, so they are not unseen either
# (casual is 6 minus formal's rating: to the rating model, the same task mirrored)
DERIVED = {"noisy": "prefers-terse", "noisy-graded": "length-graded", "casual": "formal"}


@dataclass
class Rater:
    """A rater and what the report needs to know about it."""
    name: str
    rate: RaterFn                                  # (prompt, reply) -> 1..5
    preferred: PreferredFn | None                  # is a reply in the preferred style?
    description: str
    unseen: bool = True                            # never used to choose a default
    # what the simulated person writes instead of a reply it dislikes (--rewrite-every):
    # (prompt, reply) -> the rewrite, or None where an edit of the reply cannot meet the rule
    rewrite: RewriteFn | None = None
    # the best rating any reply to a prompt can get (None: 5 for every prompt); a rater
    # neutral outside its kind of prompt gives 3 there whatever the reply
    best: BestFn | None = None

    def __call__(self, prompt: str, reply: str) -> int:
        return check_rating(self.rate(prompt, reply), self.name)

    def best_score(self, prompt: str) -> int:
        return 5 if self.best is None else self.best(prompt)

    def is_preferred(self, reply: str, score: int, *, prompt: str = "") -> bool:
        """In the preferred style (``preferred``), or rated 4-5 (a rater without one)."""
        if self.preferred is None:
            return score >= 4
        return bool(self.preferred(prompt, reply))


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


def is_unseen(name: str, *, rewrites: bool = False) -> bool:
    """Never used to choose a default (with ``rewrites``: nor how rewrites are imitated)."""
    tuned = TUNED_ON + (REWRITE_TUNED_ON if rewrites else ())
    return name not in tuned and DERIVED.get(name) not in tuned


# --- the demo raters --------------------------------------------------------------------------

def _style_rater(dimension: str, value) -> tuple[RaterFn, PreferredFn]:
    def preferred(prompt: str, reply: str) -> bool:
        return detect_styles(reply)[dimension] == value

    def rate(prompt: str, reply: str) -> int:
        return 5 if preferred(prompt, reply) else 1
    return rate, preferred


def _build_noisy(seed: int) -> Rater:
    rate_terse, terse = _style_rater("length", "terse")
    rng = random.Random(f"noisy-rater-{seed}")

    def rate(prompt: str, reply: str) -> int:
        score = rate_terse(prompt, reply)
        return 6 - score if rng.random() < NOISE else score
    return Rater("noisy", rate, terse, "prefers terse replies, but 20% of its ratings are "
                 "flipped (5 <-> 1) at random (seeded)", unseen=is_unseen("noisy"))


STYLE_RATERS: dict[str, tuple[str, object, str]] = {
    "prefers-terse": ("length", "terse", "5 for a terse reply, 1 for a chatty one"),
    "prefers-chatty": ("length", "chatty", "5 for a chatty reply, 1 for a terse one"),
    "prefers-bullets": ("format", "bulleted", "5 for a bulleted reply, 1 for a plain one"),
    "prefers-plain": ("format", "plain", "5 for a plain reply, 1 for a bulleted one"),
    "dislikes-questions": ("question", False, "1 for a reply ending with a question, else 5"),
}

def _build_noisy_graded(seed: int) -> Rater:
    rng = random.Random(f"noisy-graded-rater-{seed}")

    def rate(prompt: str, reply: str) -> int:
        score = rate_length_graded(prompt, reply)
        if rng.random() < SLIP:
            score += 1 if score == 1 else -1 if score == 5 else rng.choice((-1, 1))
        return score

    def preferred(prompt: str, reply: str) -> bool:
        return rate_length_graded(prompt, reply) >= 4
    return Rater("noisy-graded", rate, preferred, "as length-graded, but 10% of its ratings "
                 "are off by one at random (seeded)", unseen=is_unseen("noisy-graded"),
                 rewrite=REWRITERS["length-graded"])


NAMES = tuple(STYLE_RATERS) + ("noisy",) + tuple(TEXT_RATERS) + ("noisy-graded",)


def load_rater(spec: str, *, seed: int = 0) -> Rater:
    """A built-in rater by name, or ``path/to/file.py:function``. Each call gives a fresh
    rater (a noisy one restarts its seeded random stream)."""
    spec = (spec or "").strip()
    if spec == "noisy":
        return _build_noisy(seed)
    if spec == "noisy-graded":
        return _build_noisy_graded(seed)
    if spec in STYLE_RATERS:
        dimension, value, text = STYLE_RATERS[spec]
        rate, preferred = _style_rater(dimension, value)
        return Rater(spec, rate, preferred, text, unseen=is_unseen(spec))
    if spec in TEXT_RATERS:
        rate, text = TEXT_RATERS[spec]
        return Rater(spec, rate, None, text, unseen=is_unseen(spec), rewrite=REWRITERS.get(spec),
                     best=BEST.get(spec))
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
    rater_name = f"{path.name}:{function}"
    return Rater(rater_name, fn, _preferred_of(fn), (fn.__doc__ or "").strip().split("\n")[0]
                 or f"{function} from {path}", unseen=is_unseen(rater_name))


def _preferred_of(fn) -> PreferredFn | None:
    """A file rater's ``preferred`` attribute as (prompt, reply) -> bool: one that takes the
    reply alone (the older form) is called with the reply."""
    preferred = getattr(fn, "preferred", None)
    if not callable(preferred):
        return None
    try:
        params = [p for p in inspect.signature(preferred).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    if len(params) == 1:
        return lambda prompt, reply: preferred(reply)
    return preferred


def _line_in(exc: BaseException, path: Path) -> int | None:
    if isinstance(exc, SyntaxError):
        return exc.lineno
    tb, line = exc.__traceback__, None
    while tb is not None:
        if Path(tb.tb_frame.f_code.co_filename).resolve() == path:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line
