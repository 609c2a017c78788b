"""The memory plan of a round (reinf.model.memory) from config.json alone, the trainer's base
quantization it decides, and the trainer's refusal of fp16 on GPUs without bf16."""
from __future__ import annotations

import json
import struct

import pytest

from reinf.model.memory import (FITS, GIB, TIGHT, UNKNOWN, WONT, physical_memory, plan_memory,
                                trainer_quantization)
from reinf.model.shape import load_shape

pytestmark = pytest.mark.stack  # see pyproject.toml's markers

SHAPES = {  # (hidden, intermediate, layers, heads, kv heads, vocab, tied, context, type)
    "qwen2.5-0.5b": (896, 4864, 24, 14, 2, 151936, True, 32768, "qwen2"),
    "qwen2.5-1.5b": (1536, 8960, 28, 12, 2, 151936, True, 32768, "qwen2"),
    "llama-3-8b": (4096, 14336, 32, 32, 8, 128256, False, 8192, "llama"),
}
PUBLISHED = {"qwen2.5-0.5b": 0.49e9, "qwen2.5-1.5b": 1.54e9, "llama-3-8b": 8.03e9}


def write_model(root, name):
    h, i, layers, heads, kv, vocab, tied, context, kind = SHAPES[name]
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({
        "model_type": kind, "hidden_size": h, "intermediate_size": i,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv,
        "vocab_size": vocab, "tie_word_embeddings": tied, "max_position_embeddings": context}))
    return path


def plan(config, tmp_path, name, gib, *, device="cuda", bitsandbytes=True, **settings):
    cfg = config.replace(model_path=str(write_model(tmp_path, name)), **settings)
    return plan_memory(cfg, device=device, device_total_bytes=int(gib * GIB), bf16=True,
                       bitsandbytes=bitsandbytes)


@pytest.mark.parametrize("name", list(SHAPES))
def test_parameter_counts_from_config_json_match_the_published_sizes(tmp_path, name):
    shape, why = load_shape(str(write_model(tmp_path, name)))
    assert why is None
    assert shape.params == pytest.approx(PUBLISHED[name], rel=0.02)
    assert shape.linear_params < shape.params  # embeddings (and an untied head) stay out


# The three shapes in bf16 (server and trainer both unquantized), rows of 2048 tokens.
BF16 = {"training_base_quantization": "none", "max_context_tokens": 2048,
        "training_max_train_tokens": 2048}


@pytest.mark.parametrize("name,settings,on_24,on_80", [
    ("qwen2.5-0.5b", {"gradient_checkpointing": True}, FITS, FITS),
    ("qwen2.5-1.5b", {}, WONT, FITS),  # 8 rows x 2048 tokens without checkpointing
    ("llama-3-8b", {"gradient_checkpointing": True, "batch_size": 4}, WONT, FITS),
])
def test_verdicts_on_a_24_and_an_80_gib_gpu(config, tmp_path, name, settings, on_24, on_80):
    small = plan(config, tmp_path, name, 24, **BF16, **settings)
    large = plan(config, tmp_path, name, 80, **BF16, **settings)
    assert (small.verdict, large.verdict) == (on_24, on_80)
    assert small.peak_bytes == large.peak_bytes == small.server_bytes + small.trainer_bytes
    assert small.capacity_bytes == 24 * GIB
    assert (small.warning() is None) == (on_24 == FITS)


def test_the_8b_plan_in_bf16_on_24_gib(config, tmp_path):
    """The figures docs/training.md quotes: two bf16 copies of an 8B model are 30 GiB of
    weights alone, and the fix it gives fits when applied."""
    p = plan(config, tmp_path, "llama-3-8b", 24, **BF16, gradient_checkpointing=True,
             batch_size=4)
    assert p.server["weights"] == p.trainer["weights"] == 2 * p.params
    assert 15.8 * GIB < p.server_bytes < 16.0 * GIB and p.verdict == WONT
    assert p.fixes == ("quantization: 4bit and training.base_quantization: 4bit",)
    assert p.warning().endswith("which has 24.0 GiB: it will run out of memory — set "
                                "quantization: 4bit and training.base_quantization: 4bit")
    fixed = plan(config, tmp_path, "llama-3-8b", 24, max_context_tokens=2048,
                 gradient_checkpointing=True, batch_size=4, quantization="4bit")
    assert fixed.verdict == FITS and fixed.trainer_quantization == "4bit"  # auto follows it


def test_every_fix_offered_makes_the_plan_fit(config, tmp_path):
    p = plan(config, tmp_path, "qwen2.5-0.5b", 24, **BF16)
    assert p.verdict == WONT
    assert p.fixes[0] == "gradient_checkpointing: true"
    assert any(f.startswith("batch_size: ") for f in p.fixes)
    assert any(f.startswith("training.max_train_tokens: ") for f in p.fixes)
    for fix in p.fixes:
        key, value = fix.split(" (")[0].split(": ")
        changed = {**BF16, key: value}
        assert plan(config, tmp_path, "qwen2.5-0.5b", 24, **changed).verdict == FITS, fix


def test_tight_between_85_and_100_percent(config, tmp_path):
    p = plan(config, tmp_path, "llama-3-8b", 40, **BF16, gradient_checkpointing=True,
             batch_size=4)
    assert 0.85 < p.peak_bytes / p.capacity_bytes <= 1.0 and p.verdict == TIGHT
    assert p.warning().endswith("memory is tight — set training.base_quantization: 4bit, or "
                                "training.max_train_tokens: 768, or quantization: 4bit")


# --- training.base_quantization: auto ---------------------------------------------------------

AUTO = {"max_context_tokens": 2048, "training_max_train_tokens": 2048,
        "gradient_checkpointing": True, "batch_size": 4}


def test_auto_trains_on_4bit_beside_a_bf16_server_where_only_that_fits(config, tmp_path):
    """On 32 GiB an 8B bf16 server leaves no room for a bf16 trainer, but room for a 4-bit one."""
    p = plan(config, tmp_path, "llama-3-8b", 32, **AUTO)
    assert p.trainer_quantization == "4bit" and p.verdict in (FITS, TIGHT)
    assert p.server["weights"] == 2 * p.params          # the server stays bf16
    shape, _ = load_shape(p.model)  # NF4 decoder Linears; the rest fp32 (peft's k-bit prep)
    assert p.trainer["weights"] == int(shape.linear_params * 0.5625) \
        + (shape.params - shape.linear_params) * 4
    assert "training.base_quantization auto" in p.trainer_quantization_note
    assert "32.0 GiB" in p.trainer_quantization_note


@pytest.mark.parametrize("gib,device,bnb,why", [
    (80, "cuda", True, "an unquantized trainer fits"),
    (24, "cuda", True, "4-bit would not fit either: it would only train slower"),
    (32, "cuda", False, "no bitsandbytes"),
    (8, "cpu", True, "bitsandbytes needs CUDA"),
])
def test_auto_keeps_the_base_unquantized(config, tmp_path, gib, device, bnb, why):
    p = plan(config, tmp_path, "llama-3-8b", gib, device=device, bitsandbytes=bnb, **AUTO)
    assert p.trainer_quantization == "none", why
    assert p.trainer_quantization_note is None
    assert any("pip install 'reinf[cuda]'" in n for n in p.notes) == (not bnb)


def test_the_trainer_asks_the_plan_only_under_auto(config, tmp_path, monkeypatch):
    import reinf.model.memory

    model = str(write_model(tmp_path, "llama-3-8b"))
    monkeypatch.setattr(reinf.model.memory, "device_memory", lambda device: (32 * GIB, None))
    monkeypatch.setattr(reinf.model.memory, "_cuda_bf16", lambda: True)
    monkeypatch.setattr(reinf.model.memory, "_has_bitsandbytes", lambda: True)
    monkeypatch.setattr(reinf.model.memory, "planned_device", lambda setting: "cuda")
    auto = config.replace(model_path=model, **AUTO)
    quant, why = trainer_quantization(auto)
    assert quant == "4bit" and why.startswith("training.base_quantization auto: ")
    smaller = auto.replace(model_path=str(write_model(tmp_path, "qwen2.5-1.5b")))
    assert trainer_quantization(smaller) == ("none", None)  # an unquantized trainer fits
    assert trainer_quantization(auto.replace(training_base_quantization="8bit")) == ("8bit", None)
    assert trainer_quantization(auto.replace(training_base_quantization="none",
                                             quantization="4bit")) == ("none", None)


def test_load_base_loads_what_the_plan_chose_and_says_why(config, monkeypatch):
    import reinf.model.memory
    import reinf.model.modeling
    from reinf.training.session import load_base

    seen = {}

    def fake_load(cfg, *, device=None, for_training=False, quantization=None):
        seen.update(device=device, for_training=for_training, quantization=quantization)
        return reinf.model.modeling.LoadedModel(None, None, "cuda", None, quantization, "m", [])
    monkeypatch.setattr(reinf.model.modeling, "load_model", fake_load)
    monkeypatch.setattr(reinf.model.memory, "trainer_quantization",
                        lambda cfg: ("4bit", "training.base_quantization auto: why"))
    loaded = load_base(config, "cuda")
    assert seen == {"device": "cuda", "for_training": True, "quantization": "4bit"}
    assert loaded.warnings == ["training.base_quantization auto: why"]


# --- what cannot be planned ---------------------------------------------------------------

def test_a_hub_id_not_in_the_local_cache_is_unknown(config, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    p = plan_memory(config.replace(model_path="someone/not-downloaded-7b"), device="cpu")
    assert p.verdict == UNKNOWN and p.warning() is None
    assert p.summary() == "unknown (someone/not-downloaded-7b is not in the local Hugging " \
                          "Face cache)"


def test_a_hub_id_in_the_local_cache_is_read_from_there(config, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    snap = cache / "models--org--small" / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    (cache / "models--org--small" / "refs").mkdir()
    (cache / "models--org--small" / "refs" / "main").write_text("0" * 40)
    write_model(tmp_path, "qwen2.5-0.5b")
    (snap / "config.json").write_text((tmp_path / "qwen2.5-0.5b" / "config.json").read_text())
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    shape, why = load_shape("org/small")
    assert why is None and shape.params == pytest.approx(0.49e9, rel=0.02)


def test_other_shapes_are_counted_from_safetensors_headers(tmp_path):
    """A config.json without intermediate_size (GPT-2's names): parameters from the headers."""
    model = tmp_path / "gpt"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 100,
        "n_positions": 128}))
    tensors = {"wte.weight": [100, 64], "h.0.attn.c_attn.weight": [64, 192],
               "h.0.mlp.c_fc.weight": [64, 256], "h.0.ln_1.weight": [64]}
    header, offset = {}, 0
    for key, shape in tensors.items():
        size = 4 * shape[0] * (shape[1] if len(shape) > 1 else 1)
        header[key] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    (model / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw
                                              + b"\0" * offset)
    shape, why = load_shape(str(model))
    assert why is None and shape.source == "safetensors headers"
    assert shape.params == 100 * 64 + 64 * 192 + 64 * 256 + 64
    assert shape.linear_params == 64 * 192 + 64 * 256
    (model / "model.safetensors").unlink()
    assert load_shape(str(model))[0] is None


def test_this_machine_reports_its_memory():
    total, available = physical_memory()
    assert total > 256 * 2 ** 20
    assert available is None or 0 < available <= total


# --- the trainer's dtype on fp16-only GPUs -----------------------------------------------------

@pytest.mark.parametrize("capability,bf16", [((7, 5), False), ((7, 0), False), ((8, 0), True),
                                             ((9, 0), True)])
def test_bf16_means_compute_capability_8_or_newer(monkeypatch, capability, bf16):
    """torch.cuda.is_bf16_supported() also says yes where bf16 is only emulated (a T4)."""
    import torch

    from reinf.model.modeling import cuda_facts

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.version, "hip", None)
    assert cuda_facts() == (bf16, f"Tesla T4 (compute capability {capability[0]}."
                                  f"{capability[1]})")


def test_training_in_fp16_on_a_gpu_without_bf16_is_refused_in_one_line():
    import torch

    from reinf.errors import ModelError
    from reinf.model.modeling import plan_load

    gpu = "Tesla T4 (compute capability 7.5)"
    serve = plan_load("auto", "auto", "none", cuda=True, mps=False, bf16=False, gpu=gpu)
    assert serve.dtype == torch.float16  # serving in fp16 is fine
    with pytest.raises(ModelError) as err:
        plan_load("auto", "auto", "none", cuda=True, mps=False, bf16=False, gpu=gpu,
                  for_training=True)
    assert gpu in err.value.message and "\n" not in err.value.message
    assert err.value.fix.startswith("set dtype: float32") and err.value.key == "dtype"
    for dtype, bf16 in (("float32", False), ("auto", True), ("float16", True)):
        plan_load("auto", dtype, "4bit", cuda=True, mps=False, bf16=bf16, for_training=True)


def test_the_plan_warns_about_fp16_training_on_such_a_gpu(config, tmp_path):
    cfg = config.replace(model_path=str(write_model(tmp_path, "qwen2.5-0.5b")))
    p = plan_memory(cfg, device="cuda", device_total_bytes=16 * GIB, bf16=False)
    assert any("set dtype: float32" in n for n in p.notes)
    p = plan_memory(cfg.replace(dtype="float32"), device="cuda", device_total_bytes=16 * GIB,
                    bf16=False)
    assert p.notes == () and p.server["weights"] == 4 * p.params
