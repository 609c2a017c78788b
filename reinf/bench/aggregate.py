"""``reinf bench learn``'s arithmetic over its runs, with no model (tests/unit/test_bench_learn.py).

A run of one method on one seed (``reinf.bench.harness.run_method``) gives its probe curve,
its windows of live ratings and its rounds. This module reads targets off them
(``curve_to_target``, ``ratings_to_target``), takes each figure over seeds (``aggregate``:
the mean, the min-max and every seed's value; ``aggregate_reach`` for ratings to a target;
``mean_curve`` for curves), shapes a method's part of the report (``summarize_method``) and
checks the goals on Reinf's means (``check_goals``). A KTO learning-rate sweep is one method
per rate (``kto_key``: ``kto@1e-4``); the goals compare Reinf with the best of them
(``best_kto``), and every other baseline, best-of-n included.

"Ratings to target" reads the probe curve, not the live ratings: 64 fixed prompts have far
less luck in them than a window of 16 live ratings, and "held" asks that the curve stay at
or above the target from that round to the end of the run.
"""
from __future__ import annotations

import math
import statistics
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # for the annotations only: reinf.bench.learn imports this module
    from reinf.bench.learn import LearnPlan

# The goals, checked on Reinf's means over seeds (check_goals).
GOAL_RISE, GOAL_RISE_BY = 1.0, 48             # probe mean +1.0 over the base by 48 ratings
GOAL_SHARE, GOAL_SHARE_BY = 0.9, 96           # preferred share >= 90% by 96 ratings
GOAL_PPL_PREFERRED = 0.05                     # perplexity on preferred-style replies +5% at most
GOAL_PPL_GENERAL = 0.05                       # perplexity on general text +5% at most
GOAL_SPEARMAN, GOAL_SPEARMAN_AFTER = 0.8, 48  # rating model's cross-validated Spearman
POINT_KEYS = ("probe_mean_rating", "probe_preferred_share", "kl", "perplexity",
              "perplexity_preferred", "perplexity_general", "rating_model_consistency")
# A fall of the probe mean between two points of a run's curve (one round apart) at least
# this large counts in ``probe_falls``: more than a 32-prompt probe moves between rounds that
# barely move the policy (a spread of about 0.19 on the real model). It is not all the
# policy's doing: where the rater's scores spread wide (1 or 5), the probe's own sampling
# noise is as large (docs/benchmarks.md); compare arms on the same rater.
PROBE_FALL = 0.25


def lr_text(lr: float) -> str:
    """A learning rate, short and exact enough to name a run: 5e-06 -> '5e-6', 0.001 ->
    '1e-3', 2.5e-05 -> '2.5e-5'."""
    mantissa, _, exponent = f"{lr:.6e}".partition("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def kto_key(lr: float, sweep: bool) -> str:
    """The report's name of a KTO run: ``kto`` alone, ``kto@<lr>`` in a sweep of rates."""
    return f"kto@{lr_text(lr)}" if sweep else "kto"


def is_kto(method: str) -> bool:
    return method == "kto" or method.startswith("kto@")


def kto_rate(method: str, rates) -> float:
    """The learning rate of KTO run ``method`` (``kto`` alone: the only rate given)."""
    return float(method.partition("@")[2]) if "@" in method else float(rates[0])


def best_kto(methods: dict) -> str | None:
    """The best of the KTO runs (a learning-rate sweep): the fewest ratings to the held
    target (its lower bound when a seed never held it), then the highest final probe mean;
    the first given on a tie. None when no KTO ran."""
    keys = [m for m in methods if is_kto(m)]

    def rank(m: str) -> tuple[float, float]:
        s = methods[m]["summary"]
        held = s["ratings_to_target_held"]["bound"]
        final = s["final_probe_mean_rating"]["mean"]
        return (math.inf if held is None else held, -(-math.inf if final is None else final))
    return min(keys, key=rank) if keys else None


def ratings_to_target(scores: list[int], window: int, target: float, *,
                      held: bool = False) -> int | None:
    """On the live ratings: the first n at which the mean of the last ``window`` ratings (all
    of them while fewer) reaches ``target``, counting from n = window (or the end, if shorter).

    ``held=True``: the first n from which that rolling mean stays at or above ``target``
    through the last rating. One lucky window of a 50/50 policy can reach a target once
    (a window of 20 binary ratings has a standard error of up to 0.45 on the mean rating,
    a 95% interval of about ±0.9);
    holding it to the end of the run needs a policy that has really moved."""
    first = min(window, len(scores))
    means = [statistics.fmean(scores[max(0, n - window):n]) for n in range(first, len(scores) + 1)]
    return curve_to_target([(first + i, m) for i, m in enumerate(means)], target, held=held)


def curve_to_target(points: list[tuple[int, float]], target: float, *,
                    held: bool = False) -> int | None:
    """The ratings x of the first (x, value) point whose value reaches ``target``; with
    ``held``, the first point from which every later value stays at or above it."""
    if not held:
        return next((x for x, v in points if v >= target), None)
    reached = None
    for x, v in points:
        if v < target:
            reached = None
        elif reached is None:
            reached = x
    return reached


def aggregate(values: list[float | None]) -> dict:
    """A figure over seeds: mean, min and max of the seeds that have it (``n`` of them), and
    every seed's value."""
    got = [v for v in values if v is not None]
    return {"mean": statistics.fmean(got) if got else None, "min": min(got, default=None),
            "max": max(got, default=None), "n": len(got), "values": list(values)}


def aggregate_reach(values: list[int | None], never: int) -> dict:
    """Ratings to a target over seeds. The mean is only given when every seed reached it;
    ``bound`` counts a seed that never did as ``never`` (more than the run's ratings), so it
    is a lower bound of the true mean, and a method whose mean is below another's bound
    is faster whatever the missing seeds would have taken."""
    out = aggregate(values)
    if out["n"] < len(values):
        out["mean"] = None
    out["bound"] = statistics.fmean(never if v is None else v for v in values) if values else None
    return out


def mean_curve(curves: list[list[dict]], keys: tuple[str, ...] = POINT_KEYS) -> list[dict]:
    """Per-seed curves (points with ``ratings``) -> one curve of aggregates over seeds, and
    how many seeds ran each round in each mode."""
    out = []
    for x in sorted({p["ratings"] for c in curves for p in c}):
        points = [p for c in curves for p in c if p["ratings"] == x]
        row: dict[str, Any] = {"ratings": x, "seeds": len(points)}
        row.update({k: aggregate([p.get(k) for p in points]) for k in keys})
        modes = Counter(p["mode"] for p in points if p.get("mode"))
        row["modes"] = dict(modes) if modes else None
        out.append(row)
    return out


def value_at(curve: list[dict], n: int, key: str):
    """``key`` of the policy active after ``n`` ratings: the last point at or before n."""
    before = [p for p in curve if p["ratings"] <= n]
    return before[-1].get(key) if before else None


def probe_falls(curve: list[dict], fall: float = PROBE_FALL) -> int:
    """How many times a run's probe mean fell by ``fall`` or more from one point of its
    curve to the next: a person would have seen the assistant get worse after a round."""
    means = [p["probe_mean_rating"] for p in curve if p.get("probe_mean_rating") is not None]
    return sum(after <= before - fall for before, after in zip(means, means[1:]))


def ratio(new: float | None, old: float | None) -> float | None:
    return None if new is None or not old else new / old - 1


def summarize_method(runs: list[dict], plan: LearnPlan, base: dict) -> dict:
    """A method over seeds: the headline figures (mean, min, max), the probe curve and the
    windows as means over seeds, and the per-seed detail."""
    never = plan.ratings + 1

    def figure(fn: Callable[[dict], Any]) -> dict:
        return aggregate([fn(r) for r in runs])

    def mode_count(mode: str) -> Callable[[dict], Any]:
        return lambda r: None if r["modes"] is None else r["modes"].get(mode, 0)

    final = {key: figure(lambda r, key=key: r["final"].get(key)) for key in
             ("probe_mean_rating", "probe_preferred_share", "kl", "perplexity",
              "perplexity_preferred", "perplexity_general")}
    summary = {
        "ratings_to_target": aggregate_reach([r["ratings_to_target"] for r in runs], never),
        "ratings_to_target_held": aggregate_reach([r["ratings_to_target_held"] for r in runs],
                                                  never),
        "seconds_to_target_held": figure(lambda r: r["seconds_to_target_held"]),
        "window_ratings_to_target_held": aggregate_reach(
            [r["window_ratings_to_target_held"] for r in runs], never),
        **{f"final_{key}": value for key, value in final.items()},
        "perplexity_change": figure(lambda r: ratio(r["final"]["perplexity"],
                                                    base["perplexity"])),
        "perplexity_preferred_change": figure(lambda r: ratio(
            r["final"]["perplexity_preferred"], base.get("perplexity_preferred"))),
        "perplexity_general_change": figure(lambda r: ratio(
            r["final"].get("perplexity_general"), base.get("perplexity_general"))),
        "rating_model_consistency_last": figure(
            lambda r: value_at(r["curve"], plan.ratings, "rating_model_consistency")),
        "probe_falls": figure(lambda r: probe_falls(r["curve"])),
        "rounds_rollouts": figure(mode_count("rollouts")),
        "rounds_rated": figure(mode_count("rated")),
        "rounds_succeeded": figure(lambda r: r["rounds_succeeded"]),
        "rounds_rejected": figure(lambda r: r["rounds_rejected"]),
        "round_seconds": figure(lambda r: r["round_seconds"]),
        "swap_pause_ms_median": figure(lambda r: r["swap_pause_ms_median"]),
        "loop_seconds": figure(lambda r: r["loop_seconds"]),
        "probe_seconds": figure(lambda r: r["probe_seconds"]),
        "measure_seconds": figure(lambda r: r["measure_seconds"]),
    }
    return {"summary": summary, "curve": mean_curve([r["curve"] for r in runs]),
            "windows": mean_curve([r["windows"] for r in runs],
                                  ("mean_rating", "preferred_share", *POINT_KEYS[:5])),
            "seeds": runs}


def check_goals(report: dict) -> dict:
    """The goals for the default configuration (Reinf), on its means over seeds."""
    ppo = report["methods"].get("reinf")
    if ppo is None:
        return {}
    plan, runs, base = report["plan"], ppo["seeds"], report["base"]
    base_curve = report["base_curve"]
    enough = plan["ratings"] >= GOAL_RISE_BY
    at48 = aggregate([value_at(r["curve"], GOAL_RISE_BY, "probe_mean_rating") for r in runs]
                     if enough else [])
    rise = None if at48["mean"] is None else at48["mean"] - base_curve["probe_mean_rating"]
    enough_share = plan["ratings"] >= GOAL_SHARE_BY
    at96 = aggregate([value_at(r["curve"], GOAL_SHARE_BY, "probe_preferred_share")
                      for r in runs] if enough_share else [])
    ppl = ppo["summary"]["perplexity_preferred_change"]
    general = ppo["summary"].get("perplexity_general_change") or aggregate([])
    mine = ppo["summary"]["ratings_to_target_held"]
    # every baseline (best-of-n too), and of a KTO learning-rate sweep its best run
    kto = best_kto(report["methods"])
    others = {m: r["summary"]["ratings_to_target_held"] for m, r in report["methods"].items()
              if m != "reinf" and (not is_kto(m) or m == kto)}
    after48 = [next((x for x in r["rounds"] if x["after_ratings"] >= GOAL_SPEARMAN_AFTER), {})
               for r in runs]
    spearman = aggregate([x.get("rating_model_consistency") for x in after48])
    # what a perfect predictor of those ratings could score (ties: see spearman_ceiling)
    ceiling = aggregate([x.get("rating_model_consistency_ceiling") for x in after48])
    return {
        "rise_by_48": {"base_mean": base_curve["probe_mean_rating"], "mean_at_48": at48,
                       "rise": rise, "met": rise is not None and rise >= GOAL_RISE,
                       # how far any model could rise on this probe (the rater's best)
                       "possible": (None if base_curve.get("probe_best") is None else
                                    base_curve["probe_best"] - base_curve["probe_mean_rating"])},
        "share_by_96": {"base_share": base_curve["probe_preferred_share"], "share_at_96": at96,
                        "met": at96["mean"] is not None and at96["mean"] >= GOAL_SHARE},
        "perplexity_preferred": {
            "base": base.get("perplexity_preferred"), "change": ppl,
            "overall_change": ppo["summary"]["perplexity_change"],
            "met": ppl["mean"] is not None and ppl["mean"] <= GOAL_PPL_PREFERRED},
        # the "held-out general text, not the person's style" (reinf.bench.probe)
        "perplexity_general": {
            "base": base.get("perplexity_general"), "change": general,
            "met": general["mean"] is not None and general["mean"] <= GOAL_PPL_GENERAL},
        "fewer_ratings_than_baselines": {
            "reinf": mine["mean"], **{m: {"mean": v["mean"], "bound": v["bound"]}
                                      for m, v in others.items()},
            "met": bool(others) and mine["mean"] is not None
            and all(mine["mean"] < v["bound"] for v in others.values()),
            "kto_best": kto},
        "rating_model_after_48": {
            "spearman": spearman, "ceiling": ceiling,
            "met": spearman["n"] == len(runs) and spearman["mean"] >= GOAL_SPEARMAN},
    }
