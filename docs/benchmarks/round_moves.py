"""How far, and which way, each round of a learning run moved the probe (docs/benchmarks.md,
"Why the GPU figures swing").

Reads `reinf bench learn --json` reports and pairs every round with the probe it was followed
by: the change of the probe mean (the curve's point after the round minus the point before
it, both on the same probe prompts) next to the round's mode, the rating model's
cross-validated Spearman, ``approx_kl`` (how far the round moved the policy from where it
started), ``clipfrac`` and the KL to the base after it. Prints, per method and mode, the
number of rounds, the mean change, its spread (population standard deviation) and the
share of rounds that lowered the probe by 0.25 or more; then the same for rollout rounds by
their ``approx_kl``; then how many rounds moved the probe by more than twice its sampling
noise (``noise``: the standard deviation of the difference of two independent probe means
for a rater that gives only 1s and 5s, from each point's preferred share and probe size,
``4 sqrt(p (1 - p) / n)`` each; for a rater with steps in between it overstates the noise):

    python docs/benchmarks/round_moves.py docs/benchmarks/reports/2026-11-2*-h200/*.json

``--rounds`` prints every round instead. Standard library only.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

# a fall of the probe mean this large: reinf.bench.aggregate.PROBE_FALL, kept here as a
# number so that the script runs without Reinf installed
DROP = 0.25


def round_moves(report: dict, source: str = "") -> list[dict]:
    """One row per round that a probe followed, from one report."""
    rows = []
    for method, result in report["methods"].items():
        for seed in result["seeds"]:
            curve = [point["probe_mean_rating"] for point in seed.get("curve", [])]
            for i, rnd in enumerate(seed.get("rounds") or []):
                if i + 1 >= len(curve) or rnd.get("status") not in (None, "succeeded"):
                    continue
                noise = math.sqrt(sum(two_level_variance(p) for p in seed["curve"][i:i + 2]))
                rows.append({"source": source, "rater": report["rater"]["name"],
                             "method": method, "seed": seed["seed"], "round": i + 1,
                             "mode": rnd.get("mode") or method,
                             "consistency": rnd.get("rating_model_consistency"),
                             "approx_kl": rnd.get("approx_kl"), "clipfrac": rnd.get("clipfrac"),
                             "kl": rnd.get("kl"), "steps": rnd.get("steps"),
                             "move": curve[i + 1] - curve[i], "noise": noise})
    return rows


def two_level_variance(point: dict) -> float:
    """The sampling variance of a probe mean whose replies are rated 1 or 5 (5 for the
    preferred share ``p``) over ``probe`` prompts: 16 p (1 - p) / n."""
    p, n = point.get("probe_preferred_share"), point.get("probe")
    return 16 * p * (1 - p) / n if p is not None and n else 0.0


def summary(rows: list[dict]) -> dict:
    moves = [r["move"] for r in rows]
    return {"rounds": len(moves), "mean": statistics.fmean(moves),
            "spread": statistics.pstdev(moves),
            "drops": sum(m <= -DROP for m in moves) / len(moves)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--rounds", action="store_true", help="print every round")
    args = parser.parse_args()
    rows = []
    for path in args.reports:
        report = json.loads(path.read_text())
        if report.get("benchmark") == "learn":
            rows += round_moves(report, path.name)
    if args.rounds:
        for r in rows:
            print(json.dumps(r))
        return
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(f"{r['method']}, {r['mode']} rounds", []).append(r)
    rollouts = [r for r in rows if r["mode"] == "rollouts" and r["approx_kl"] is not None]
    for lo, hi in ((0.0, 0.1), (0.1, 0.2), (0.2, float("inf"))):
        groups[f"rollout rounds, approx_kl in [{lo}, {hi})"] = \
            [r for r in rollouts if lo <= r["approx_kl"] < hi]
    print(f"{'rounds':48} {'n':>4} {'mean':>7} {'spread':>7} {'falls':>6} {'noise':>6} "
          f"{'up>2x':>6} {'down>2x':>7}")
    for name, group in groups.items():
        if group:
            s = summary(group)
            noise = math.sqrt(statistics.fmean(r["noise"] ** 2 for r in group))
            up = sum(r["noise"] > 0 and r["move"] > 2 * r["noise"] for r in group)
            down = sum(r["noise"] > 0 and r["move"] < -2 * r["noise"] for r in group)
            print(f"{name:48} {s['rounds']:4d} {s['mean']:+7.3f} {s['spread']:7.3f} "
                  f"{s['drops']:6.0%} {noise:6.3f} {up:6d} {down:7d}")


if __name__ == "__main__":
    main()
