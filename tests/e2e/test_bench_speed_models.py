"""`reinf bench speed --model PATH` on any causal LM: a tiny GPT-2, whose attention uses
transformers' Conv1D instead of nn.Linear, measured end to end, and its random adapters.
No test asserts a speed."""
from __future__ import annotations

import json

import pytest
import torch

from tiny import build_chat_tokenizer, save_causal_lm

pytestmark = pytest.mark.e2e

PLAIN = ("{%- for m in messages -%}{%- if m['role'] == 'assistant' -%}"
         "{{- 'Assistant: ' + m['content'] + '<|endoftext|>\\n' -}}"
         "{%- else -%}{{- 'User: ' + m['content'] + '\\n' -}}{%- endif -%}{%- endfor -%}"
         "{%- if add_generation_prompt -%}{{- 'Assistant:' -}}{%- endif -%}")


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = build_chat_tokenizer(PLAIN, ["<|endoftext|>"], eos="<|endoftext|>",
                               pad="<|endoftext|>")
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    config = GPT2Config(vocab_size=len(tok), n_embd=64, n_layer=2, n_head=4, n_positions=256,
                        eos_token_id=eos, bos_token_id=eos, pad_token_id=eos)
    return save_causal_lm(tmp_path_factory.mktemp("zoo") / "tiny-gpt2", GPT2LMHeadModel,
                          config, tok, eos_ids=[eos])


def test_speed_measures_a_gpt2_model_by_path_and_names_it(invoke, gpt2_dir):
    from transformers import AutoModelForCausalLM

    from reinf.bench.speed import format_speed

    result = invoke("bench", "speed", "--model", gpt2_dir, "--quick", "--json",
                    "--threads", "1")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [m["model"] for m in report["models"]] == [str(gpt2_dir)]  # not the demo model
    gpt2 = report["models"][0]
    n = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(gpt2_dir).parameters())
    assert gpt2["model_name"] == str(gpt2_dir) and gpt2["parameters"] == n
    assert gpt2["generation"]["engine"]["tokens_per_s"] > 0
    swap = gpt2["swap"]                                     # Conv1D adapters were swapped in
    assert swap["swaps"] > 0 and swap["pause_ms_max"] >= swap["pause_ms_new_adapter"] > 0
    assert gpt2["ppo_round"]["samples"] == 16
    assert gpt2["chat_while_training"]["round_status"] == "succeeded"
    text = format_speed(report)
    assert f"\n{gpt2_dir} ({n:,} parameters)\n" in text


def test_random_adapter_fits_conv1d_layers(gpt2_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from reinf.bench.generation import build_random_adapter

    model = AutoModelForCausalLM.from_pretrained(gpt2_dir).eval()
    path = build_random_adapter(model, tmp_path / "adapter", r=4, alpha=8, scale=0.5)
    saved = json.loads((path / "adapter_config.json").read_text())
    assert saved["target_modules"] == ["c_attn"] and saved["fan_in_fan_out"] is True
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        before = model(ids).logits
        adapted = PeftModel.from_pretrained(model, str(path))
        after = adapted(ids).logits
    assert not torch.allclose(before, after)   # loaded without a mismatch, and it acts
    # A second adapter built on the already-wrapped model selects the same layers.
    again = build_random_adapter(adapted.get_base_model(), tmp_path / "again", seed=1)
    assert json.loads((again / "adapter_config.json").read_text())["target_modules"] \
        == ["c_attn"]


def test_model_and_models_choose_what_is_measured(invoke, monkeypatch, gpt2_dir, tmp_path):
    import reinf.bench.speed as speed

    asked = []
    monkeypatch.setattr(speed, "run_speed", lambda config, names, **kw: asked.append(
        (names, kw["turns"])) or {"models": []})
    for args in (["--quick"], ["--models", "demo,0.5b"], ["--model", gpt2_dir],
                 ["--model", f"{gpt2_dir},{tmp_path}", "--model", "x/y"],
                 ["--models", "0.5b", "--model", gpt2_dir, "--quick"]):
        assert invoke("bench", "speed", "--json", *args).exit_code == 0
    assert asked == [(["demo"], 16), (["demo", "0.5b"], 64), ([str(gpt2_dir)], 64),
                     ([str(gpt2_dir), str(tmp_path), "x/y"], 64),
                     (["0.5b", str(gpt2_dir)], 16)]


def test_unknown_names_and_missing_paths_are_refused_before_measuring(invoke, tmp_path):
    result = invoke("bench", "speed", "--models", "demo,gpt2")
    assert result.exit_code == 1 and "unknown model 'gpt2' for --models" in result.output
    assert "--model gpt2" in result.output
    result = invoke("bench", "speed", "--model", tmp_path / "nothing-here")
    assert result.exit_code == 1 and f"no model at {tmp_path / 'nothing-here'}" in result.output
