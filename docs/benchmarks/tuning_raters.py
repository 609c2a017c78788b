"""Two file raters that were used to choose the defaults (kl_loss_coef, RLOO): tuning
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
# rating-model) without reading the unseen raters: tuning data too (TUNED_ON).

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
