"""`reinf bench learn` and `reinf bench speed` on the demo model, small and fast: the harness
works, the report is well formed, every method ran its rounds. No test asserts a speed."""
from __future__ import annotations

import importlib.util
import json
import statistics

import pytest
import trainkit as tk

pytestmark = pytest.mark.e2e
HAVE_TRL = importlib.util.find_spec("trl") is not None


restore_threads = pytest.fixture(autouse=True)(tk.threads_restored)


def run_learn(invoke, tmp_path, *args):
    plot = tmp_path / "learn.png"
    result = invoke("bench", "learn", "--json", "--threads", "1", "--heldout", "24", "--plot",
                    plot, *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), plot


def held_from(curve: list[dict], target: float) -> int | None:
    """The held target worked out here by hand: the first round from which every later probe
    mean stays at or above ``target``."""
    held = None
    for p in reversed(curve):
        if p["probe_mean_rating"] < target:
            break
        held = p["ratings"]
    return held


def test_learn_runs_every_method_on_each_seed(invoke, tmp_path):
    baselines = "rated,sft,kto" if HAVE_TRL else "rated,sft"
    report, plot = run_learn(invoke, tmp_path, "--ratings", "16", "--train-after", "8",
                             "--window", "8", "--seeds", "2", "--probe", "4",
                             "--final-probe", "6", "--target", "3.0", "--baselines", baselines,
                             "--kto-lr", "5e-6")
    methods = report["methods"]
    assert list(methods) == ["reinf", *baselines.split(",")]
    assert report["seeds"] == [0, 1] and report["plan"]["train_after"] == 8
    assert report["plan"]["heldout"] == 24  # --heldout reaches the plan
    assert report["rater"]["name"] == "prefers-terse"
    base = report["base_curve"]
    assert base["probe"] == 4 and report["base"]["probe"] == 6 and base["kl"] == 0
    for name, m in methods.items():
        runs = m["seeds"]
        assert [r["seed"] for r in runs] == [0, 1], name
        for r in runs:
            # A round after ratings 8 and 16, each swapped in, each followed by the probe.
            assert [x["after_ratings"] for x in r["rounds"]] == [8, 16], name
            assert all(x["status"] == "succeeded" for x in r["rounds"]), r["rounds"]
            assert all(x["swap_pause_ms"] is not None for x in r["rounds"])
            assert r["final"]["active_checkpoint"] == r["rounds"][-1]["checkpoint_id"]
            assert r["final"]["probe"] == 6 and all(x["steps"] > 0 for x in r["rounds"])
            if name != "kto":
                # The adapter moved. (KTO at TRL's recommended learning rate, 5e-6, moves it
                # by a KL of about 1e-9 in two rounds: below what the probe can resolve.)
                assert r["final"]["kl"] > 1e-7, name
            curve = r["curve"]
            assert [p["ratings"] for p in curve] == [0, 8, 16]
            assert curve[0]["probe_mean_rating"] == base["probe_mean_rating"]  # fixed probe
            assert [p["active_checkpoint"] for p in curve[1:]] == [
                x["checkpoint_id"] for x in r["rounds"]]
            assert all(p["probe"] == 4 and 1 <= p["probe_mean_rating"] <= 5 for p in curve)
            # Ratings to target read the probe curve; held is worked out here independently.
            assert r["ratings_to_target_held"] == held_from(curve, 3.0)
            first = next((p["ratings"] for p in curve if p["probe_mean_rating"] >= 3.0), None)
            assert r["ratings_to_target"] == first
            assert len(r["scores"]) == 16 and set(r["scores"]) <= {1, 5}
            assert [w["ratings"] for w in r["windows"]] == [0, 8, 16]
            for w, chunk in zip(r["windows"][1:], (r["scores"][:8], r["scores"][8:])):
                assert w["mean_rating"] == pytest.approx(statistics.fmean(chunk))
                assert w["perplexity"] > 1 and w["perplexity_preferred"] > 1
            assert r["data_dir"] is None                       # temporary data dirs are removed
        # The headline figures: mean, min and max of the per-seed values.
        s = m["summary"]
        for key, value in (("final_kl", lambda r: r["final"]["kl"]),
                           ("final_probe_mean_rating", lambda r: r["final"]["probe_mean_rating"]),
                           ("round_seconds", lambda r: r["round_seconds"])):
            values = [value(r) for r in runs]
            assert s[key]["values"] == values, key
            assert s[key]["mean"] == pytest.approx(statistics.fmean(values))
            assert (s[key]["min"], s[key]["max"]) == (min(values), max(values))
        held = [r["ratings_to_target_held"] for r in runs]
        assert s["ratings_to_target_held"]["values"] == held
        assert s["ratings_to_target_held"]["mean"] == (
            None if None in held else pytest.approx(statistics.fmean(held)))
        for i, point in enumerate(m["curve"]):
            values = [r["curve"][i]["probe_mean_rating"] for r in runs]
            assert point["probe_mean_rating"]["mean"] == pytest.approx(statistics.fmean(values))
            assert point["probe_mean_rating"]["min"] == min(values)
    # The identical stream: within a seed, until the first round every method saw the same
    # replies; the second seed's stream is another.
    for i in (0, 1):
        assert len({tuple(m["seeds"][i]["scores"][:8]) for m in methods.values()}) == 1
    # Reinf's default trainer fits a rating model and reports each round's mode; the rated
    # baseline is the same trainer on rated replies only, with no rating model.
    for r in methods["reinf"]["seeds"]:
        assert all(x["mode"] in ("rollouts", "rated") and "rating_model_consistency" in x
                   for x in r["rounds"])
    for r in methods["rated"]["seeds"]:
        assert [x["mode"] for x in r["rounds"]] == ["rated", "rated"]
        assert all("rating_model_consistency" not in x for x in r["rounds"])
    assert methods["rated"]["summary"]["rounds_rated"]["mean"] == 2
    assert methods["rated"]["settings"]["training_method"] == "rated"
    assert methods["sft"]["summary"]["rounds_rollouts"]["mean"] is None    # no modes
    if HAVE_TRL:
        assert methods["kto"]["settings"]["learning_rate"] == 5e-6
        assert methods["kto"]["settings"]["effective_batch"] >= 16
    assert set(report["goals"]) == {"rise_by_48", "share_by_96", "perplexity_preferred",
                                    "perplexity_general", "fewer_ratings_than_baselines",
                                    "rating_model_after_48"}
    # general-text perplexity is measured on the base, after each round and on each run's
    # final policy; the curve's first point is the base's own figure
    assert report["base"]["perplexity_general"] > 1
    for r in methods["reinf"]["seeds"]:
        assert r["final"]["perplexity_general"] > 1
        assert r["curve"][0]["perplexity_general"] == report["base"]["perplexity_general"]
        assert all(p["perplexity_general"] > 1 for p in r["curve"][1:]) and len(r["curve"]) > 1
    assert not report["goals"]["rise_by_48"]["met"]      # 16 ratings cannot show 48
    assert report["plot"] == str(plot) and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from reinf.bench.plot import format_table
    text = format_table(report)
    assert "Probe curve after each round" in text and "PPO on rated replies only" in text


def test_learn_is_deterministic_and_takes_a_rater_file(invoke, tmp_path):
    rater = tmp_path / "rater.py"
    rater.write_text("def rate(prompt, reply):\n    return 5 if reply.strip().endswith('?') "
                     "else 2\n")
    args = ("--ratings", "6", "--train-after", "3", "--window", "3", "--probe", "2",
            "--final-probe", "4", "--seeds", "1", "--baselines", "none",
            "--rater", f"{rater}:rate")
    first, _ = run_learn(invoke, tmp_path, *args)
    second, _ = run_learn(invoke, tmp_path, *args)
    a, b = first["methods"]["reinf"]["seeds"][0], second["methods"]["reinf"]["seeds"][0]
    assert first["rater"]["name"] == "rater.py:rate"
    assert set(a["scores"]) <= {2, 5}
    assert a["preferred"] == [int(s >= 4) for s in a["scores"]]   # no preferred(): rated 4-5
    assert a["scores"] == b["scores"]
    assert [p["probe_mean_rating"] for p in a["curve"]] == [
        p["probe_mean_rating"] for p in b["curve"]]
    assert a["final"]["kl"] == pytest.approx(b["final"]["kl"], rel=1e-4, abs=1e-7)
    assert [r["status"] for r in a["rounds"]] == ["succeeded", "succeeded"]


def test_learn_skip_reinf_runs_a_baseline_alone_with_the_same_figures(invoke, tmp_path):
    """--skip-reinf spreads one comparison over processes: a baseline run alone gives
    exactly what it gives beside Reinf (same stream, probe and seeds)."""
    args = ("--ratings", "6", "--train-after", "3", "--window", "3", "--probe", "2",
            "--final-probe", "4", "--seeds", "1", "--baselines", "rated")
    both, _ = run_learn(invoke, tmp_path, *args)
    alone, _ = run_learn(invoke, tmp_path, *args, "--skip-reinf")
    assert list(both["methods"]) == ["reinf", "rated"] and list(alone["methods"]) == ["rated"]
    a, b = both["methods"]["rated"]["seeds"][0], alone["methods"]["rated"]["seeds"][0]
    assert a["scores"] == b["scores"]
    assert [p["probe_mean_rating"] for p in a["curve"]] == [
        p["probe_mean_rating"] for p in b["curve"]]
    assert alone["base"]["probe_mean_rating"] == both["base"]["probe_mean_rating"]
    assert alone["goals"] == {}  # the goals are Reinf's
    from reinf.bench.plot import format_table
    assert "PPO on rated replies only" in format_table(alone)
    for baselines, said in (("none", "no method to run"), ("bestofn", "Reinf must run too")):
        result = invoke("bench", "learn", "--skip-reinf", "--baselines", baselines)
        assert result.exit_code == 1 and said in result.output, result.output


def test_learn_merge_makes_one_comparison_of_runs_in_separate_processes(invoke, tmp_path):
    """Seeds and baselines run apart (--seed, --skip-reinf) and --merge pools their JSON into
    the report one process running everything would have given."""
    args = ("--ratings", "6", "--train-after", "3", "--window", "3", "--probe", "2",
            "--final-probe", "4")
    whole, _ = run_learn(invoke, tmp_path, *args, "--seeds", "2", "--baselines", "sft")
    files = []
    for i, extra in enumerate([("--seed", "0", "--baselines", "none"),
                               ("--seed", "1", "--baselines", "none"),
                               ("--seeds", "2", "--skip-reinf", "--baselines", "sft")]):
        part, _ = run_learn(invoke, tmp_path, *args, "--seeds", "1", *extra)
        files += ["--merge", tmp_path / f"part{i}.json"]
        files[-1].write_text(json.dumps(part))
    plot = tmp_path / "merged.png"
    result = invoke("bench", "learn", *files, "--json", "--plot", plot)
    assert result.exit_code == 0, result.output
    merged = json.loads(result.stdout)
    assert list(merged["methods"]) == ["reinf", "sft"] and merged["seeds"] == [0, 1]
    for m in ("reinf", "sft"):
        a, b = merged["methods"][m], whole["methods"][m]
        assert [r["scores"] for r in a["seeds"]] == [r["scores"] for r in b["seeds"]]
        assert [p["probe_mean_rating"] for p in a["curve"]] == [
            p["probe_mean_rating"] for p in b["curve"]]
        assert a["summary"]["final_probe_mean_rating"]["mean"] == pytest.approx(
            b["summary"]["final_probe_mean_rating"]["mean"])
    assert set(merged["goals"]) == set(whole["goals"]) and plot.is_file()
    text = invoke("bench", "learn", *files, "--plot", plot)
    assert text.exit_code == 0 and "reward-weighted SFT" in text.output
    # what --merge cannot use is refused, with the fix
    result = invoke("bench", "learn", *files, "--rater", "prefers-chatty")
    assert result.exit_code == 1 and "--merge runs nothing, so --rater" in result.output
    result = invoke("bench", "learn", *files[:4], "--plot", plot)   # seeds 0 and 1: fine
    assert result.exit_code == 0, result.output
    result = invoke("bench", "learn", *files[:2], *files[:2])
    assert result.exit_code == 1 and "seed 0 of reinf is in both" in result.output
    cut = tmp_path / "cut.json"
    cut.write_text("")                     # a run killed before its end printed nothing
    result = invoke("bench", "learn", "--merge", cut)
    assert result.exit_code == 1 and "cut.json is not JSON" in result.output
    assert "Traceback" not in result.output


def test_learn_refuses_a_bad_rater_or_baseline_before_loading_anything(invoke):
    result = invoke("bench", "learn", "--rater", "prefers-nothing", "--baselines", "none")
    assert result.exit_code == 1 and "unknown rater" in result.output
    result = invoke("bench", "learn", "--baselines", "rated,reinf")
    assert result.exit_code == 1 and "unknown baseline 'reinf'" in result.output


def test_speed_quick_reports_every_figure(invoke, capfd):
    result = invoke("bench", "speed", "--quick", "--json", "--threads", "1")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["quick"] is True and [m["model"] for m in report["models"]] == ["demo"]
    demo = report["models"][0]
    gen = demo["generation"]
    for side in ("engine", "generate"):
        assert gen[side]["ttft_ms"] > 0 and gen[side]["tokens_per_s"] > 0
    assert gen["ratio"]["tokens_per_s"] == pytest.approx(
        gen["engine"]["tokens_per_s"] / gen["generate"]["tokens_per_s"], rel=0.01)
    # each stage's figures are printed as soon as measured (a run cut short still has them)
    progress = capfd.readouterr().err + (result.stderr or "")
    assert f"[speed] demo: engine {gen['engine']['tokens_per_s']:.1f} tokens/s" in progress
    swap = demo["swap"]
    assert swap["swaps"] > 0 and swap["pause_ms_max"] >= swap["pause_ms_new_adapter"] > 0
    rnd = demo["ppo_round"]
    assert rnd["samples"] == 16 and rnd["ratio_round_to_bare"] == pytest.approx(
        rnd["seconds_round"] / rnd["seconds_bare_fwd_bwd"], rel=0.01)
    chat = demo["chat_while_training"]
    assert chat["round_status"] == "succeeded" and chat["idle"]["replies"] > 0
    assert chat["during_round"]["replies"] >= chat["training"]["replies"]
    memory = demo["memory"]
    assert memory["peak_rss_serving_bytes"] > 10_000_000
    assert memory["peak_rss_training_bytes"] > 10_000_000
