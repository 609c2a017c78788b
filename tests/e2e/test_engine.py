"""The engine on tiny random Qwen2 models (and the demo model when it is built), on the CPU."""
from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import pytest
import torch
from enginekit import hold_after_first_token

from reinf.catalog import PROJECT_ROOT
from reinf.errors import BadInput, ModelError
from reinf.model.modeling import load_model, render_chat
from reinf.serving.engine import Engine
from tiny import make_adapter, make_tiny_model

pytestmark = [pytest.mark.e2e, pytest.mark.stack]  # see pyproject.toml's markers
DEMO = PROJECT_ROOT / "models" / "reinf-demo"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    tiny = make_tiny_model(root / "tiny", seed=0)
    return {"tiny": tiny,
            "a": make_adapter(tiny, root / "ckpt-a", seed=1),
            "b": make_adapter(tiny, root / "ckpt-b", seed=2),
            "c": make_adapter(tiny, root / "ckpt-c", seed=3),
            "other": make_adapter(make_tiny_model(root / "wide", hidden_size=48),
                                  root / "ckpt-other", seed=4)}


@pytest.fixture
def engine(models, config):
    return Engine.load(config.replace(model_path=str(models["tiny"]), max_new_tokens=12))


def reforward(model, prompt_ids, reply_ids, temperature):
    """Behaviour log-probs recomputed the way PPO does: one pass, no cache, fp32."""
    ids = torch.tensor([prompt_ids + reply_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1:-1].float()  # (R, V)
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(-1, torch.tensor(reply_ids)[:, None])[:, 0]  # (R,)


def fresh_model(path, adapter=None):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return PeftModel.from_pretrained(model, str(adapter)).eval() if adapter else model


# --- log-prob fidelity ------------------------------------------------------------------------

def test_stored_logprobs_are_reproduced_by_a_plain_forward(engine, models):
    reply = engine.generate([("Hello", "Hi there")], "Why is the sky blue?", temperature=0.7,
                            top_p=0.9, max_new_tokens=16, seed=3)
    assert len(reply.reply_ids) == len(reply.logprobs) > 0 and reply.checkpoint_id is None
    again = reforward(fresh_model(models["tiny"]), reply.prompt_ids, reply.reply_ids, 0.7)
    assert torch.allclose(again, torch.tensor(reply.logprobs), atol=1e-4, rtol=0)
    # the stored value is log_softmax(logits / T): under T = 1 it would be different
    plain = reforward(fresh_model(models["tiny"]), reply.prompt_ids, reply.reply_ids, 1.0)
    assert (plain - torch.tensor(reply.logprobs)).abs().max() > 1e-3


def test_logprobs_under_an_adapter_are_reproduced_with_that_adapter(engine, models):
    engine.request_swap("ckpt-a", models["a"])
    reply = engine.generate([], "Tell me about the sea", temperature=1.3, max_new_tokens=16,
                            seed=5)
    assert reply.checkpoint_id == "ckpt-a"
    stored = torch.tensor(reply.logprobs)
    with_adapter = reforward(fresh_model(models["tiny"], models["a"]), reply.prompt_ids,
                             reply.reply_ids, 1.3)
    assert torch.allclose(with_adapter, stored, atol=1e-4, rtol=0)
    base = reforward(fresh_model(models["tiny"]), reply.prompt_ids, reply.reply_ids, 1.3)
    assert (base - stored).abs().max() > 1e-3


# --- streaming, stopping, context -------------------------------------------------------------

def test_the_stream_is_the_reply(engine):
    stream = engine.stream([], "Hello", max_new_tokens=12, seed=1)
    deltas = list(stream)
    reply = stream.reply
    assert "".join(deltas) == reply.text
    assert reply.finish_reason in ("length", "stop") and not reply.interrupted
    assert 0 < reply.ttft_ms <= reply.latency_ms
    assert reply.gen_params == {"temperature": 0.8, "top_p": 0.95, "max_new_tokens": 12,
                                "seed": 1}


def test_a_reply_stops_between_tokens_on_request(engine, monkeypatch):
    gate, held = hold_after_first_token(engine, monkeypatch)
    stream = engine.stream([], "Hello", max_new_tokens=50)
    assert held.wait(10)
    stream.stop()
    gate.set()
    reply = stream.wait(10)
    assert reply.interrupted and reply.finish_reason == "interrupted"
    assert len(reply.reply_ids) == len(reply.logprobs) == 2  # the token in flight completes


def test_a_reply_stops_at_eos(engine, monkeypatch):
    eos, forward, steps = next(iter(engine.eos_ids)), engine.model.forward, []

    def eos_on_third_step(*args, **kwargs):  # the model "decides" to stop at token 3
        out = forward(*args, **kwargs)
        steps.append(1)
        if len(steps) == 3:
            out.logits[..., eos] += 1000
        return out
    monkeypatch.setattr(engine.model, "forward", eos_on_third_step)
    reply = engine.generate([], "Hello", max_new_tokens=12, seed=0)
    assert reply.finish_reason == "stop" and len(reply.reply_ids) == 3
    assert reply.reply_ids[-1] == eos and eos not in reply.reply_ids[:-1]
    assert reply.text == engine.tokenizer.decode(reply.reply_ids, skip_special_tokens=True)


def test_history_goes_through_the_template_and_is_trimmed(models, config):
    engine = Engine.load(config.replace(model_path=str(models["tiny"]), max_context_tokens=160,
                                        max_new_tokens=16))
    history = [(f"Question {i}: what is the weather like?", f"Answer {i}: it is sunny.")
               for i in range(8)]
    reply = engine.generate(history, "And tomorrow?")
    tok = engine.tokenizer
    fits = [k for k in range(9) if len(render_chat(tok, history[8 - k:], "And tomorrow?"))
            + 16 <= 160]
    assert 0 < max(fits) < 8
    assert reply.prompt_ids == render_chat(tok, history[8 - max(fits):], "And tomorrow?")
    text = tok.decode(reply.prompt_ids)
    assert text.startswith("<|im_start|>user\nQuestion") and "Question 0" not in text
    assert text.endswith("<|im_start|>user\nAnd tomorrow?<|im_end|>\n<|im_start|>assistant\n")


# --- hot-swap -------------------------------------------------------------------------------

def test_swapping_changes_the_next_reply_and_its_checkpoint_id(engine, models):
    prompt = engine.build_prompt([], "Hello")
    params = engine.generation_params(seed=11, max_new_tokens=8)
    base = engine.stream_prompt(prompt, params).wait()
    pause = engine.request_swap("ckpt-a", models["a"])
    assert pause > 0 and engine.last_swap_pause_ms == pause
    under_a = engine.stream_prompt(prompt, params).wait()
    engine.request_swap("ckpt-b", models["b"])
    under_b = engine.stream_prompt(prompt, params).wait()
    assert (base.checkpoint_id, under_a.checkpoint_id, under_b.checkpoint_id) == \
        (None, "ckpt-a", "ckpt-b")
    assert base.logprobs[0] != under_a.logprobs[0] != under_b.logprobs[0]
    assert engine.describe()["active_checkpoint"] == "ckpt-b"
    assert engine.describe()["previous_checkpoint"] == "ckpt-a"
    engine.request_swap(None)  # back to the bare base: exactly the base model again
    assert engine.stream_prompt(prompt, params).wait().logprobs == base.logprobs


def test_a_swap_requested_during_a_reply_waits_for_its_end(engine, models, monkeypatch):
    gate, held = hold_after_first_token(engine, monkeypatch)
    stream = engine.stream([], "Hello", max_new_tokens=6)
    assert held.wait(10)  # the reply is under way, held after its first token
    swapped = threading.Event()
    waiter = threading.Thread(target=lambda: (engine.request_swap("ckpt-a", models["a"]),
                                              swapped.set()))
    waiter.start()
    deadline = time.monotonic() + 10
    while engine.describe()["swaps_waiting"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.describe()["swaps_waiting"] == 1   # requested, and it waits for the reply
    assert not swapped.is_set() and waiter.is_alive()
    assert engine.active_checkpoint_id is None
    gate.set()
    reply = stream.wait(30)
    assert swapped.wait(10) and engine.active_checkpoint_id == "ckpt-a"
    assert reply.checkpoint_id is None and len(reply.reply_ids) > 1
    assert engine.generate([], "Hello", max_new_tokens=4).checkpoint_id == "ckpt-a"


def test_a_swap_without_waiting_lands_between_replies(engine, models, monkeypatch):
    gate, held = hold_after_first_token(engine, monkeypatch)
    stream = engine.stream([], "Hello", max_new_tokens=6)
    assert held.wait(10)
    assert engine.request_swap("ckpt-b", models["b"], wait=False) is None
    assert engine.active_checkpoint_id is None
    gate.set()
    assert stream.wait(30).checkpoint_id is None
    assert engine.active_checkpoint_id == "ckpt-b"
    assert engine.generate([], "Hello", max_new_tokens=4).checkpoint_id == "ckpt-b"


def test_back_to_the_previous_adapter_and_at_most_two_adapters_kept(engine, models):
    with pytest.raises(BadInput):  # not loaded, and no directory to read it from
        engine.request_swap("ckpt-b")
    prompt = engine.build_prompt([], "Hello")
    params = engine.generation_params(seed=4, max_new_tokens=4)
    engine.request_swap("ckpt-a", models["a"])
    engine.request_swap("ckpt-b", models["b"])
    under_b = engine.stream_prompt(prompt, params).wait()
    engine.request_swap("ckpt-c", models["c"])
    assert set(engine._adapters.names) == {"ckpt-b", "ckpt-c"}  # ckpt-a was dropped
    engine.request_swap("ckpt-b")  # the previous one is still loaded: no directory needed
    again = engine.stream_prompt(prompt, params).wait()
    assert (again.checkpoint_id, again.logprobs) == ("ckpt-b", under_b.logprobs)
    engine.request_swap("ckpt-c")
    assert engine.describe()["previous_checkpoint"] == "ckpt-b"


def test_a_broken_checkpoint_changes_nothing(engine, models, tmp_path):
    engine.request_swap("ckpt-a", models["a"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="no adapter_config.json"):
        engine.request_swap("ckpt-x", tmp_path / "empty")
    with pytest.raises(ModelError, match="does not fit this model"):
        engine.request_swap("ckpt-other", models["other"])
    assert engine.active_checkpoint_id == "ckpt-a"
    assert engine.generate([], "Hello", max_new_tokens=3).checkpoint_id == "ckpt-a"


def test_out_of_memory_becomes_a_clear_error_and_the_engine_lives_on(engine, monkeypatch):
    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    monkeypatch.setattr(engine.model, "forward", oom)
    with pytest.raises(ModelError, match="out of memory while generating") as err:
        engine.generate([], "Hello")
    assert "smaller model" in err.value.fix
    monkeypatch.undo()
    assert engine.generate([], "Hello", max_new_tokens=2).reply_ids


def test_concurrent_replies_are_serialised_and_do_not_mix(engine):
    prompt = engine.build_prompt([], "Hello")
    alone = {seed: engine.stream_prompt(prompt, engine.generation_params(seed=seed)).wait()
             for seed in (1, 2, 3)}
    together = {}
    threads = [threading.Thread(target=lambda s=seed: together.update(
        {s: engine.stream_prompt(prompt, engine.generation_params(seed=s)).wait()}))
        for seed in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for seed in (1, 2, 3):
        assert together[seed].reply_ids == alone[seed].reply_ids
        assert together[seed].logprobs == alone[seed].logprobs


# --- loading ----------------------------------------------------------------------------------

def test_a_hub_id_loads_through_the_same_path(models, config, tmp_path, monkeypatch):
    """A hub id resolves from the local Hugging Face cache, offline, like a real download."""
    from huggingface_hub import constants

    repo = tmp_path / "hub" / "models--tiny-org--tiny-chat"
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(models["tiny"], repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    engine = Engine.load(config.replace(model_path="tiny-org/tiny-chat", max_new_tokens=4))
    assert engine.describe()["model_name"] == "tiny-org/tiny-chat"
    local = Engine.load(config.replace(model_path=str(models["tiny"]), max_new_tokens=4))
    a, b = (e.generate([], "Hello", seed=2) for e in (engine, local))
    assert (a.prompt_ids, a.reply_ids, a.logprobs) == (b.prompt_ids, b.reply_ids, b.logprobs)
    with pytest.raises(ModelError, match="cannot fetch 'tiny-org/absent': the Hugging Face "
                                         "hub is out of reach") as err:
        load_model(config.replace(model_path="tiny-org/absent"))
    assert "a model directory" in err.value.fix


def test_tiny_models_can_share_another_models_tokenizer(models, config, tmp_path):
    copy = make_tiny_model(tmp_path / "copy", seed=5, vocab_source=models["tiny"])
    assert (copy / "tokenizer.json").read_text() == (models["tiny"] / "tokenizer.json").read_text()
    loaded = load_model(config.replace(model_path=str(copy)))
    assert loaded.model.config.vocab_size == len(loaded.tokenizer)
    assert loaded.tokenizer.chat_template


def test_damaged_weights_are_named(models, config, tmp_path):
    broken = Path(shutil.copytree(models["tiny"], tmp_path / "broken"))
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError) as err:
        load_model(config.replace(model_path=str(broken)))
    assert f"the weights file {broken / 'model.safetensors'} is damaged" in str(err.value)


def test_remote_code_is_off_unless_configured(models, config, tmp_path):
    custom = Path(shutil.copytree(models["tiny"], tmp_path / "custom"))
    cfg = json.loads((custom / "config.json").read_text())
    cfg.update(model_type="reinf-custom", architectures=["XModel"],
               auto_map={"AutoConfig": "configuration_x.XConfig",
                         "AutoModelForCausalLM": "modeling_x.XModel"})
    (custom / "config.json").write_text(json.dumps(cfg))
    (custom / "configuration_x.py").write_text("raise RuntimeError('remote code ran')\n")
    with pytest.raises(ModelError, match="needs its own model code") as err:
        load_model(config.replace(model_path=str(custom)))
    assert "trust_remote_code: true" in err.value.fix


def test_quantization_without_cuda_loads_unquantized_and_says_so(models, config, store):
    from reinf.daemon.status import collect_status

    cfg = config.replace(model_path=str(models["tiny"]), quantization="4bit")
    engine = Engine.load(cfg)
    d = engine.describe()
    assert (d["device_in_use"], d["dtype"], d["quantization_in_use"]) == \
        ("cpu", "float32", "none")
    assert any("4bit needs CUDA" in w for w in engine.warnings)
    status = collect_status(cfg, store, engine=engine)
    assert status["model"]["quantization_in_use"] == "none"
    assert any("4bit needs CUDA" in w for w in status["warnings"])
    assert engine.generate([], "Hello", max_new_tokens=2).reply_ids


# --- the demo model ---------------------------------------------------------------------------

@pytest.mark.skipif(not (DEMO / "config.json").exists(), reason="the demo model is not built")
def test_the_demo_model_chats_with_faithful_logprobs(config):
    engine = Engine.load(config.replace(model_path="reinf-demo", max_new_tokens=48))
    reply = engine.generate([], "What is a cloud?", temperature=0.8, seed=0)
    assert reply.text.strip() and reply.checkpoint_id is None
    again = reforward(fresh_model(DEMO), reply.prompt_ids, reply.reply_ids, 0.8)
    assert torch.allclose(again, torch.tensor(reply.logprobs), atol=1e-4, rtol=0)


# --- the speed measurement (what `reinf bench speed` builds on) --------------------------------

def test_measure_generation_reports_every_figure(models, config):
    from reinf.bench.generation import format_result, measure_generation

    loaded = load_model(config.replace(model_path=str(models["tiny"])))
    result = measure_generation(loaded, ["Hello", "Why is the sky blue?"], config=config,
                                max_new_tokens=4, repeats=1, swaps=2)
    assert result["new_tokens"] == 4 and result["runs"] == 2
    assert len(result["prompt_tokens"]) == 2 and result["parameters"] > 0
    for side in ("engine", "generate"):
        assert result[side]["ttft_ms"] > 0 and result[side]["tokens_per_s"] > 0
    assert result["ratio"]["tokens_per_s"] == pytest.approx(
        result["engine"]["tokens_per_s"] / result["generate"]["tokens_per_s"], rel=0.01)
    assert result["swap"]["swaps"] == 2 and result["swap"]["pause_ms_new_adapter"] > 0
    assert "tokens/s" in format_result(result)


def test_a_swap_to_an_adapter_evicted_while_it_waited_still_lands(engine, models):
    """ckpt-a is loaded (the previous adapter) when its swap is asked for, but swaps queued
    before it evict it before the lock frees: it is put back from its directory, not
    refused as "cannot load checkpoint"."""
    engine.request_swap("ckpt-a", models["a"])
    engine.request_swap("ckpt-b", models["b"])       # active b, previous a
    with engine._lock:                                # a reply is running
        engine.request_swap("ckpt-c", models["c"], wait=False)   # c, previous b: a evicted
        assert "ckpt-a" in engine._adapters            # ... but not yet
        engine.request_swap("ckpt-a", models["a"], wait=False)
    engine.request_swap("ckpt-a", models["a"])       # the lock is free: all applied
    assert engine.last_swap_error is None
    assert engine._adapters.active == "ckpt-a"
    assert engine.generate([], "Hello", max_new_tokens=4).checkpoint_id == "ckpt-a"


# --- several replies in one batch (Engine.replies) ---------------------------------------------

def test_a_batch_of_replies_gives_each_row_the_reply_it_would_get_alone(engine, models):
    """Prompts of different lengths share a batch by left padding: under near-greedy
    sampling (top_p keeps the top token) each row is the reply that prompt gets alone,
    and its stored log-probs are reproduced by a plain forward under the active adapter."""
    engine.request_swap("ckpt-a", models["a"])
    messages = ["Hi", "Why is the sky blue on a clear afternoon?", "Tell me about the sea"]
    params = engine.generation_params(temperature=0.8, top_p=1e-6, max_new_tokens=10, seed=1)
    prompts = [engine.build_prompt([], m) for m in messages]
    batch = engine.replies(prompts, params)
    alone = [engine.generate([], m, temperature=0.8, top_p=1e-6, max_new_tokens=10, seed=9)
             for m in messages]
    assert len({len(p) for p in prompts}) == 3
    assert [r.reply_ids for r in batch] == [r.reply_ids for r in alone]
    assert [r.text for r in batch] == [r.text for r in alone]
    assert {r.checkpoint_id for r in batch} == {"ckpt-a"}
    policy = fresh_model(models["tiny"], models["a"])
    for reply in batch:
        again = reforward(policy, reply.prompt_ids, reply.reply_ids, 0.8)
        assert torch.allclose(again, torch.tensor(reply.logprobs), atol=1e-4, rtol=0)


def test_a_batch_of_replies_is_seeded_and_refuses_a_prompt_that_does_not_fit(engine):
    params = engine.generation_params(temperature=1.2, max_new_tokens=12, seed=4)
    prompts = [engine.build_prompt([], m) for m in ("One", "Two", "Three")]
    first, second = engine.replies(prompts, params), engine.replies(prompts, params)
    assert [r.reply_ids for r in first] == [r.reply_ids for r in second]
    other = engine.replies(prompts, {**params, "seed": 5})
    assert [r.reply_ids for r in other] != [r.reply_ids for r in first]
    assert engine.replies([], params) == []
    too_long = [1] * engine.context_limit
    with pytest.raises(BadInput, match="exceeds the model's context"):
        engine.replies([prompts[0], too_long], params)
