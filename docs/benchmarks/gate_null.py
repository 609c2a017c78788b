"""How the gate's figure spreads when the ratings carry no signal (docs/benchmarks.md, "The
case it is for, and the gate, on the tuning raters").

The gate (training.min_consistency) reads the rating model's cross-validated Spearman
(``reinf.training.rating_model.cross_validated_spearman``). Here it is taken on random
features and random ratings, 30 draws at each size: its mean and spread are what a rating
model that knows nothing would show. No model is loaded; a few seconds on one core:

    python docs/benchmarks/gate_null.py
"""
from __future__ import annotations

import statistics

import torch

from reinf.training.rating_model import cross_validated_spearman


def null_figures(n: int, width: int, *, rare: bool, draws: int = 30) -> list[float]:
    """The figure on ``draws`` sets of ``n`` random rows: ratings 1-5 at random, or (``rare``)
    1 with an eighth of them 5, as a style the model seldom writes."""
    out = []
    for draw in range(draws):
        x = torch.randn(n, width)
        if rare:
            y = torch.ones(n, dtype=torch.float64)
            y[torch.randperm(n)[:max(2, n // 8)]] = 5.0
        else:
            y = torch.randint(1, 6, (n,)).double()
        figure = cross_validated_spearman(x, y, seed=draw)
        if figure is not None:
            out.append(figure)
    return out


def main() -> None:
    torch.manual_seed(0)
    for n, width in ((16, 500), (32, 2000), (48, 2000)):
        for rare in (False, True):
            values = null_figures(n, width, rare=rare)
            print(f"{n} ratings, {'rare 5s' if rare else '1-5 at random'}: mean "
                  f"{statistics.mean(values):+.3f}, spread {statistics.pstdev(values):.3f}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
