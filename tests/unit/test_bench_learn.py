"""`reinf bench learn`'s arithmetic, with no model: targets on the probe curve, the
aggregation over seeds, the goals, and the table and SVG built from them. None of it needs
the optional ``bench`` extra (trl, datasets, matplotlib, scipy)."""
from __future__ import annotations

import re
import statistics

import pytest

from reinf.bench.aggregate import (aggregate, aggregate_reach, check_goals, curve_to_target,
                                   mean_curve, probe_falls, summarize_method, value_at)
from reinf.bench.learn import LearnPlan
from reinf.bench.plot import build_svg, format_table, series


def test_curve_to_target_reads_the_first_round_at_target():
    curve = [(0, 2.0), (8, 3.0), (16, 4.2), (24, 3.9), (32, 4.0), (40, 4.5)]
    assert curve_to_target(curve, 4.0) == 16
    assert curve_to_target(curve, 4.6) is None
    assert curve_to_target([(0, 4.1), (8, 3.0)], 4.0) == 0     # the base can already be there


def test_held_target_must_last_to_the_end_of_the_curve():
    curve = [(0, 2.0), (8, 3.0), (16, 4.2), (24, 3.9), (32, 4.0), (40, 4.5)]
    assert curve_to_target(curve, 4.0, held=True) == 32        # the dip at 24 resets it
    assert curve_to_target(curve + [(48, 3.99)], 4.0, held=True) is None
    assert curve_to_target([(0, 4.0), (8, 4.0)], 4.0, held=True) == 0
    assert curve_to_target([], 4.0, held=True) is None


def test_aggregate_gives_mean_and_range_of_the_seeds_that_have_a_value():
    a = aggregate([3.8, 4.4, 4.1])
    assert a["mean"] == pytest.approx(4.1) and (a["min"], a["max"], a["n"]) == (3.8, 4.4, 3)
    assert a["values"] == [3.8, 4.4, 4.1]
    b = aggregate([None, 0.5, 0.7])
    assert b["mean"] == pytest.approx(0.6) and b["n"] == 2 and b["values"][0] is None
    assert aggregate([None, None]) == {"mean": None, "min": None, "max": None, "n": 0,
                                       "values": [None, None]}


def test_ratings_to_target_over_seeds_has_a_mean_only_when_every_seed_got_there():
    every = aggregate_reach([16, 24, 32], never=97)
    assert every["mean"] == 24 and every["bound"] == 24 and (every["min"], every["max"]) == (16, 32)
    some = aggregate_reach([16, None, 32], never=97)
    assert some["mean"] is None and some["n"] == 2 and (some["min"], some["max"]) == (16, 32)
    assert some["bound"] == pytest.approx((16 + 97 + 32) / 3)    # a lower bound of the truth
    assert aggregate_reach([None, None], never=97)["bound"] == 97


def test_mean_curve_aligns_rounds_and_counts_modes():
    seed0 = [{"ratings": 0, "probe_mean_rating": 2.0}, {"ratings": 8, "probe_mean_rating": 3.0,
                                                        "mode": "rated"}]
    seed1 = [{"ratings": 0, "probe_mean_rating": 2.0}, {"ratings": 8, "probe_mean_rating": 4.0,
                                                        "mode": "rollouts"}]
    curve = mean_curve([seed0, seed1], ("probe_mean_rating", "kl"))
    assert [p["ratings"] for p in curve] == [0, 8]
    assert curve[1]["probe_mean_rating"]["mean"] == 3.5 and curve[1]["seeds"] == 2
    assert curve[1]["kl"]["mean"] is None and curve[1]["modes"] == {"rated": 1, "rollouts": 1}
    assert curve[0]["modes"] is None
    assert value_at(seed1, 12, "probe_mean_rating") == 4.0    # the policy active after 12
    assert value_at(seed1, 7, "probe_mean_rating") == 2.0


def fake_run(seed: int, curve: list[float], *, k: int = 16, ppl_pref: float = 1.5,
             ppl_general: float | None = 20.0, consistency: float | None = 0.9,
             mode: str | None = "rollouts") -> dict:
    """A per-seed run as run_method returns it, with a probe mean per round."""
    points = [{"ratings": i * k, "seconds": float(i), "probe_mean_rating": v,
               "probe_preferred_share": (v - 1) / 4, "kl": 0.01 * i, "perplexity": 1.3,
               "perplexity_preferred": ppl_pref, "mode": mode if i else None,
               "rating_model_consistency": consistency if i and mode == "rollouts" else None}
              for i, v in enumerate(curve)]
    rounds = [{"after_ratings": p["ratings"], "status": "succeeded", "wall_seconds": 2.0,
               **({"mode": mode} if mode else {}),
               **({"rating_model_consistency": consistency} if mode == "rollouts" else {})}
              for p in points[1:]]
    target = [(p["ratings"], p["probe_mean_rating"]) for p in points]
    held = curve_to_target(target, 4.0, held=True)
    final = {key: points[-1][key] for key in ("probe_mean_rating", "probe_preferred_share", "kl",
                                              "perplexity", "perplexity_preferred")}
    if ppl_general is not None:   # measured at the base and the end only (None: an old report)
        final["perplexity_general"] = ppl_general
    return {"seed": seed, "curve": points, "windows": points, "final": final, "rounds": rounds,
            "modes": {mode: len(rounds)} if mode else None,
            "ratings_to_target": curve_to_target(target, 4.0), "seconds_to_target": None,
            "ratings_to_target_held": held, "seconds_to_target_held": None,
            "window_ratings_to_target_held": None, "loop_seconds": 10.0, "probe_seconds": 3.0,
            "measure_seconds": 1.0, "round_seconds": 2.0, "rounds_succeeded": len(rounds),
            "rounds_rejected": 0, "swap_pause_ms_median": 5.0}


BASE = {"probe_mean_rating": 2.0, "probe_preferred_share": 0.25, "kl": 0.0, "perplexity": 1.3,
        "perplexity_preferred": 1.5, "perplexity_general": 20.0}


def fake_report(methods: dict[str, list[dict]], ratings: int = 96) -> dict:
    plan = LearnPlan(ratings=ratings, train_after=16, seeds=len(methods["reinf"]))
    report = {"rater": {"name": "prefers-terse", "description": "terse"},
              "plan": {**plan.__dict__, "methods": list(methods)},
              "seeds": [r["seed"] for r in methods["reinf"]], "machine": "test",
              "model": {"name": "fake", "parameters": 1}, "base": BASE, "base_curve": BASE,
              "seconds": 1.0,
              "methods": {m: {"label": m, "settings": {}, **summarize_method(runs, plan, BASE)}
                          for m, runs in methods.items()}}
    report["goals"] = check_goals(report)
    return report


def test_summary_is_the_mean_and_range_of_the_seeds():
    runs = [fake_run(0, [2.0, 3.0, 4.0, 4.5, 4.5, 4.5, 4.5]),
            fake_run(1, [2.0, 3.5, 4.5, 4.0, 4.5, 4.5, 4.5])]
    report = fake_report({"reinf": runs})
    s = report["methods"]["reinf"]["summary"]
    assert s["ratings_to_target_held"]["values"] == [32, 32]
    assert s["ratings_to_target"]["values"] == [32, 32] and s["ratings_to_target"]["mean"] == 32
    assert s["final_probe_mean_rating"]["mean"] == 4.5
    assert s["rounds_rollouts"]["mean"] == 6 and s["rounds_rated"]["mean"] == 0
    curve = report["methods"]["reinf"]["curve"]
    assert curve[1]["probe_mean_rating"]["mean"] == pytest.approx(statistics.fmean([3.0, 3.5]))
    at16 = curve[1]["probe_mean_rating"]
    assert (at16["min"], at16["max"]) == (3.0, 3.5)
    assert report["methods"]["reinf"]["seeds"] == runs    # the per-seed detail is kept
    # seed 1 fell from 4.5 to 4.0 after a round: a fall of 0.25 or more; seed 0 never fell
    assert s["probe_falls"]["values"] == [0, 1]
    assert "probe falls >= 0.25 a round" in format_table(report)


def test_a_fall_counts_from_one_point_of_the_curve_to_the_next():
    curve = [{"probe_mean_rating": m} for m in (2.0, 3.0, 2.8, 2.5, 3.5, 3.25, None, 3.0)]
    # 3.0 -> 2.8 (-0.2) is within the noise, 2.8 -> 2.5 (-0.3) is a fall, 3.5 -> 3.25 is
    # one at the threshold, and a point without a probe is passed over: 3.25 -> 3.0
    assert probe_falls(curve) == 3
    assert probe_falls(curve, fall=0.1) == 4


def test_goals_read_the_means_over_seeds():
    fast = [fake_run(0, [2.0, 3.5, 4.5, 4.6, 4.6, 4.6, 4.7]),
            fake_run(1, [2.0, 3.0, 4.2, 4.6, 4.6, 4.7, 4.7])]
    slow = [fake_run(0, [2.0, 2.5, 3.0, 3.5, 4.1, 4.2, 4.3], mode="rated", consistency=None),
            fake_run(1, [2.0, 2.5, 3.0, 3.5, 3.6, 3.9, 3.9], mode="rated", consistency=None)]
    g = fake_report({"reinf": fast, "rated": slow})["goals"]
    # After 48 ratings (the round at 48): (4.6 + 4.6) / 2 - 2.0 = +2.6.
    assert g["rise_by_48"]["rise"] == pytest.approx(2.6) and g["rise_by_48"]["met"]
    assert g["share_by_96"]["share_at_96"]["mean"] == pytest.approx((4.7 - 1) / 4)
    assert g["share_by_96"]["met"]
    assert g["perplexity_preferred"]["change"]["mean"] == pytest.approx(0.0)
    assert g["perplexity_preferred"]["met"]
    assert g["perplexity_general"]["change"]["mean"] == pytest.approx(0.0)
    assert g["perplexity_general"]["met"] and g["perplexity_general"]["base"] == 20.0
    # reinf held from 32 in both seeds; rated held from 64 in one seed, never in the other:
    # its lower bound (64 + 97) / 2 is above 32.
    fewer = g["fewer_ratings_than_baselines"]
    assert fewer["reinf"] == 32 and fewer["rated"]["mean"] is None
    assert fewer["rated"]["bound"] == pytest.approx((64 + 97) / 2) and fewer["met"]
    assert g["rating_model_after_48"]["spearman"]["mean"] == pytest.approx(0.9)
    assert g["rating_model_after_48"]["met"]


def test_goals_fail_where_the_run_falls_short():
    weak = [fake_run(0, [2.0, 2.5, 2.5], k=16, ppl_pref=1.6, ppl_general=21.2, consistency=0.5)]
    g = fake_report({"reinf": weak, "sft": [fake_run(0, [2.0, 2.5, 4.5], mode=None)]},
                    ratings=32)["goals"]
    assert not g["rise_by_48"]["met"] and g["rise_by_48"]["rise"] is None   # 32 < 48 ratings
    assert not g["share_by_96"]["met"]
    assert g["perplexity_preferred"]["change"]["mean"] == pytest.approx(1.6 / 1.5 - 1)
    assert not g["perplexity_preferred"]["met"]                             # +6.7% > +5%
    assert g["perplexity_general"]["change"]["mean"] == pytest.approx(21.2 / 20 - 1)
    assert not g["perplexity_general"]["met"]                               # +6% > +5%
    text = format_table(fake_report({"reinf": weak}, ratings=32))
    assert "[ ] perplexity on held-out general text +5% at most: +6.0%" in text
    assert not g["fewer_ratings_than_baselines"]["met"]                     # never held
    assert g["rating_model_after_48"]["spearman"]["n"] == 0                 # no round at 48
    assert not g["rating_model_after_48"]["met"]


def test_a_report_from_before_the_general_text_figure_still_reads():
    """Reports written before general-text perplexity was measured have no such figure:
    the summary and the goal say so (no mean, not met) instead of failing."""
    old = [fake_run(0, [2.0, 3.5, 4.5, 4.6], ppl_general=None)]
    report = fake_report({"reinf": old}, ratings=48)
    assert report["methods"]["reinf"]["summary"]["perplexity_general_change"]["n"] == 0
    goal = report["goals"]["perplexity_general"]
    assert goal["change"]["mean"] is None and not goal["met"]
    assert "[ ] perplexity on held-out general text +5% at most: -" in format_table(report)


def test_the_rise_goal_says_when_the_probe_cannot_allow_it():
    """A rater neutral (3) on some probe prompts caps the probe mean below 5: the goal line
    says how far any model could rise, and the goal is still judged at +1.0."""
    runs = [fake_run(0, [2.0, 2.2, 2.3, 2.4])]
    report = fake_report({"reinf": runs}, ratings=48)
    assert report["goals"]["rise_by_48"]["possible"] is None          # no ceiling measured
    assert "possible" not in format_table(report)
    report["base_curve"] = {**BASE, "probe_best": 2.5}
    report["goals"] = check_goals(report)
    rise = report["goals"]["rise_by_48"]
    assert rise["possible"] == pytest.approx(0.5) and not rise["met"]
    assert "(at most +0.50 possible" in format_table(report)
    report["base_curve"] = {**BASE, "probe_best": 5.0}               # room for +3.0
    report["goals"] = check_goals(report)
    assert "possible" not in format_table(report)


def test_table_and_svg_show_means_and_ranges():
    runs = [fake_run(0, [2.0, 3.8, 4.4]), fake_run(1, [2.0, 4.4, 4.4])]
    report = fake_report({"reinf": runs, "sft": [fake_run(0, [2.0, 2.0, 2.5], mode=None),
                                                 fake_run(1, [2.0, 2.5, 2.5], mode=None)]},
                         ratings=32)
    text = format_table(report)
    assert "4.10 (3.80–4.40)" in text                 # the probe curve after 16 ratings
    assert "Round modes" in text and "reinf  seed 1: RR" in text and "sft    seed 0: .." in text
    assert "  reinf  16:0.90 32:0.90" in text and "  sft    -" in text   # rating model
    data = series(report)
    assert data["reinf"]["lo"] == [2.0, 3.8, 4.4] and data["reinf"]["hi"] == [2.0, 4.4, 4.4]
    svg = build_svg(data, report)
    assert svg.count("<polyline") == 4 and svg.count("<polygon") == 2   # a band per method


def test_with_pairs_the_axis_counts_interactions():
    report = fake_report({"reinf": [fake_run(0, [2.0, 3.8, 4.4])]}, ratings=32)
    assert "ratings to target" in format_table(report)
    report["plan"]["pairs_every"] = 4
    text = format_table(report)
    assert "32 interactions a run" in text and "interactions to target, held" in text
    assert "ratings to target" not in text
    assert "vs interactions" in build_svg(series(report), report)


def test_the_report_says_which_styles_the_served_replies_were_asked_for_in():
    from reinf.bench.harness import explored_styles

    asked = [None, "Use a list.", None, "Be brief.", "Use a list.", None]   # a pair: None
    scores = [1, 5, 2, 1, 4, 3]
    e = explored_styles(asked, scores)
    assert e["styled"] == 3 and e["styled_mean"] == pytest.approx(10 / 3)
    assert e["plain_mean"] == 2.0
    assert e["by_style"] == {"Use a list.": [2, 4.5], "Be brief.": [1, 1.0]}
    assert list(e["by_style"]) == ["Use a list.", "Be brief."]             # most asked first
    run = fake_run(0, [2.0, 3.8, 4.4])
    report = fake_report({"reinf": [{**run, "explored": e, "scores": scores}]}, ratings=32)
    assert ('explored (reinf, seed 0): 3 of 6 rated replies asked for in a style, mean 3.33 '
            'against 2.00 plain; most asked "Use a list." 2 (4.5), "Be brief." 1 (1.0)'
            ) in format_table(report)
    assert "explored" not in format_table(fake_report({"reinf": [run]}, ratings=32))


# --- the baselines of the issue: best-of-n at serve time, and KTO's learning-rate sweep ------

def fake_bestofn(seed: int, curve: list[float], *, k: int = 16) -> dict:
    """A per-seed best-of-n run as run_bestofn returns it: no KL, no live ratings, no
    rounds of training; a point reranked once the rating model is there (after round 1)."""
    run = fake_run(seed, curve, k=k, mode=None)
    for i, p in enumerate(run["curve"]):
        p.update(kl=None, seconds=None, perplexity=BASE["perplexity"],
                 perplexity_preferred=BASE["perplexity_preferred"])
        if i:
            p.update(mode="reranked" if i > 1 else "first sample",
                     chosen_not_first_share=0.5 if i > 1 else 0.0)
    for r in run["rounds"]:
        r["mode"] = "reranked" if r["after_ratings"] > k else "first sample"
    run["final"].update(kl=None, perplexity=BASE["perplexity"],
                        perplexity_preferred=BASE["perplexity_preferred"])
    run.update(windows=[{"ratings": p["ratings"], "mean_rating": None, "preferred_share": None,
                         **{key: p[key] for key in ("probe_mean_rating", "probe_preferred_share",
                                                    "kl", "perplexity", "perplexity_preferred")}}
                        for p in run["curve"]],
               loop_seconds=None, probe_seconds=None, measure_seconds=None, round_seconds=None,
               rounds_succeeded=None, rounds_rejected=None, swap_pause_ms_median=None)
    return run


def test_learning_rates_name_kto_runs_and_read_back():
    from reinf.bench.aggregate import is_kto, kto_key, kto_rate, lr_text

    assert [lr_text(x) for x in (5e-6, 1e-4, 1e-3, 2.5e-5, 0.1)] == [
        "5e-6", "1e-4", "1e-3", "2.5e-5", "1e-1"]
    assert kto_key(1e-4, True) == "kto@1e-4" and kto_key(1e-4, False) == "kto"
    assert kto_rate("kto@1e-4", (5e-6,)) == 1e-4 and kto_rate("kto", (5e-6,)) == 5e-6
    assert is_kto("kto") and is_kto("kto@1e-3") and not is_kto("sft")


def test_run_keys_sweep_kto_and_put_best_of_n_after_reinf():
    from reinf.bench.learn import KTO_SWEEP, run_keys

    assert 1e-3 in KTO_SWEEP and len(KTO_SWEEP) >= 3     # Reinf's own rate is one of them
    plan = LearnPlan(methods=("reinf", "bestofn", "kto", "sft"), kto_lrs=(5e-6, 1e-3))
    assert run_keys(plan) == ["reinf", "kto@5e-6", "kto@1e-3", "sft", "bestofn"]
    assert run_keys(LearnPlan(methods=("reinf", "kto"), kto_lrs=(1e-4,))) == ["reinf", "kto"]
    assert "bestofn" in LearnPlan().methods and LearnPlan().best_of == 4


def test_the_goal_compares_reinf_with_the_best_kto_and_with_best_of_n():
    reinf = [fake_run(0, [2.0, 3.5, 4.5, 4.6, 4.6, 4.6, 4.7])]             # held from 32
    never = [fake_run(0, [2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.1], mode=None)]   # KTO at 5e-6
    kto48 = [fake_run(0, [2.0, 2.5, 3.0, 4.1, 4.2, 4.3, 4.3], mode=None)]  # held from 48
    kto64 = [fake_run(0, [2.0, 2.5, 3.0, 3.5, 4.1, 4.5, 4.9], mode=None)]  # 64, higher final
    report = fake_report({"reinf": reinf, "kto@5e-6": never, "kto@1e-4": kto64,
                          "kto@1e-3": kto48, "bestofn": [fake_bestofn(0, [2.0, 2.0, 3.8, 4.0,
                                                                          4.2, 4.2, 4.2])]})
    fewer = report["goals"]["fewer_ratings_than_baselines"]
    # the best KTO is the one that holds the target soonest (48), not the best final mean
    assert fewer["kto_best"] == "kto@1e-3"
    assert set(fewer) == {"reinf", "kto@1e-3", "bestofn", "met", "kto_best"}
    assert fewer["kto@1e-3"]["mean"] == 48 and fewer["bestofn"]["mean"] == 48
    assert fewer["reinf"] == 32 and fewer["met"]
    # best-of-n that holds the target first: Reinf no longer has fewer than every baseline
    fast = fake_report({"reinf": reinf, "kto@1e-3": kto48,
                        "bestofn": [fake_bestofn(0, [2.0, 4.5, 4.5, 4.5, 4.5, 4.5, 4.5])]})
    assert fast["goals"]["fewer_ratings_than_baselines"]["bestofn"]["mean"] == 16
    assert not fast["goals"]["fewer_ratings_than_baselines"]["met"]
    # a tie on the held target goes to the higher final probe mean; no KTO, no best
    from reinf.bench.aggregate import best_kto
    tie = fake_report({"reinf": reinf, "kto@1e-4": kto48, "kto@1e-3": [fake_run(
        0, [2.0, 2.5, 3.0, 4.1, 4.2, 4.3, 4.6], mode=None)]})
    assert best_kto(tie["methods"]) == "kto@1e-3"
    assert fake_report({"reinf": reinf})["goals"]["fewer_ratings_than_baselines"][
        "kto_best"] is None


def test_best_of_n_summary_has_no_kl_or_training_figures():
    runs = [fake_bestofn(0, [2.0, 2.0, 4.2]), fake_bestofn(1, [2.0, 2.0, 4.6])]
    report = fake_report({"reinf": [fake_run(0, [2.0, 3.8, 4.4]), fake_run(1, [2.0, 4.4, 4.4])],
                          "bestofn": runs}, ratings=32)
    s = report["methods"]["bestofn"]["summary"]
    assert s["final_probe_mean_rating"]["mean"] == pytest.approx(4.4)
    assert s["ratings_to_target_held"]["values"] == [32, 32]
    assert s["final_kl"]["n"] == 0 and s["perplexity_change"]["mean"] == 0.0
    assert s["round_seconds"]["n"] == 0 and s["rounds_rollouts"]["n"] == 0


def test_table_shows_best_of_n_cost_and_every_kto_rate():
    reinf = [fake_run(0, [2.0, 3.8, 4.4])]
    report = fake_report({"reinf": reinf,
                          "kto@5e-6": [fake_run(0, [2.0, 2.0, 2.0], mode=None)],
                          "kto@1e-3": [fake_run(0, [2.0, 3.0, 4.1], mode=None)],
                          "bestofn": [fake_bestofn(0, [2.0, 2.0, 4.2])]}, ratings=32)
    report["methods"]["bestofn"]["settings"] = {"n": 4}
    report["methods"]["bestofn"]["cost"] = {
        "n": 4, "replies": 128, "samples": 512, "sample_seconds": 8.0,
        "one_sample_seconds": 2.0, "feature_seconds": 1.0, "seconds": 9.0,
        "ratio_to_one_sample": 4.5}
    text = format_table(report)
    assert "512 replies (4 x 128 probe prompts) sampled in 8.0 s" in text
    assert "= 9.0 s, 4.5x one sample" in text
    assert "points reranked: 1 of 2" in text
    assert "lr 5e-6: never held the target, final probe mean 2.00;" in text
    assert "lr 1e-3: held the target from 32 ratings, final probe mean 4.10 (best)" in text
    assert "the goals use the best, kto@1e-3" in text and "kto@1e-3 (best KTO) 32" in text
    assert re.search(r"\n  bestofn +seed 0: 1B\n", text)    # first sample, then reranked
    windows = text.split("Live windows")[1].split("\n\n")[0].splitlines()
    assert windows[-1].rstrip().endswith("-    -      - 1.300 1.500")   # no live ratings
    data = series(report)
    assert data["bestofn"]["kl"] == [None, None, None]
    svg = build_svg(data, report)
    assert svg.count("<polyline") == 7            # 4 probe curves, and KL for all but best-of-n


def test_choose_best_keeps_the_highest_pessimistic_score_or_the_first_sample():
    import torch

    from reinf.bench.baselines import Candidates, choose_best
    from reinf.training.rating_model import RatingModel

    # two identical heads on one feature (score 3 + x, no spread); probe reply 1's second
    # candidate is an empty reply, which has no feature row
    def model(consistency):
        return RatingModel(mu=torch.zeros(1), sd=torch.ones(1),
                           weights=torch.tensor([[1.0], [1.0]]), biases=torch.tensor([3.0, 3.0]),
                           strength=1.0, n=16, consistency=consistency).state_dict()
    replies = [[object()] * 3, [object()] * 3]
    rows = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 2)]          # (1, 1): an empty reply
    feats = torch.tensor([[-1.0], [1.5], [1.5], [0.5], [-0.5]])
    cands = Candidates(replies, feats, rows, [1.0, 1.0, 1.0], 0.1)
    pick = choose_best(model(0.6), cands, pessimism=0.5, min_consistency=0.3)
    assert pick.reranked and pick.chosen == [1, 0]           # a tie keeps the first of them
    assert pick.predicted[0] == pytest.approx([2.0, 4.5, 4.5])
    assert pick.predicted[1][1] is None                      # never chosen
    for state in (model(0.1), model(None), None):            # untrusted, undefined, none
        again = choose_best(state, cands, pessimism=0.5, min_consistency=0.3)
        assert again.chosen == [0, 0] and not again.reranked and again.predicted is None
    # the pessimism: a head that disagrees pulls a candidate down by 0.5 x its spread
    split = RatingModel(mu=torch.zeros(1), sd=torch.ones(1),
                        weights=torch.tensor([[2.0], [0.0]]), biases=torch.tensor([3.0, 3.0]),
                        strength=1.0, n=16, consistency=0.9).state_dict()
    one = Candidates([[object()] * 2], torch.tensor([[0.9], [0.5]]), [(0, 0), (0, 1)],
                     [1.0, 1.0], 0.1)
    # means 3.9 and 3.5, spreads 0.9 and 0.5: pessimistic 3.45 and 3.25; plain mean agrees
    assert choose_best(split, one, pessimism=0.5, min_consistency=0.3).chosen == [0]
    # with a strong pessimism the surer candidate wins: 3.9 - 2 x 0.9 < 3.5 - 2 x 0.5
    assert choose_best(split, one, pessimism=2.0, min_consistency=0.3).chosen == [1]


def test_the_cli_refuses_bad_best_of_and_kto_rates_before_loading_anything(invoke):
    result = invoke("bench", "learn", "--baselines", "bestofn", "--best-of", "1")
    assert result.exit_code == 2 and "--best-of" in result.output
    result = invoke("bench", "learn", "--baselines", "kto", "--kto-lr", "1e-4,fast")
    assert result.exit_code == 1 and "--kto-lr takes" in result.output
    result = invoke("bench", "learn", "--baselines", "kto", "--kto-lr", "1e-4,0.0001")
    assert result.exit_code == 1 and "distinct learning rates" in result.output
    help_text = invoke("bench", "learn", "--help").output
    assert "bestofn" in help_text and "5e-6,1e-4,1e-3" in help_text


@pytest.mark.parametrize("pairs_every", [0, 2, 3, 4])
@pytest.mark.parametrize("k", [1, 4, 8])
def test_served_replies_are_sampled_together_only_up_to_the_next_round_or_pair(pairs_every, k):
    """``before_round`` sizes the batches of served replies in ``run_method``'s loop: a
    stretch never spans a round (the model changes there) or a pair (its own path), and
    with no pairs it runs all the way to the round, so a round of k ratings is one batch."""
    from types import SimpleNamespace

    from reinf.bench.harness import before_round

    store = SimpleNamespace(waiting=0)
    store.ratings_waiting = lambda: store.waiting
    ctx = SimpleNamespace(store=store)
    plan = LearnPlan(ratings=40, train_after=k, pairs_every=pairs_every)
    left, last_round, stretches, size = 0, 0, [], 0
    for n in range(1, 41):
        is_pair = bool(pairs_every) and n % pairs_every == 0
        if not is_pair:
            if left == 0:
                size = left = before_round(ctx, plan, k, n, last_round)
                stretches.append([])
            stretches[-1].append(n)
            left -= 1
            store.waiting += 1
        elif left:  # a pair came inside a stretch
            raise AssertionError(f"pair {n} inside a stretch of {size}")
        due = (n - last_round >= k) if pairs_every else store.waiting >= k
        if due:
            assert left == 0, f"a round after {n} inside a stretch"
            last_round, store.waiting = n, 0
    assert sum(map(len, stretches)) == 40 - (40 // pairs_every if pairs_every else 0)
    if not pairs_every:
        assert [len(s) for s in stretches] == [k] * (40 // k)


# --- --merge: one comparison from runs spread over processes --------------------------------

def part(methods: dict[str, list[dict]], *, kto_lrs=(5e-6, 1e-4, 1e-3), rater="prefers-terse",
         base=2.0) -> dict:
    """The report of one process of a split comparison, as `bench learn --json` prints it."""
    plan = LearnPlan(ratings=96, train_after=16, kto_lrs=kto_lrs)
    seeds = sorted({r["seed"] for runs in methods.values() for r in runs})
    bases = {**BASE, "probe_mean_rating": base}
    report = {"benchmark": "learn", "rater": {"name": rater, "description": rater},
              "plan": {**plan.__dict__, "methods": list(methods)}, "seeds": seeds,
              "machine": "test", "model": {"name": "/tmp/x", "parameters": 1},
              "config": {"ppo": {"learning_rate": 1e-3}}, "base": bases, "base_curve": bases,
              "seconds": 10.0,
              "methods": {m: {"label": m, "settings": {}, **summarize_method(runs, plan, bases)}
                          for m, runs in methods.items()}}
    report["goals"] = check_goals(report)
    return report


UP = [2.0, 3.0, 4.0, 4.5, 4.5, 4.5, 4.5]        # held from 32
SLOW = [2.0, 2.5, 3.0, 3.5, 4.0, 4.2, 4.2]      # held from 64


def test_merge_pools_each_methods_seeds_and_takes_the_goals_again():
    from reinf.bench.learn import merge_reports

    whole = part({"reinf": [fake_run(0, UP), fake_run(1, SLOW)],
                  "kto@1e-4": [fake_run(0, SLOW, mode=None)],
                  "kto@1e-3": [fake_run(0, UP, mode=None)]})
    pieces = [("r0.json", part({"reinf": [fake_run(0, UP)]})),
              ("r1.json", part({"reinf": [fake_run(1, SLOW)]})),
              # one KTO rate a process: "kto" alone, its rate in the plan
              ("k4.json", part({"kto": [fake_run(0, SLOW, mode=None)]}, kto_lrs=(1e-4,))),
              ("k3.json", part({"kto": [fake_run(0, UP, mode=None)]}, kto_lrs=(1e-3,)))]
    merged = merge_reports(pieces)
    assert list(merged["methods"]) == ["reinf", "kto@1e-4", "kto@1e-3"]
    assert merged["seeds"] == [0, 1] and merged["plan"]["seeds"] == 2
    assert merged["plan"]["kto_lrs"] == [1e-4, 1e-3]
    assert merged["merged_from"] == ["r0.json", "r1.json", "k4.json", "k3.json"]
    for m in merged["methods"]:   # the same figures as one run of every method and seed
        assert merged["methods"][m]["summary"] == whole["methods"][m]["summary"]
        assert merged["methods"][m]["curve"] == whole["methods"][m]["curve"]
    assert merged["goals"] == whole["goals"]
    fewer = merged["goals"]["fewer_ratings_than_baselines"]
    assert fewer["kto_best"] == "kto@1e-3" and fewer["reinf"] == 48 and not fewer["met"]
    assert "kto@1e-3" in format_table(merged)
    # one KTO rate over all the pieces keeps the plain name
    alone = merge_reports([pieces[0], pieces[3]])
    assert list(alone["methods"]) == ["reinf", "kto"]


@pytest.mark.parametrize("change, said", [
    (lambda r: r["rater"].update(name="prefers-chatty"), "raters differ"),
    (lambda r: r["plan"].update(ratings=48), "--ratings differ"),
    (lambda r: r["plan"].update(probe=32), "--probe differ"),
    (lambda r: r["config"]["ppo"].update(learning_rate=3e-3), "configurations differ"),
    (lambda r: r["base"].update(probe_mean_rating=2.5), "probe means differ"),
    (lambda r: r["model"].update(parameters=2), "sizes differ"),
])
def test_merge_refuses_runs_that_are_not_one_comparison(change, said):
    from reinf.bench.learn import merge_reports
    from reinf.errors import BadInput

    other = part({"reinf": [fake_run(1, SLOW)]})
    change(other)
    with pytest.raises(BadInput) as e:
        merge_reports([("a.json", part({"reinf": [fake_run(0, UP)]})), ("b.json", other)])
    assert said in str(e.value) and "b.json and a.json" in str(e.value)
    assert "--seed" in e.value.fix


def test_merge_refuses_a_seed_twice_and_what_is_not_a_learn_report():
    from reinf.bench.learn import merge_reports
    from reinf.errors import BadInput

    a = part({"reinf": [fake_run(0, UP)], "rated": [fake_run(0, SLOW, mode="rated")]})
    b = part({"rated": [fake_run(0, SLOW, mode="rated")]})
    with pytest.raises(BadInput, match="seed 0 of rated is in both a.json and b.json"):
        merge_reports([("a.json", a), ("b.json", b)])
    for bad in ({"benchmark": "round"}, [1, 2], {"benchmark": "learn"}):
        with pytest.raises(BadInput, match="x.json is not a report of `reinf bench learn"):
            merge_reports([("a.json", a), ("x.json", bad)])
    with pytest.raises(BadInput, match="at least one report"):
        merge_reports([])


def test_kto_rows_become_a_dataset_without_pickling_the_table(monkeypatch):
    # datasets names a table built by from_list by pickling it, which fails under pyarrow 24
    # and 25 (every KTO round of a GPU lease died so): kto_dataset must not take that path.
    datasets = pytest.importorskip("datasets")
    from reinf.bench.baselines import kto_dataset

    def pickled(*args, **kwargs):
        raise AssertionError("the table was fingerprinted by pickling")

    monkeypatch.setattr(datasets.arrow_dataset, "generate_fingerprint", pickled)
    rows = [{"prompt": "<p>2+2?", "completion": "4", "label": True},
            {"prompt": "<p>hi", "completion": "no", "label": False}]
    data = kto_dataset(rows)
    assert data.to_list() == rows
    assert data._fingerprint == kto_dataset([dict(r) for r in rows])._fingerprint
    assert data._fingerprint != kto_dataset(rows[:1])._fingerprint
