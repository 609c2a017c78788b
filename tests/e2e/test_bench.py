"""`reinf bench learn` and `reinf bench speed` on the demo model, small and fast: the harness
works, the report is well formed, every method ran its rounds. No test asserts a speed."""
from __future__ import annotations

import importlib.util
import json
import statistics

import pytest

pytestmark = pytest.mark.e2e
HAVE_TRL = importlib.util.find_spec("trl") is not None


@pytest.fixture(autouse=True)
def one_thread():
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def run_learn(invoke, tmp_path, *args):
    plot = tmp_path / "learn.png"
    result = invoke("bench", "learn", "--json", "--threads", "1", "--plot", plot, *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), plot


def test_learn_runs_reinf_and_the_baselines_on_one_stream(invoke, tmp_path):
    baselines = "sft,kto" if HAVE_TRL else "sft"
    report, plot = run_learn(invoke, tmp_path, "--ratings", "16", "--train-after", "8",
                             "--window", "8", "--probe", "4", "--final-probe", "8",
                             "--baselines", baselines)
    methods = report["methods"]
    assert list(methods) == ["reinf", *baselines.split(",")]
    assert report["plan"]["train_after"] == 8 and report["rater"]["name"] == "prefers-terse"
    for name, r in methods.items():
        # Every method ran a round after ratings 8 and 16 and swapped its checkpoint in.
        assert [x["after_ratings"] for x in r["rounds"]] == [8, 16], name
        assert all(x["status"] == "succeeded" for x in r["rounds"]), r["rounds"]
        assert all(x["swap_pause_ms"] is not None for x in r["rounds"])
        assert r["final"]["active_checkpoint"] == r["rounds"][-1]["checkpoint_id"]
        assert r["final"]["kl"] > 0                          # the adapter moved the policy
        assert len(r["scores"]) == 16 and set(r["scores"]) <= {1, 5}
        windows = r["windows"]
        assert [w["ratings"] for w in windows] == [0, 8, 16]
        for w, chunk in zip(windows[1:], (r["scores"][:8], r["scores"][8:])):
            assert w["mean_rating"] == pytest.approx(statistics.fmean(chunk))
            assert 0 <= w["preferred_share"] <= 1 and w["perplexity"] > 1
            assert w["perplexity_preferred"] > 1   # the held-out replies in the rater's style
        assert r["data_dir"] is None                         # temporary data dirs are removed
        held = r["ratings_to_target_held"]
        assert held is None or (r["ratings_to_target"] is not None
                                and held >= r["ratings_to_target"])
    # The identical stream: until the first round every method saw the same replies.
    firsts = {tuple(r["scores"][:8]) for r in methods.values()}
    assert len(firsts) == 1
    # Only PPO has a critic; a baseline's zero value head predicts nothing.
    assert methods["sft"]["final"]["consistency_heldout"] is None
    assert methods["reinf"]["final"]["consistency_heldout"] is not None
    assert set(report["goals"]) == {"rise_by_120", "share_by_200", "perplexity",
                                    "fewer_ratings_than_baselines"}
    assert report["plot"] == str(plot) and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_learn_is_deterministic_and_takes_a_rater_file(invoke, tmp_path):
    rater = tmp_path / "rater.py"
    rater.write_text("def rate(prompt, reply):\n    return 5 if reply.strip().endswith('?') "
                     "else 2\n")
    args = ("--ratings", "6", "--train-after", "3", "--window", "3", "--probe", "2",
            "--final-probe", "4", "--baselines", "none", "--rater", f"{rater}:rate")
    first, _ = run_learn(invoke, tmp_path, *args)
    second, _ = run_learn(invoke, tmp_path, *args)
    a, b = first["methods"]["reinf"], second["methods"]["reinf"]
    assert first["rater"]["name"] == "rater.py:rate"
    assert set(a["scores"]) <= {2, 5}
    assert a["preferred"] == [int(s >= 4) for s in a["scores"]]   # no preferred(): rated 4-5
    assert a["scores"] == b["scores"]
    assert a["final"]["kl"] == pytest.approx(b["final"]["kl"], rel=1e-4, abs=1e-7)
    assert [r["status"] for r in a["rounds"]] == ["succeeded", "succeeded"]


def test_learn_refuses_a_bad_rater_before_loading_anything(invoke):
    result = invoke("bench", "learn", "--rater", "prefers-nothing", "--baselines", "none")
    assert result.exit_code == 1 and "unknown rater" in result.output


def test_speed_quick_reports_every_figure(invoke):
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
    assert demo["swap"]["pause_ms_new_adapter"] >= 0
    rnd = demo["ppo_round"]
    assert rnd["samples"] == 16 and rnd["ratio_round_to_bare"] == pytest.approx(
        rnd["seconds_round"] / rnd["seconds_bare_fwd_bwd"], rel=0.01)
    chat = demo["chat_while_training"]
    assert chat["round_status"] == "succeeded" and chat["idle"]["replies"] > 0
    assert chat["during_round"]["replies"] >= chat["training"]["replies"]
    memory = demo["memory"]
    assert memory["peak_rss_serving_bytes"] > 10_000_000
    assert memory["peak_rss_training_bytes"] > 10_000_000
