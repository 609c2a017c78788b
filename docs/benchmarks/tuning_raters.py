"""File raters used to choose the defaults (kl_loss_coef, RLOO) and the rating model: tuning
data, so never reported as unseen (reinf.bench.raters.TUNED_ON). Run with
``--rater docs/benchmarks/tuning_raters.py:length_graded``."""


def length_graded(prompt, reply):
    """Shorter is better, graded: 5 up to 10 words, 1 beyond 50."""
    n = len(reply.split())
    return 5 if n <= 10 else 4 if n <= 20 else 3 if n <= 35 else 2 if n <= 50 else 1


def no_bang_q(prompt, reply):
    """Dislikes '!' and '?': 5 without any, 2 points off each."""
    c = reply.count("!") + reply.count("?")
    return max(1, 5 - 2 * c)


# Four raters over real text, written to choose the rating model's features (reinf bench
# rating-model) without reading the unseen raters: tuning data too (TUNED_ON). Two more,
# prompt-dependent, at the end of the file.

def _words(reply):
    return [w.strip(".,;:!?()[]\"'*`") for w in reply.split() if w.strip(".,;:!?()[]\"'*`")]


def second_person(prompt, reply):
    """Likes replies that speak to the reader: 'you'/'your' 3+ times 5, none 1."""
    n = sum(w.lower() in ("you", "your", "you're", "yours", "yourself") for w in _words(reply))
    return 5 if n >= 3 else 4 if n == 2 else 3 if n == 1 else 1


def short_sentences(prompt, reply):
    """Likes short sentences: mean words a sentence up to 10 is 5, over 24 is 1."""
    parts = [s for s in reply.replace("!", ".").replace("?", ".").split(".") if s.strip()]
    if not parts:
        return 1
    mean = sum(len(s.split()) for s in parts) / len(parts)
    return 5 if mean <= 10 else 4 if mean <= 14 else 3 if mean <= 18 else 2 if mean <= 24 else 1


def with_numbers(prompt, reply):
    """Likes concrete figures: two or more numbers 5, one 4, none 2."""
    n = sum(any(c.isdigit() for c in w) for w in reply.split())
    return 5 if n >= 2 else 4 if n == 1 else 2


def plain_words(prompt, reply):
    """Likes short, plain words: mean word length up to 4.2 letters 5, over 5.4 is 1."""
    words = _words(reply)
    if not words:
        return 1
    mean = sum(len(w) for w in words) / len(words)
    return 5 if mean <= 4.2 else 4 if mean <= 4.6 else 3 if mean <= 5.0 else 2 if mean <= 5.4 else 1


# Two raters whose rule depends on the kind of prompt, written to choose how the rating model
# sees the prompt (reinf bench rating-model) without reading the unseen context-length rater:
# tuning data too (TUNED_ON).

_ADVICE = ("how do", "how can", "how should", "should i", "any tips", "tips", "advice", "help me",
           "what should", "can i", "how to")
_COUNTING = ("how many", "how much", "how long", "how old", "how far", "what year", "when ",
             "what is", "what's")


def you_for_advice(prompt, reply):
    """Advice and how-to prompts: likes replies that speak to the reader ('you' twice or more
    5, none 1). Any other prompt: the opposite (none 5, twice or more 1)."""
    n = sum(w.lower() in ("you", "your", "you're", "yours", "yourself") for w in _words(reply))
    level = 5 if n >= 2 else 3 if n == 1 else 1
    return level if any(k in prompt.lower() for k in _ADVICE) else 6 - level


def numbers_when_counting(prompt, reply):
    """Prompts that ask for a quantity or a fact: likes figures (two or more numbers 5, none 1).
    Any other prompt: likes words, not figures (no number 5, two or more 1)."""
    n = sum(any(c.isdigit() for c in w) for w in reply.split())
    level = 5 if n >= 2 else 3 if n == 1 else 1
    return level if any(k in prompt.lower() for k in _COUNTING) else 6 - level


# A style the model seldom writes, for training.imitate_rated (imitating the best-rated
# replies), whose case is a liked style that shows up only now and then: tuning data too
# (TUNED_ON). Of 80 replies SmolLM2-135M-Instruct sampled to training-side prompts
# (temperature 0.7), 8 said "we", "let's", "us" or "our" (5 of them working a sum: "To add 6
# and 7, we need..."), 72 none of them. It is not the unseen bullets rater's axis: none of
# those 8 was a list.

_TOGETHER = ("we", "let's", "us", "our", "ours", "ourselves", "we'll", "we're", "we've")


def together(prompt, reply):
    """Likes replies that work through it with the reader ('we', 'let's', 'us', 'our'):
    twice or more 5, once 4, none 2."""
    n = sum(w.lower() in _TOGETHER for w in _words(reply))
    return 5 if n >= 2 else 4 if n == 1 else 2 if reply.strip() else 1
