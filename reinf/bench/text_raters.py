"""The raters over real text for ``reinf bench learn``: rules that grade any reply 1..5.

They grade any reply on the whole scale, and an empty reply gets 1 from each. Words are
runs of letters and digits; code blocks do not count as prose.

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
- ``gives-example``: 5 for "for example", "e.g.", "for instance", 4 for a code block, 3 for
  "such as", 1 for none; for a code prompt, 5 for a code block, 3 for inline code or an
  example phrase, 2 for "such as", 1 for none.
- ``arithmetic``: for an a + b, a - b or a * b prompt (parsed from its text), 5 when the
  reply states the right number, 1 a wrong one, 2 none; any other prompt a neutral 3.
- ``context-length``: a question of fact (``classify_prompt``, the rater's own rules) 5 up to
  40 words, 1 beyond 140; a how-to 5 for 80+ words or 3+ steps, down to 1 under 15 words;
  any other prompt a neutral 3.
- ``noisy-graded`` (built in reinf.bench.raters from length-graded): as length-graded, but
  10% of its ratings are off by one (seeded), like a person.

The arithmetic and context-length raters rate a prompt outside their kind a neutral 3:
they only pull where they have an opinion, and their preferred share (rated 4-5) counts
only those prompts as preferred.

Each is a plain ``(prompt, reply) -> int`` function; ``TEXT_RATERS`` names them for
``--rater`` (``reinf.bench.raters.load_rater``).
"""
from __future__ import annotations

import functools
import operator
import re
from typing import Callable

RaterFn = Callable[[str, str], int]


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


TEXT_RATERS: dict[str, tuple[RaterFn, str]] = {  # name -> (rate, what it rewards)
    "length-graded": (rate_length_graded, "by length: 5 up to 30 words, 4 up to 60, 3 up to "
                                          "100, 2 up to 160, 1 beyond"),
    "bullets": (rate_bullets, "5 for a list of 3+ items, 4 for 2, 2 for 1, 1 for none"),
    "no-question-back": (rate_no_question_back, "1 for a reply ending with a question, 2 for "
                                                "one mid-reply, else 4-5"),
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


# --- the simulated person's rewrites (reinf bench learn --rewrite-every) ----------------------
# What a person with the rater's preference would write instead of a reply it dislikes:
# an edit of the model's own reply toward the rule, never new content (a person who wants a
# list turns the sentences into one; one who wants no question back deletes it). None where
# such an edit cannot satisfy the rule (a missing example, a register, an order).

RewriteFn = Callable[[str, str], "str | None"]


def rewrite_as_list(prompt: str, reply: str) -> str | None:
    """The reply's sentences as a bulleted list (8 at most); None for fewer than two."""
    parts = sentences(prose(reply))
    return "\n".join(f"- {s.lstrip('-*• ')}" for s in parts[:8]) if len(parts) >= 2 else None


def rewrite_without_bang(prompt: str, reply: str) -> str | None:
    """Every "!" made a full stop."""
    text = _BANG.sub(".", reply)
    return text if text != reply else None


def rewrite_without_question(prompt: str, reply: str) -> str | None:
    """The reply with its questions deleted; None when nothing else is left."""
    kept = [s for s in sentences(prose(reply)) if not s.rstrip("\"')*_ ").endswith("?")]
    return " ".join(kept) or None


def _shortened(reply: str, words: int) -> str | None:
    """The reply's first sentences up to ``words`` words (the first one cut there if it is
    longer); None when it is that short already."""
    if count_words(reply) <= words:
        return None
    out: list[str] = []
    for s in sentences(prose(reply)):
        if count_words(" ".join(out + [s])) > words:
            break
        out.append(s)
    if not out:
        out = [" ".join(prose(reply).split()[:words]).rstrip(",;:") + "."]
    return " ".join(out)


def rewrite_shorter(prompt: str, reply: str) -> str | None:
    """The reply cut to its first sentences, 30 words at most."""
    return _shortened(reply, LENGTH_BANDS[0])


def rewrite_right_sum(prompt: str, reply: str) -> str | None:
    """The right number, stated, for an arithmetic prompt."""
    truth = arithmetic_answer(prompt)
    if truth is None:
        return None
    return f"The answer is {int(truth) if float(truth).is_integer() else round(truth, 6)}."


def rewrite_for_context(prompt: str, reply: str) -> str | None:
    """A question of fact: the reply cut to 40 words. Nothing for other prompts (a fuller
    how-to would need new content)."""
    return _shortened(reply, FACT_BANDS[0]) if classify_prompt(prompt) == "fact" else None


REWRITERS: dict[str, RewriteFn] = {
    "length-graded": rewrite_shorter, "bullets": rewrite_as_list,
    "no-question-back": rewrite_without_question, "no-exclamation": rewrite_without_bang,
    "arithmetic": rewrite_right_sum, "context-length": rewrite_for_context,
}


# --- the best rating a prompt allows ------------------------------------------------------

BestFn = Callable[[str], int]


def best_arithmetic(prompt: str) -> int:
    """5 for an arithmetic prompt; any other gets the neutral 3 whatever the reply."""
    return 5 if arithmetic_answer(prompt) is not None else 3


def best_context_length(prompt: str) -> int:
    """5 for a question of fact or a how-to; any other prompt gets the neutral 3."""
    return 5 if classify_prompt(prompt) in ("fact", "howto") else 3


# The raters whose best is not 5 for every prompt. A probe's mean of these is the highest
# mean rating any model could get on it (reinf bench learn reports it beside the rise goal):
# on the built-in probe, 3.25 for arithmetic (8 of 64 prompts are sums).
BEST: dict[str, BestFn] = {"arithmetic": best_arithmetic,
                           "context-length": best_context_length}

