"""`reinf bench speed`'s new rows with no model: the chat reply against llama.cpp (skipped
with one line when llama_cpp is missing, or when no GGUF is known), the round's stage clock,
and the report's lines. Nothing here needs llama.cpp or the real model."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from reinf.bench import llamacpp
from reinf.bench.roundchild import stage_seconds
from reinf.bench.speed import format_speed, graded_by_length, round_split
from reinf.config import Config


class FakeEngine:
    """Just what measure_chat_reply touches: prompts, params and replies of exact length."""

    def __init__(self):
        self.config = Config()
        self.asked = []

    def generation_params(self, **kw):
        return dict(kw)

    def build_prompt(self, history, message, *, max_new_tokens):
        return list(range(len(message.split()) + 3))

    def stream_prompt(self, ids, params, *, ignore_eos=False):
        self.asked.append((len(ids), params, ignore_eos))
        n = params["max_new_tokens"]
        reply = SimpleNamespace(reply_ids=[1] * n, ttft_ms=10.0, latency_ms=n * 20.0)
        return SimpleNamespace(wait=lambda: reply)


def test_chat_reply_without_llama_cpp_is_measured_and_says_how_to_install(monkeypatch,
                                                                         tmp_path):
    monkeypatch.setattr(llamacpp, "llama_cpp_available", lambda: False)
    monkeypatch.setattr(llamacpp, "fetch_gguf", lambda *a: pytest.fail("nothing to fetch"))
    engine = FakeEngine()
    c = llamacpp.measure_chat_reply(engine, tmp_path, ["What is a cloud?", "Hi"],
                                    new_tokens=8, repeats=2, threads=2)
    # one warm-up, then 2 repeats x 2 prompts; exactly new_tokens, EOS ignored, our settings
    assert len(engine.asked) == 5 and all(eos for _, _, eos in engine.asked)
    assert {p["temperature"] for _, p, _ in engine.asked} == {0.8}
    assert c["ours"] == {"ttft_ms": 10.0, "tokens_per_s": 50.0, "runs": 4}
    assert c["llamacpp"] is None and "ratio_tokens_per_s" not in c
    assert c["llamacpp_skipped"].startswith("llama_cpp is not installed: pip install "
                                            "'reinf[llamacpp]'")
    lines = llamacpp.format_chat_reply(c, "\n" + " " * 24)
    skipped = [ln for ln in lines if "llama.cpp" in ln]
    assert skipped == ["  llama.cpp             skipped: llama_cpp is not installed: pip "
                       "install 'reinf[llamacpp]' (compiles llama.cpp from source, several "
                       "minutes; CMAKE_ARGS=\"-DGGML_NATIVE=ON\" for this CPU)"]
    json.dumps(c)  # the --json form


def test_chat_reply_on_a_model_with_no_gguf_says_so(monkeypatch, tmp_path):
    monkeypatch.setattr(llamacpp, "llama_cpp_available", lambda: True)
    c = llamacpp.measure_chat_reply(FakeEngine(), tmp_path, ["Hi"], new_tokens=4, repeats=1,
                                    threads=1)
    assert c["llamacpp"] is None and "no GGUF file is known" in c["llamacpp_skipped"]


def test_a_pulled_named_model_is_known_by_its_provenance(tmp_path):
    assert llamacpp.known_gguf(tmp_path) is None
    (tmp_path / "reinf_model.json").write_text(json.dumps({"name": "smollm2-135m"}))
    model = llamacpp.known_gguf(tmp_path)
    assert model.name == "smollm2-135m" and model.source.member.endswith(".gguf")
    (tmp_path / "reinf_model.json").write_text(json.dumps({"name": "reinf-demo"}))
    assert llamacpp.known_gguf(tmp_path) is None          # built in: no GGUF


def test_stage_clock_runs_each_stage_to_the_next_one():
    marks = [("rewards", 0.0), ("load", 0.5), ("rating_model", 2.0), ("rollouts", 5.0),
             ("update", 9.0), ("gate", 19.0), ("checkpoint", 20.5)]
    assert stage_seconds(marks, 21.0) == {"rewards": 0.5, "load": 1.5, "rating_model": 3.0,
                                          "rollouts": 4.0, "update": 10.0, "gate": 1.5,
                                          "checkpoint": 0.5}
    assert stage_seconds([], 3.0) == {}


def test_ratings_graded_by_length_spread_over_the_scale():
    assert [graded_by_length("", "word " * n) for n in (3, 20, 40, 80, 200)] == [5, 4, 3, 2, 1]


def _report(daemon_round, chat_reply):
    model = {
        "model": "smollm2-135m", "model_name": "/m/smollm2-135m", "parameters": 134515008,
        "generation": {"engine": {"ttft_ms": 50.0, "tokens_per_s": 20.0},
                       "generate": {"ttft_ms": 60.0, "tokens_per_s": 18.0},
                       "ratio": {"ttft": 0.83, "tokens_per_s": 1.11}, "new_tokens": 32,
                       "runs": 4},
        "batched_sampling": None, "swap": {"pause_ms_new_adapter": 5.0,
                                           "pause_ms_switch": 0.1, "pause_ms_max": 6.0},
        "chat_while_training": {"idle": {"ttft_ms": 50.0}, "training": {"ttft_ms": 80.0,
                                                                        "replies": 3},
                                "ratio_ttft": 1.6, "ratio_tokens_per_s": 0.7,
                                "rated_turns": 8, "round_status": "succeeded",
                                "round_seconds": 100.0, "train_nice": 10,
                                "train_threads": 0},
        "ppo_round": {"samples": 8, "seconds_round": 10.0, "seconds_bare_fwd_bwd": 2.0,
                      "ratio_round_to_bare": 5.0, "ppo_epochs": 4, "batch_size": 8,
                      "threads": 2},
        "memory": {"peak_rss_serving_bytes": 10**9, "peak_rss_training_bytes": 2 * 10**9},
        "daemon_round": daemon_round, "chat_reply": chat_reply}
    return {"benchmark": "speed", "machine": "2 vCPU", "quick": False, "models": [model]}


def test_report_shows_the_round_split_the_answer_time_and_the_llama_cpp_ratio():
    metrics = {"mode": "rollouts", "bench_round_seconds": 150.0, "rating_model_seconds": 6.0,
               "rollout_seconds": 80.0, "scoring_seconds": 9.0, "update_seconds": 40.0,
               "rollouts": 32, "rollout_tokens": 3000, "samples": 40, "epochs_run": 4,
               "bench_stages": {"rewards": 0.1, "load": 3.0, "rating_model": 6.0,
                                "rollouts": 90.0, "update": 40.0, "gate": 7.5,
                                "checkpoint": 0.4}}
    split = round_split(metrics)
    assert (split["gate"], split["rollouts"], split["scoring"], split["seconds"]) == \
        (7.5, 80.0, 9.0, 150.0)
    assert split["batch"] == pytest.approx(1.0) and split["start"] == pytest.approx(3.0)
    daemon_round = {"ratings": 8, "status": "succeeded", "message": "round 1", "mode": "rollouts",
                    "mode_reason": "", "checkpoint_id": "c1", "child_seconds": 160.0,
                    "swap_pause_ms": 4.2, "seconds_rating_to_swap": 161.0,
                    "seconds_rating_to_first_token": 161.3, "seconds_rating_to_answer": 168.0,
                    "answer_checkpoint_id": "c1", "answer_tokens": 128, "train_nice": 10,
                    "train_threads": 0, "round": split}
    chat_reply = {"new_tokens": 128, "temperature": 0.8, "top_p": 0.95, "threads": 2,
                  "ours": {"ttft_ms": 40.0, "tokens_per_s": 25.0, "runs": 4},
                  "llamacpp": {"ttft_ms": 10.0, "tokens_per_s": 100.0, "runs": 4,
                               "gguf": "SmolLM2-135M-Instruct.Q4_1.gguf", "version": "0.3.9"},
                  "llamacpp_skipped": None, "ratio_tokens_per_s": 0.25, "ratio_ttft": 4.0}
    text = format_speed(_report(daemon_round, chat_reply))
    assert "training round        150.0 s, rollouts mode, after 8 ratings" in text
    assert "[goal ≤ 120: missed]" in text
    assert ("imports 3.0, reading ratings 0.1, loading 3.0, rating model 6.0, rollouts 80.0, "
            "scoring 9.0, batch 1.0, PPO update 40.0, gate 7.5, checkpoint 0.4 s") in text
    assert "8th rating to the new checkpoint's first token 161.3 s" in text
    assert "[goal ≤ 180: met]" in text and "swap pause 4.2 ms" in text
    assert "chat reply            25.0 tok/s" in text and "[goal ≥ 15: met]" in text
    assert "ours/llama.cpp tokens/s 0.25, first token 4.00" in text


def test_report_says_when_no_new_checkpoint_answered():
    daemon_round = {"ratings": 8, "status": "rejected", "message": "round rejected: KL",
                    "mode": "rated", "mode_reason": "cold start: 3 of the 8 ratings",
                    "child_seconds": 50.0, "seconds_rating_to_answer": None, "train_nice": 10,
                    "train_threads": 0, "round": round_split({"seconds": 45.0})}
    text = format_speed(_report(daemon_round, None))
    assert "rating -> answer      no new checkpoint answered: rejected (round rejected: KL)" \
        in text
    assert "cold start: 3 of the 8 ratings" in text and "chat reply" not in text


def test_a_model_named_to_speed_brings_its_own_defaults(tmp_path, monkeypatch):
    """`reinf bench speed --model reinf-demo` under a config of smollm2-135m measures the
    demo model at its own settings, not the configured model's."""
    from reinf.bench.speed import child_config

    config = tmp_path / "config.yaml"
    config.write_text('model:\n  model_path: "smollm2-135m"\n', encoding="utf-8")
    monkeypatch.setenv("REINF_HOME", str(tmp_path))
    configured = child_config(str(config), "demo")
    assert configured.model.model_path == "smollm2-135m"
    assert configured.generation.max_new_tokens == 192  # smollm2-135m's own
    demo = child_config(str(config), "reinf-demo")
    assert demo.model.model_path == "reinf-demo"
    assert demo.generation.max_new_tokens == 128 and demo.ppo.kl_loss_coef == 0.05
    monkeypatch.setenv("REINF_MAX_NEW_TOKENS", "64")  # what the person set still wins
    assert child_config(str(config), "reinf-demo").generation.max_new_tokens == 64
