"""Synthetic conversation corpus for the built-in demo model (docs/design.md §8).

Every question is answered in one of eight styles: length (terse | chatty) x format
(plain | bulleted) x closing question (yes | no). The styles are balanced exactly, so the
demo model learns to produce all of them at roughly equal rates, and a rater's preference
(simulated or human) has something to pull on. ``detect_styles`` reads the styles back from
any reply, including imperfect model output; models/README.md documents its rules.

The style is made visible in the first tokens where possible: chatty replies open with a
friendly phrase, bulleted replies open with a short lead line followed by "- " bullets, and
terse plain replies start straight with the answer. A policy-gradient learner can then shift
the style by moving the probability of a handful of early tokens.

Vocabulary is deliberately small (a few hundred words) so a ~1M parameter model can learn it.
"""

from __future__ import annotations

import itertools
import random
import re

KINDS = ("greeting", "fact", "arithmetic", "definition", "advice")
#: The order in which question groups take their kind. Arithmetic gets 5 of 12 groups: it has
#: the most topics (110 operand pairs, versus 7 greetings, 45 facts, 30 words, 20 advice
#: topics) and it is the one skill a tiny model learns slowly (it must look up a table, not
#: copy a sentence). Kinds need not be balanced; styles within each kind are.
KINDS_CYCLE = ("arithmetic", "fact", "arithmetic", "definition", "arithmetic", "advice",
               "arithmetic", "fact", "greeting", "definition", "arithmetic", "advice")
LENGTHS = ("terse", "chatty")
FORMATS = ("plain", "bulleted")
QUESTIONS = (False, True)
#: Every style combination, in a fixed order; the corpus cycles through them.
STYLE_COMBOS = tuple(
    {"length": length, "format": fmt, "question": q}
    for length, fmt, q in itertools.product(LENGTHS, FORMATS, QUESTIONS)
)
#: A reply whose body (without bullet markers and the closing question) has at most this many
#: words is terse. Corpus terse bodies have <= 12 words and chatty bodies >= 18, so the rule has
#: a margin on both sides for model output.
TERSE_MAX_WORDS = 15

# --- Style phrases ------------------------------------------------------------------------

# Each style is decided at one token with two equally likely values (e.g. "In" of "In short:"
# versus the answer's first word), and each phrase list has at most two entries. With many
# variants the probability mass of a style is spread over many tokens, and sampling at
# temperature < 1 then favours the style with the fewest variants; a balanced corpus would
# give unbalanced samples.
OPENERS = ("Great question!", "Happy to help!")
CHATTY_LEAD = "Here are the key points:"
TERSE_LEAD = "In short:"
CLOSERS = ("Anything else you'd like to know?", "Anything else I can help with?")
GREETING_CLOSER = "How can I help you today?"

from reinf.demo.topics import (ADVICE, CAPITAL_PROMPTS, CAPITALS, DEFINITION_PROMPTS, DEFINITIONS,  # noqa: F401
                           FACTS, GREETINGS, OP_PAIRS, OPS)


def _build_topics() -> dict[str, list[tuple]]:
    """Every question the corpus can ask, by kind: (prompts, main, detail, detail, opener)."""
    topics: dict[str, list[tuple]] = {
        "greeting": [(prompts, main, d1, d2, opener)
                     for prompts, opener, main, d1, d2 in GREETINGS],
        "fact": [(tuple(t.format(x=country) for t in CAPITAL_PROMPTS),
                  f"The capital of {country} is {city}.", d1, d2, None)
                 for country, city, d1, d2 in CAPITALS]
        + [(prompts, main, d1, d2, None) for prompts, main, d1, d2 in FACTS],
        "definition": [(tuple(t.format(x=word) for t in DEFINITION_PROMPTS), main, d1, d2, None)
                       for word, main, d1, d2 in DEFINITIONS],
        # Terse advice replies give the first tip, chatty ones add the others.
        "advice": [(prompts, t1, t2, t3, None) for prompts, t1, t2, t3 in ADVICE],
        "arithmetic": [],
    }
    for op, (fn, templates, d1, d2) in OPS.items():
        for a, b in OP_PAIRS[op]:
            c = fn(a, b)
            prompts = tuple(t.format(a=a, b=b) for t in templates)
            detail = d1.format(a=a, b=b, c=c)
            topics["arithmetic"].append((prompts, f"{a} {op} {b} is {c}.", detail, d2, None))
    return topics


TOPICS = _build_topics()


class _TopicDeck:
    """Draws topics of each kind without replacement (reshuffling when exhausted), so every
    topic (every fact, every arithmetic pair) is covered before any repeats."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.decks: dict[str, list[tuple]] = {kind: [] for kind in KINDS}

    def draw(self, kind: str) -> tuple[str, str, str, str, str | None]:
        """One question of ``kind``: (prompt, main, detail, detail, chatty opener or None)."""
        if kind not in TOPICS:
            raise ValueError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
        if not self.decks[kind]:
            self.decks[kind] = list(TOPICS[kind])
            self.rng.shuffle(self.decks[kind])
        prompts, main, d1, d2, opener = self.decks[kind].pop()
        return self.rng.choice(prompts), main, d1, d2, opener


def render_reply(kind: str, main: str, details: tuple[str, str], styles: dict,
                 rng: random.Random, opener: str | None = None) -> str:
    """Compose a reply in the given styles from a main sentence and two detail sentences."""
    opener = opener or rng.choice(OPENERS)
    if styles["length"] == "terse":
        if styles["format"] == "bulleted":
            body = f"{TERSE_LEAD}\n- {main}"
        else:
            body = main
    else:
        # One or two details, but always enough words to keep a clear gap from terse bodies.
        n_details = 1 if rng.random() < 0.5 else 2
        if n_details == 1 and _count_words(" ".join([opener, main, details[0]])) < 19:
            n_details = 2
        sentences = [main, *details[:n_details]]
        if styles["format"] == "bulleted":
            body = f"{opener} {CHATTY_LEAD}\n" + "\n".join(f"- {s}" for s in sentences)
        else:
            body = " ".join([opener, *sentences])
    if styles["question"]:
        closer = GREETING_CLOSER if kind == "greeting" else rng.choice(CLOSERS)
        body += ("\n" if styles["format"] == "bulleted" else " ") + closer
    return body


def generate_corpus(seed: int = 0, n: int | None = None) -> list[dict]:
    """Return ``n`` (default 8000) conversation items, deterministic for ``seed``.

    Items come in groups of eight: one question answered in each of the eight style
    combinations. Per-question balance matters: with styles drawn at random, a small model
    memorises each prompt's accidental style mix instead of learning that every style is
    equally likely. Kinds follow ``KINDS_CYCLE``; within each kind every style combination
    occurs equally often (exactly, when ``n`` is a multiple of 8).
    """
    n = 8000 if n is None else n
    rng = random.Random(seed)
    deck = _TopicDeck(rng)
    items: list[dict] = []
    group = 0
    while len(items) < n:
        kind = KINDS_CYCLE[group % len(KINDS_CYCLE)]
        prompt, main, d1, d2, opener = deck.draw(kind)
        for styles in STYLE_COMBOS[:n - len(items)]:
            reply = render_reply(kind, main, (d1, d2), styles, rng, opener)
            items.append({"kind": kind, "prompt": prompt, "reply": reply, "styles": dict(styles)})
        group += 1
    rng.shuffle(items)
    return items


def split_corpus(items: list[dict], heldout_fraction: float = 0.05,
                 seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Split into (train, heldout) deterministically, by prompt text.

    All items with the same prompt land on the same side, so the training split keeps each
    prompt's balanced style mix and held-out prompts are new to the model (the held-out
    slice measures fluency on unseen questions). Prompts are taken in a seeded order until
    the held-out slice holds ``heldout_fraction`` of the items.
    """
    prompts = sorted({it["prompt"] for it in items})
    random.Random(f"split-{seed}").shuffle(prompts)
    counts: dict[str, int] = {}
    for it in items:
        counts[it["prompt"]] = counts.get(it["prompt"], 0) + 1
    target = len(items) * heldout_fraction
    held: set[str] = set()
    taken = 0
    for prompt in prompts:
        if taken >= target:
            break
        held.add(prompt)
        taken += counts[prompt]
    train = [it for it in items if it["prompt"] not in held]
    heldout = [it for it in items if it["prompt"] in held]
    return train, heldout


def sample_prompts(seed: int, n: int,
                   kinds: list[str] | tuple[str, ...] | None = None) -> list[str]:
    """Prompts for simulated chats, from the corpus distribution (kinds drawn round-robin).

    Topics are covered evenly (as in the corpus) with a random paraphrase each; the prompt
    space (topics x paraphrases) is larger than the training split, so some prompts are new
    to the model. The seed is offset so that ``sample_prompts(0, ...)`` does not replay the
    draws of ``generate_corpus(0)``.
    """
    kinds = tuple(kinds or KINDS)
    deck = _TopicDeck(random.Random(f"prompts-{seed}"))
    return [deck.draw(kinds[i % len(kinds)])[0] for i in range(n)]


# --- Style detection ----------------------------------------------------------------------

_WORD = re.compile(r"[A-Za-z0-9']+")
_BULLET = re.compile(r"^[ \t]*[-*\u2022][ \t]+", re.MULTILINE)


def _count_words(text: str) -> int:
    return len(_WORD.findall(text))


def detect_styles(reply: str) -> dict:
    """Classify a reply's styles; the rules are documented in models/README.md.

    - question: the reply, stripped, ends with "?" (a closing question).
    - format: "bulleted" if any line starts with "- " (or "* ", "• "), else "plain".
    - length: count words (runs of letters, digits and apostrophes) in the body, i.e. the reply
      without its closing question (the last sentence, when ``question``) and without bullet
      markers; "terse" if at most TERSE_MAX_WORDS, else "chatty".
    """
    text = reply.strip()
    question = text.endswith("?")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    bulleted = any(_BULLET.match(ln) for ln in lines)
    body = text
    if question:
        # Drop the closing question: everything after the last sentence end or line break
        # before the final "?". What remains is the answer itself.
        cut = max(body.rfind(sep, 0, len(body) - 1) for sep in (". ", "! ", "? ", "\n"))
        body = body[:cut + 1] if cut >= 0 else ""
    words = _count_words(_BULLET.sub("", body))
    return {
        "length": "terse" if words <= TERSE_MAX_WORDS else "chatty",
        "format": "bulleted" if bulleted else "plain",
        "question": question,
    }
