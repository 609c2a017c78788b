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
| prefers-bullets | bulleted replies (a line starting "- ") | plain ones |
| prefers-plain | plain replies | bulleted ones |
| dislikes-questions | replies that do not end with "?" | replies ending with a closing question |
| noisy | as prefers-terse, but 20% of its ratings are flipped (5 <-> 1), seeded | |

**The raters over real text** grade any reply on the whole scale, and an empty reply gets
1 from each. Words are runs of letters and digits; code blocks do not count as prose.

- ``length-graded``: 5 up to 30 words, 4 up to 60, 3 up to 100, 2 up to 160, 1 beyond.
- ``bullets``: a bulleted or numbered list: 5 for 3+ items, 4 for 2, 2 for 1, 1 for none.
- ``no-question-back``: 1 when the reply ends with a question, 2 for a question to the user
  ("you") mid-reply, 4 for a rhetorical one, 5 for none.
- ``no-exclamation``: 5 without "!", 3 with one, 2 with two, 1 with three or more.
- ``answer-first``: 1 for a preamble ("Great question", "I'd be happy to", "As an AI"), 2
  for "Sure!" as a sentence of its own, 3 for "Sure, ..." then the answer, 4 for a lead-in
  ("Here's ..."), 5 when the first sentence answers.
- ``formal``: contractions, slang and emoji per 100 words: 5 for none, 4, 3, 2 up to 2, 5
  and 10, 1 beyond. ``casual`` is its mirror (6 minus formal's rating).
- ``gives-example``: 5 for "for example", "e.g.", "for instance" (a code block, for a code
  prompt), 3 for "such as" (inline code or an example phrase, for a code prompt), 1 for none.
- ``arithmetic``: for an a + b, a - b or a * b prompt (parsed from its text), 5 when the
  reply states the right number, 1 a wrong one, 2 none; any other prompt a neutral 3.
- ``context-length``: a question of fact (``classify_prompt``, the rater's own rules) 5 up to
  40 words, 1 beyond 140; a how-to 5 for 80+ words or 3+ steps, down to 1 under 15 words;
  any other prompt a neutral 3.
- ``noisy-graded``: as length-graded, but 10% of its ratings are off by one (seeded), like
  a person.

The arithmetic and context-length raters rate a prompt outside their kind a neutral 3:
they only pull where they have an opinion, and their preferred share (rated 4-5) counts
only those prompts as preferred.

``TUNED_ON`` lists the raters that were used to choose Reinf's defaults (``kl_loss_coef``,
RLOO); every other one is *unseen*, and the report says which (``"unseen"``).

``--rater path/to/file.py:function`` loads any function with the same signature. It may
carry a ``preferred(prompt, reply) -> bool`` (or ``preferred(reply)``) attribute; without
one, the report's "preferred share" is the share of replies the rater rated 4 or 5.
"""
from __future__ import annotations

import functools
import importlib.util
import inspect
import operator
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from reinf.demo.corpus import detect_styles
from reinf.errors import BadInput

RaterFn = Callable[[str, str], int]
PreferredFn = Callable[[str, str], bool]          # (prompt, reply) -> in the preferred style?
NOISE = 0.2   # the noisy rater is right 80% of the time
SLIP = 0.1    # the noisy-graded rater is off by one 10% of the time
# The raters used to choose the defaults: kl_loss_coef (0.05, measured on all seven) and
# RLOO over GAE (prefers-terse and no_bang_q), docs/benchmarks.md. length_graded and
# no_bang_q are the two in docs/benchmarks/tuning_raters.py, named as --rater names them.
TUNED_ON = ("prefers-terse", "prefers-chatty", "prefers-bullets", "prefers-plain",
            "dislikes-questions", "tuning_raters.py:length_graded", "tuning_raters.py:no_bang_q")
DERIVED = {"noisy": "prefers-terse"}   # rates with a tuned rater's rule, so it is not unseen


@dataclass
class Rater:
    """A rater and what the report needs to know about it."""
    name: str
    rate: RaterFn                                  # (prompt, reply) -> 1..5
    preferred: PreferredFn | None                  # is a reply in the preferred style?
    description: str
    unseen: bool = True                            # never used to choose a default

    def __call__(self, prompt: str, reply: str) -> int:
        return check_rating(self.rate(prompt, reply), self.name)

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


def is_unseen(name: str) -> bool:
    return name not in TUNED_ON and DERIVED.get(name) not in TUNED_ON


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

# --- reading real text ---------------------------------------------------------------------------

_WORD = re.compile(r"[^\W_]+(?:['\u2019][^\W_]+)*")
_FENCE = re.compile(r"```.*?(?:```|\Z)", re.S)
_INLINE = re.compile(r"`[^`\n]+`")
_INDENTED = re.compile(r"(?:^(?: {4}|\t)\S.*\n?){2,}", re.M)
_LIST_ITEM = re.compile(r"^[ \t]*(?:[-*+\u2022]|\d{1,2}[.)])[ \t]+\S", re.M)
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+|\n+")


def count_words(text: str) -> int:
    return len(_WORD.findall(text))


def prose(text: str) -> str:
    """The text without code: fenced blocks and inline code removed."""
    return _INLINE.sub(" ", _FENCE.sub("\n", text))


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(text.strip()) if s and s.strip()]


def list_items(text: str) -> int:
    """Lines that are items of a bulleted or numbered list (outside code blocks)."""
    return len(_LIST_ITEM.findall(_FENCE.sub("\n", text)))


def _graded(value: float, bands: tuple[float, float, float, float]) -> int:
    """5 up to bands[0], 4 up to bands[1], ... 1 beyond bands[3]."""
    return next((5 - i for i, top in enumerate(bands) if value <= top), 1)


def _nonempty(fn: RaterFn) -> RaterFn:
    """An empty reply gets 1 from every rater over real text."""
    @functools.wraps(fn)
    def rate(prompt: str, reply: str) -> int:
        return fn(prompt, reply) if reply.strip() else 1
    return rate


# --- the raters over real text ------------------------------------------------------------------

LENGTH_BANDS = (30, 60, 100, 160)


@_nonempty
def rate_length_graded(prompt: str, reply: str) -> int:
    """Shorter is better, on the whole scale: 5 up to 30 words, 1 beyond 160."""
    return _graded(count_words(reply), LENGTH_BANDS)


@_nonempty
def rate_bullets(prompt: str, reply: str) -> int:
    """Likes a list: 5 for 3+ items, 4 for 2, 2 for 1, 1 for none."""
    return (1, 2, 4, 5)[min(3, list_items(reply))]


_TO_USER = re.compile(r"\b(?:you|your|yours|you['\u2019](?:d|re|ll|ve))\b", re.I)


@_nonempty
def rate_no_question_back(prompt: str, reply: str) -> int:
    """Dislikes a reply that asks the user a question: 1 if it ends with one, 2 if it asks
    one mid-reply, 4 for a rhetorical question only, 5 for none."""
    asked = [s for s in sentences(prose(reply)) if s.rstrip("\"')*_ ").endswith("?")]
    if not asked:
        return 5
    if prose(reply).rstrip("\"')*_ \n").endswith("?"):
        return 1
    return 2 if any(_TO_USER.search(s) for s in asked) else 4


_BANG = re.compile(r"!(?!=)")


@_nonempty
def rate_no_exclamation(prompt: str, reply: str) -> int:
    """Dislikes "!": 5 without any, 3 with one, 2 with two, 1 with three or more."""
    return (5, 3, 2, 1)[min(3, len(_BANG.findall(prose(reply))))]


_STRONG_PREAMBLE = re.compile(
    r"(?:(?:what|that['\u2019]?s|that is) an? (?:\w+ )?question|(?:great|good|excellent|"
    r"interesting|fantastic|wonderful|lovely) question|i(?:['\u2019]d| would) (?:be )?"
    r"(?:happy|glad|delighted|love) to|happy to help|thanks? (?:you )?for (?:asking|your "
    r"question|the question))", re.I)
_AS_AN_AI = re.compile(r"\bas an ai\b|\bas a (?:large )?language model\b|"
                       r"\bi(?:['\u2019]m| am) (?:just |only )?an ai\b", re.I)
_MILD_PREAMBLE = re.compile(
    r"(?:sure(?: thing)?|certainly|of course|absolutely|okay|ok|alright|all right|well|great|"
    r"(?:hello|hi|hey)(?: there)?|oh|ah|hmm+|no problem)\s*(?:[,!.:;\u2014\u2013]|-\s|$)", re.I)
_LEAD_IN = re.compile(r"(?:here['\u2019]s|here is|here are|let me|let['\u2019]s)\b", re.I)
_GREETING = re.compile(r"\W*(?:hi|hello|hey|yo|howdy|greetings|good (?:morning|afternoon|"
                       r"evening|night))\b", re.I)


@_nonempty
def rate_answer_first(prompt: str, reply: str) -> int:
    """Likes a first sentence that answers: 1 for a preamble ("Great question", "I'd be
    happy to", "As an AI"), 2 for "Sure!" as a sentence of its own, 3 for "Sure, ..." then
    content, 4 for a lead-in ("Here's ..."), 5 straight to the answer. A greeting back is
    no preamble when the prompt greets."""
    text = prose(reply).strip().lstrip("#*>_\"' \t")
    first, *rest = sentences(text) or [""]
    if (_STRONG_PREAMBLE.search(first) or _AS_AN_AI.search(first)
            or (rest and _STRONG_PREAMBLE.match(rest[0]))):
        return 1
    mild = _MILD_PREAMBLE.match(text)
    if mild and not (_GREETING.match(prompt) and _GREETING.match(text)):
        return 2 if not first[mild.end():].strip(" ,.!:;-") else 3
    return 4 if _LEAD_IN.match(text) else 5


_CONTRACTION = re.compile(
    r"\b[^\W\d_]+['\u2019](?:t|re|ve|ll|d|m)\b|\b(?:it|that|there|here|what|who|where|how|"
    r"let|he|she|everything|nothing|something)['\u2019]s\b", re.I)
_SLANG = re.compile(r"\b(?:gonna|wanna|gotta|kinda|sorta|yeah|yep|yup|nope|nah|lol|lmao|omg|"
                    r"btw|tbh|imo|dude|awesome|stuff|ya|hey|guys|totally)\b", re.I)
_EMOJI = re.compile("[\U0001F000-\U0001FAFF\u2600-\u27BF]|(?<!\\w)[:;]-?[)(DPp](?!\\w)|!{2,}")
FORMAL_BANDS = (0, 2, 5, 10)   # informal markers per 100 words


def informal_rate(reply: str) -> float:
    """Contractions, slang and emoji (and "!!") per 100 words (at least 20 words counted)."""
    text = prose(reply)
    markers = sum(len(p.findall(text)) for p in (_CONTRACTION, _SLANG, _EMOJI))
    return 100 * markers / max(20, count_words(text))


@_nonempty
def rate_formal(prompt: str, reply: str) -> int:
    """Formal register: 5 with no contraction, slang or emoji; 4, 3, 2 up to 2, 5, 10 of
    them per 100 words; 1 beyond."""
    return _graded(informal_rate(reply), FORMAL_BANDS)


@_nonempty
def rate_casual(prompt: str, reply: str) -> int:
    """Casual register, the mirror of formal: 6 minus formal's rating."""
    return 6 - rate_formal(prompt, reply)


_CODE_PROMPT = re.compile(
    r"\b(?:python|javascript|typescript|java|sql|bash|shell|regex|regular expression|"
    r"functions?|script|code|git|css|html|rust|docker|api|compiler?|exception|class|loop|"
    r"variable|linux|node\.js|react|json|http|unit test|recursion|closure|linked list|"
    r"hash table|big o|thread|tcp|udp|virtual environment|tuple|array|commit|query|div)\b|"
    r"\bin (?:go|c|c\+\+)\b", re.I)
_EXAMPLE = re.compile(r"\bfor example\b|\bfor instance\b|\be\.g\.|\bexamples?\b|"
                      r"\bto illustrate\b|\bsay you\b|\bsuppose\b", re.I)
_SOFT_EXAMPLE = re.compile(r"\bsuch as\b|\blike this\b|\bincluding\b", re.I)


def is_code_prompt(prompt: str) -> bool:
    return bool(_CODE_PROMPT.search(prompt))


@_nonempty
def rate_gives_example(prompt: str, reply: str) -> int:
    """Likes an example. A code prompt: 5 for a code block, 3 for inline code or an example
    phrase, 2 for "such as", 1 for none. Others: 5 for "for example", "e.g.", "for
    instance", 4 for a code block, 3 for "such as", 1 for none."""
    block = bool(_FENCE.search(reply) or _INDENTED.search(reply))
    text = prose(reply)
    said, soft = bool(_EXAMPLE.search(text)), bool(_SOFT_EXAMPLE.search(text))
    if is_code_prompt(prompt):
        return 5 if block else 3 if said or _INLINE.search(reply) else 2 if soft else 1
    return 5 if said else 4 if block else 3 if soft else 1


_NUM = r"(?<![\w.])(-?\d+(?:\.\d+)?)"
_END = r"(?![\d.]*\d|\s*(?:[+*\u00d7\u00b7\u2212x-]|plus|minus|times)\s*\d)"
_SUMS = [  # (pattern, operator); "r-": the second number minus the first
    (re.compile(_NUM + r"\s*([+*\u00d7\u00b7\u2212-])\s*" + _NUM + _END), None),
    (re.compile(_NUM + r"\s+x\s+" + _NUM + _END, re.I), "*"),
    (re.compile(_NUM + r"\s+(plus|minus|times|multiplied by)\s+" + _NUM + _END, re.I), None),
    (re.compile(r"\b(?:add|sum of|total of)\s+" + _NUM + r"\s+(?:and|to|plus)\s+" + _NUM
                + _END, re.I), "+"),
    (re.compile(r"\bdo\s+" + _NUM + r"\s+and\s+" + _NUM + r"\s+add up\b", re.I), "+"),
    (re.compile(r"\bsubtract\s+" + _NUM + r"\s+from\s+" + _NUM + _END, re.I), "r-"),
    (re.compile(r"\bdifference between\s+" + _NUM + r"\s+and\s+" + _NUM + _END, re.I), "-"),
    (re.compile(r"\bmultiply\s+" + _NUM + r"\s+(?:by|and|with)\s+" + _NUM + _END, re.I), "*"),
    (re.compile(r"\bproduct of\s+" + _NUM + r"\s+and\s+" + _NUM + _END, re.I), "*"),
]
_OPS = {"+": operator.add, "plus": operator.add, "-": operator.sub, "\u2212": operator.sub,
        "minus": operator.sub, "*": operator.mul, "\u00d7": operator.mul,
        "\u00b7": operator.mul, "times": operator.mul, "multiplied by": operator.mul,
        "r-": lambda a, b: b - a}


def parse_arithmetic(prompt: str) -> tuple[float, str, float] | None:
    """(a, operator, b) of a "what is a + b"-style prompt (+, -, * in symbols or words),
    or None. ``"r-"`` means b - a ("subtract a from b")."""
    for pattern, op in _SUMS:
        m = pattern.search(prompt)
        if m and _OPERATOR_BEFORE.search(prompt[max(0, m.start() - 12):m.start()]):
            return None                     # the end of a chain, "2 + 3 + 4": not checked
        if m:
            groups = m.groups()
            a, b = float(groups[0]), float(groups[-1])
            return a, op or groups[1].lower(), b
    return None


def arithmetic_answer(prompt: str) -> float | None:
    parsed = parse_arithmetic(prompt)
    return None if parsed is None else _OPS[parsed[1]](parsed[0], parsed[2])


_REPLY_NUM = re.compile(r"(?<![\w.,])[-\u2212]?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\d)|"
                        r"(?<![\w.,])[-\u2212]?\d+(?:\.\d+)?")
_CUE = re.compile(r"(?:=|\bis|\bequals?|\bmakes?|\bgives?|\bgets?|\bleaves?|['\u2019]s|"
                  r"\bresults?(?: is)?:?|\banswer(?: is)?:?|\btotal(?: is)?:?)\s*[*_]*\s*"
                  r"(?:about |exactly |just )?$", re.I)
_OPERATOR_BEFORE = re.compile(r"(?:[+*\u00d7\u00b7/\u00f7\u2212-]|(?<!\w)x|"
                              r"\b(?:plus|minus|times|by|and|from))\s*$", re.I)
_OPERATOR_NEXT = re.compile(r"\s*(?:[+*\u00d7\u00b7/\u00f7\u2212x-]\s*\d|(?:plus|minus|times|"
                            r"multiplied|divided|and)\s+\d)", re.I)


def stated_number(reply: str) -> float | None:
    """The number a reply gives as its answer: the first one after a cue ("= N", "is N",
    "makes N", "the answer: N", ...), else the first one; a number inside an expression
    ("17 + 25", "subtract 5 from 9") is not an answer."""
    reply = reply.replace("**", "").replace("__", "")      # markdown bold around a number
    found = [(m, reply[:m.start()]) for m in _REPLY_NUM.finditer(reply)
             if not _OPERATOR_NEXT.match(reply, m.end())
             and not _OPERATOR_BEFORE.search(reply[max(0, m.start() - 12):m.start()])]
    cued = [m for m, before in found if _CUE.search(before[-40:])]
    m = (cued or [m for m, _ in found] or [None])[0]
    if m is None:
        return None
    return float(m.group().replace(",", "").replace("\u2212", "-"))


@_nonempty
def rate_arithmetic(prompt: str, reply: str) -> int:
    """Checks the sum: for an a + b, a - b or a * b prompt, 5 if the reply states the right
    number, 1 a wrong one, 2 none. Any other prompt: a neutral 3."""
    truth = arithmetic_answer(prompt)
    if truth is None:
        return 3
    stated = stated_number(reply)
    if stated is None:
        return 2
    return 5 if abs(stated - truth) < 1e-9 else 1


_HOWTO = re.compile(
    r"(?:(?:can|could) you (?:tell me |show me |explain )?|please )?(?:how (?:do|can|should|"
    r"would|could) (?:i|we|you|one)\b|how to\b|what(?:['\u2019]s| is| are) (?:the |some )?"
    r"(?:best |easiest |right |proper )?(?:ways?|steps) (?:to|for)\b|(?:the )?steps? (?:to|for)"
    r"\b|walk me through|show me how|explain how|teach me|give me (?:the )?steps|guide me)",
    re.I)
_FACT = re.compile(
    r"(?:(?:do you know|can you tell me|quick question[^:?]*:|roughly|approximately|so|and)"
    r"\s*)?(?:who|what|when|where|which|"
    r"whose|how (?:many|much|far|long|tall|big|old|fast|deep|high|heavy)|in (?:which|what)|"
    r"is|are|was|were|does|did|tell me (?:the|who|what|when|where|how many))\b", re.I)
_OPINION = re.compile(r"\b(?:you|your|think|best|favou?rite|should|opinion|better|worse|"
                      r"recommend|advice|tips?|feel|worth|good idea|okay|rude|acceptable|"
                      r"overrated|underrated|greatest|beautiful|prefer|good|bad|crazy|"
                      r"too late|matters?|really|could|can i|help)\b", re.I)


def classify_prompt(prompt: str) -> str | None:
    """"howto" when a sentence asks how to do something, "fact" when one asks a question of
    fact (who, what, when, how many, is ... ?) with no opinion words, else None."""
    parts = sentences(prompt)
    if any(_HOWTO.match(s) for s in parts):
        return "howto"
    if any(_FACT.match(s) and not _OPINION.search(s) for s in parts):
        return "fact"
    return None


FACT_BANDS = (40, 60, 90, 140)


@_nonempty
def rate_context_length(prompt: str, reply: str) -> int:
    """Short for a factual question (5 up to 40 words, 1 beyond 140), fuller for a how-to (5
    for 80+ words or 3+ steps, 4 for 50+ words or 2 steps, 3 for 30+, 2 for 15+, else 1);
    a neutral 3 for other prompts. The prompt is classified from its text
    (``classify_prompt``)."""
    kind, words = classify_prompt(prompt), count_words(reply)
    if kind == "fact":
        return _graded(words, FACT_BANDS)
    if kind == "howto":
        steps = list_items(reply)
        return (5 if steps >= 3 or words >= 80 else 4 if steps == 2 or words >= 50
                else 3 if words >= 30 else 2 if words >= 15 else 1)
    return 3


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
                 "are off by one at random (seeded)", unseen=is_unseen("noisy-graded"))


TEXT_RATERS: dict[str, tuple[RaterFn, str]] = {
    "length-graded": (rate_length_graded, "by length: 5 up to 30 words, 4 up to 60, 3 up to "
                                          "100, 2 up to 160, 1 beyond"),
    "bullets": (rate_bullets, "5 for a list of 3+ items, 4 for 2, 2 for 1, 1 for none"),
    "no-question-back": (rate_no_question_back, "1 for a reply ending with a question to the "
                                                "user, 2 for one mid-reply, else 4-5"),
    "no-exclamation": (rate_no_exclamation, "5 without '!', 3 with one, 2 with two, 1 with more"),
    "answer-first": (rate_answer_first, "5 when the first sentence answers, 1 for a preamble "
                                        "('Great question', 'As an AI')"),
    "formal": (rate_formal, "5 with no contraction, slang or emoji, down to 1 with many"),
    "casual": (rate_casual, "the mirror of formal: 5 with many contractions, slang or emoji"),
    "gives-example": (rate_gives_example, "5 for an example (a code block for code prompts), "
                                          "1 for none"),
    "arithmetic": (rate_arithmetic, "a + b, a - b, a * b prompts: 5 for the right number, 1 "
                                    "for a wrong one; 3 for other prompts"),
    "context-length": (rate_context_length, "short for factual questions (<= 40 words), fuller "
                                            "for how-to (80+ words or 3+ steps); 3 for others"),
}
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
        return Rater(spec, rate, None, text, unseen=is_unseen(spec))
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
