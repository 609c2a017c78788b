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
