"""Config: precedence, environment overrides, rejection of bad keys, types and values."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest
import yaml

from reinf.catalog import PROJECT_ROOT, resolve_model_path
from reinf.config import Config, load_config, render_yaml, settings
from reinf.errors import ConfigError


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_are_typed_and_frozen(home):
    cfg = load_config(environ={"REINF_HOME": str(home)})
    assert cfg.ppo.learning_rate == pytest.approx(1e-3)
    assert cfg.server.port == 8765 and cfg.server.host == "127.0.0.1"
    assert cfg.data_dir == home
    assert cfg.db_url == f"sqlite:///{home / 'reinf.db'}"
    with pytest.raises(Exception):
        cfg.ppo.learning_rate = 1.0  # frozen


def test_precedence_defaults_file_env_flags(tmp_path, home):
    f = write(tmp_path / "c.yaml", "schedule:\n  train_interval_minutes: 10\n"
                                   "ppo:\n  learning_rate: 0.001\n  batch_size: 4\n")
    env = {"REINF_HOME": str(home), "TRAIN_INTERVAL_MINUTES": "5"}
    cfg = load_config(f, environ=env)
    assert cfg.schedule.train_interval_minutes == 5.0          # env beats file
    assert cfg.ppo.learning_rate == pytest.approx(1e-3)        # file beats default
    assert cfg.ppo.batch_size == 4
    cfg = load_config(f, environ=env, overrides={"train_interval_minutes": 2, "port": None})
    assert cfg.schedule.train_interval_minutes == 2.0          # flag beats env
    assert cfg.server.port == 8765                             # None flags are ignored


def test_a_bad_combination_names_where_the_value_came_from(tmp_path, home):
    f = write(tmp_path / "c.yaml", "ppo:\n  batch_size: 4\n")
    with pytest.raises(ConfigError,
                       match=r"dual_clip = 0.5 \(environment variable REINF_DUAL_CLIP\)"):
        load_config(f, environ={"REINF_HOME": str(home), "REINF_DUAL_CLIP": "0.5"})
    write(f, "ppo:\n  dual_clip: 0.5\n")
    with pytest.raises(ConfigError, match=r"dual_clip = 0.5 \(.*c.yaml\)"):
        load_config(f, environ={"REINF_HOME": str(home)})


def test_prefixed_env_wins_over_bare_name(home):
    env = {"REINF_HOME": str(home), "TRAIN_AFTER_RATINGS": "3", "REINF_TRAIN_AFTER_RATINGS": "7"}
    assert load_config(environ=env).schedule.train_after_ratings == 7


@pytest.mark.parametrize("name,raw,expected", [
    ("REINF_LORA_R", "4", ("lora", "r", 4)),
    ("REINF_LORA_TARGET_MODULES", "q_proj, k_proj",
     ("lora", "target_modules", ["q_proj", "k_proj"])),
    ("REINF_ADAPTIVE_KL", "off", ("ppo", "adaptive_kl", False)),
    ("REINF_TAG_ADJUSTMENTS", '{"wrong": -1}', ("rewards", "tag_adjustments", {"wrong": -1.0})),
    ("REINF_AUTH_TOKEN", "null", ("server", "auth_token", None)),
    ("REINF_QUANTIZATION", "4bit", ("model", "quantization", "4bit")),
])
def test_env_values_are_parsed_to_the_setting_type(home, name, raw, expected):
    section, key, value = expected
    cfg = load_config(environ={"REINF_HOME": str(home), name: raw})
    assert getattr(getattr(cfg, section), key) == value


def test_reinf_home_moves_all_state(tmp_path):
    cfg = load_config(environ={"REINF_HOME": str(tmp_path / "elsewhere")})
    assert cfg.data_dir == tmp_path / "elsewhere"
    assert str(tmp_path / "elsewhere") in cfg.db_url


def test_config_file_in_home_is_found(home):
    home.mkdir(parents=True)
    write(home / "config.yaml", "generation:\n  temperature: 0.3\n")
    cfg = load_config(environ={"REINF_HOME": str(home)})
    assert cfg.generation.temperature == pytest.approx(0.3)
    assert cfg.source == str(home / "config.yaml")


def test_flat_public_names_at_top_level_are_accepted(tmp_path, home):
    f = write(tmp_path / "c.yaml", "learning_rate: 0.01\nlora.r: 16\n")
    cfg = load_config(f, environ={"REINF_HOME": str(home)})
    assert cfg.ppo.learning_rate == pytest.approx(0.01) and cfg.lora.r == 16


@pytest.mark.parametrize("text,key,words", [
    ("ppo:\n  learnin_rate: 0.1\n", "ppo.learnin_rate", ["unknown key", "learning_rate"]),
    ("bogus: 1\n", "bogus", ["unknown key"]),
    ("ppo:\n  learning_rate: fast\n", "learning_rate", ["expected a number"]),
    ("server:\n  port: 70000\n", "port", ["≤ 65535"]),
    ("model:\n  device: tpu\n", "device", ["one of auto, cuda, mps, cpu"]),
    ("ppo:\n  batch_size: 2.5\n", "batch_size", ["whole number"]),
    ("lora:\n  target_modules: q_proj\n", "lora.target_modules", ["list"]),
    ("rewards:\n  reward_min: 1\n  reward_max: 0\n", "reward_min", ["below reward_max"]),
    ("server:\n  host: 0.0.0.0\n", "auth_token", ["auth_token is not set"]),
    ("server:\n  host: 0.0.0.0\n  auth_token: '   '\n", "auth_token", ["auth_token is blank"]),
    ("server:\n  auth_token: ' '\n", "auth_token", ["auth_token is blank"]),
    ("server:\n  host: 0.0.0.0\n  auth_token: s3cret-token\n", "auth_token",
     ["only 12 characters", "at least 16"]),
    ("ppo: [1, 2]\n", "ppo", ["must be a mapping"]),
])
def test_bad_file_values_name_the_key_the_file_and_the_fix(tmp_path, home, text, key, words):
    f = write(tmp_path / "bad.yaml", text)
    with pytest.raises(ConfigError) as info:
        load_config(f, environ={"REINF_HOME": str(home)})
    err = info.value
    assert err.key == key
    message = str(err)
    assert str(f) in message
    assert err.fix
    for w in words:
        assert w in message


@pytest.mark.parametrize("token", ["   ", "\t", "tok-123", "0123456789abcde"])
def test_serving_off_loopback_needs_a_real_token(home, token):
    env = {"REINF_HOME": str(home), "REINF_AUTH_TOKEN": token}
    with pytest.raises(ConfigError) as info:
        load_config(environ=env, overrides={"host": "0.0.0.0"})  # reinf serve --host 0.0.0.0
    assert info.value.key == "auth_token" and "openssl rand -hex 16" in info.value.fix
    good = load_config(environ={**env, "REINF_AUTH_TOKEN": "0123456789abcdef"},
                       overrides={"host": "0.0.0.0"})
    assert good.server.auth_token == "0123456789abcdef"
    if token.strip():  # on loopback a short token is the person's choice
        assert load_config(environ=env).server.auth_token == token


def test_bad_env_value_names_the_source(home):
    with pytest.raises(ConfigError) as info:
        load_config(environ={"REINF_HOME": str(home), "REINF_PORT": "eighty"})
    assert "environment variable" in str(info.value) and info.value.key == "port"


def test_broken_yaml_is_a_config_error(tmp_path, home):
    f = write(tmp_path / "c.yaml", "ppo: {learning_rate: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(f, environ={"REINF_HOME": str(home)})


def test_missing_explicit_file_is_a_config_error(tmp_path, home):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml", environ={"REINF_HOME": str(home)})


def test_replace_validates_like_the_file(config):
    assert config.replace(learning_rate=0.5, lora_r=2).lora.r == 2
    with pytest.raises(ConfigError):
        config.replace(learning_rate=-1)


def test_a_config_file_from_the_sample_counting_kl_controller_gets_one_line(tmp_path, home):
    """kl_horizon counted samples (default 1000, which every `reinf init` wrote); it counts
    rounds now, and such a file stops start-up with one line saying what to do."""
    f = write(tmp_path / "old.yaml", "ppo:\n  kl_coef: 0.1\n  kl_horizon: 1000\n")
    with pytest.raises(ConfigError) as info:
        load_config(f, environ={"REINF_HOME": str(home)})
    message = str(info.value)
    assert info.value.key == "kl_horizon" and "\n" not in message
    assert message.startswith(f"kl_horizon = 1000 ({f}): expected a value ≤ 100")
    assert "counts training rounds now, not samples" in message and "set it to 1" in message
    assert load_config(environ={"REINF_HOME": str(home)}).ppo.kl_horizon == 1


def test_reference_config_yaml_matches_the_declarations():
    """config.yaml lists every key with its default and comment; regenerate with
    `python -c "from reinf.config import render_yaml; print(render_yaml(), end='')" > config.yaml`."""
    committed = (PROJECT_ROOT / "config.yaml").read_text(encoding="utf-8")
    assert committed == render_yaml()
    data = yaml.safe_load(committed)
    for s in settings():
        assert s.key in data[s.section], s.public
        assert data[s.section][s.key] == (s.default if not isinstance(s.default, tuple)
                                          else list(s.default))


def test_reference_config_yaml_loads_cleanly(home):
    cfg = load_config(PROJECT_ROOT / "config.yaml", environ={"REINF_HOME": str(home)})
    assert cfg.to_dict() == Config(storage=cfg.storage).to_dict()


def test_model_path_resolution(tmp_path, home, monkeypatch):
    cfg = load_config(environ={"REINF_HOME": str(home)})
    assert resolve_model_path(cfg).endswith("reinf-demo")
    local = tmp_path / "mymodel"
    local.mkdir()
    assert resolve_model_path(cfg.replace(model_path=str(local))) == str(local)
    monkeypatch.chdir(tmp_path)
    assert resolve_model_path(cfg.replace(model_path="mymodel")) == str(local)
    assert resolve_model_path(cfg.replace(model_path="Qwen/Qwen2.5-0.5B-Instruct")) \
        == "Qwen/Qwen2.5-0.5B-Instruct"


# --- lora.target_modules: auto | all-linear | a list of names ------------------------------

@pytest.mark.parametrize("source,raw,expected", [
    ("default", None, "auto"),
    ("file", "all-linear", "all-linear"),
    ("file", "AUTO", "auto"),
    ("file", "[c_attn, c_proj]", ["c_attn", "c_proj"]),
    ("env", "all-linear", "all-linear"),
    ("env", "query_key_value", ["query_key_value"]),
    ("env", "q_proj, v_proj", ["q_proj", "v_proj"]),
    ("env", "[qkv_proj]", ["qkv_proj"]),
])
def test_target_modules_takes_auto_all_linear_or_names(tmp_path, home, source, raw, expected):
    env = {"REINF_HOME": str(home)}
    path = None
    if source == "file":
        path = write(tmp_path / "c.yaml", f"lora:\n  target_modules: {raw}\n")
    elif source == "env":
        env["REINF_LORA_TARGET_MODULES"] = raw
    assert load_config(path, environ=env).lora.target_modules == expected


@pytest.mark.parametrize("raw,words", [
    ("c_attn", ["auto, all-linear, or a list of names"]),      # one name is still a list
    ("[]", ["auto, all-linear, or a list of names"]),
    ("5", ["expected auto"]),
    ("[q_proj, 3]", ["list of names"]),
    ("[q_proj, all-linear]", ["all-linear is a value of its own"]),
])
def test_bad_target_modules_name_the_key_and_the_fix(tmp_path, home, raw, words):
    f = write(tmp_path / "c.yaml", f"lora:\n  target_modules: {raw}\n")
    with pytest.raises(ConfigError) as info:
        load_config(f, environ={"REINF_HOME": str(home)})
    assert info.value.key == "lora.target_modules"
    assert "lora.target_modules" in info.value.fix
    for w in words:
        assert w in str(info.value)


def test_target_modules_through_replace(config):
    assert config.replace(lora_target_modules="all-linear").lora.target_modules == "all-linear"
    assert config.replace(lora_target_modules=["c_attn"]).lora.target_modules == ["c_attn"]
    with pytest.raises(ConfigError):
        config.replace(lora_target_modules=[])


# --- max_history: null (auto) by default, 0 = no past turns -----------------------------------

def test_max_history_defaults_to_auto_and_keeps_zero(tmp_path, home):
    env = {"REINF_HOME": str(home)}
    assert load_config(environ=env).model.max_history is None
    assert load_config(environ={**env, "REINF_MAX_HISTORY": "0"}).model.max_history == 0
    assert load_config(environ={**env, "REINF_MAX_HISTORY": "12"}).model.max_history == 12
    assert load_config(environ={**env, "REINF_MAX_HISTORY": "null"}).model.max_history is None
    f = write(tmp_path / "c.yaml", "model:\n  max_history: null\n")
    assert load_config(f, environ=env).model.max_history is None
    f = write(tmp_path / "c.yaml", "model:\n  max_history: 3\n")
    assert load_config(f, environ=env).model.max_history == 3
    with pytest.raises(ConfigError) as info:
        load_config(environ={**env, "REINF_MAX_HISTORY": "-1"})
    assert info.value.key == "max_history"


# --- the environment: REINF_ names only (but the schedule keys), each error names its variable ---

def test_bare_names_other_programs_set_are_not_settings(home):
    """Shells, containers and CI set HOST, PORT, DEVICE, DB_URL for other programs: they must
    neither change Reinf's settings nor stop it (HOST=buildbox once said auth_token is not set)."""
    env = {"REINF_HOME": str(home), "HOST": "buildbox", "PORT": "eighty", "DEVICE": "gpu0",
           "DB_URL": "postgresql://app@db/app", "DATA_DIR": "/srv/other", "MODEL_PATH": "x/y/z",
           "AUTH_TOKEN": "", "TEMPERATURE": "hot"}
    cfg = load_config(environ=env)
    assert (cfg.server.host, cfg.server.port, cfg.model.device) == ("127.0.0.1", 8765, "auto")
    assert cfg.db_url == f"sqlite:///{home / 'reinf.db'}" and cfg.data_dir == home
    assert cfg.model.model_path == "reinf-demo" and cfg.server.auth_token is None
    assert cfg.origins == {"data_dir": "environment"}  # from REINF_HOME, nothing else
    # the two schedule keys the README shows bare still work bare
    cfg = load_config(environ={**env, "TRAIN_INTERVAL_MINUTES": "5", "TRAIN_AFTER_RATINGS": "3"})
    assert (cfg.schedule.train_interval_minutes, cfg.schedule.train_after_ratings) == (5.0, 3)
    assert cfg.env_names["train_after_ratings"] == "TRAIN_AFTER_RATINGS"


@pytest.mark.parametrize("name,raw", [("REINF_PORT", "eighty"), ("TRAIN_AFTER_RATINGS", "many"),
                                      ("REINF_TRAIN_AFTER_RATINGS", "-3"),
                                      ("REINF_LORA_TARGET_MODULES", "[]"),
                                      ("REINF_TAG_ADJUSTMENTS", "{wrong: bad}")])
def test_an_error_from_the_environment_names_the_variable(home, name, raw):
    with pytest.raises(ConfigError) as info:
        load_config(environ={"REINF_HOME": str(home), name: raw})
    assert f"(environment variable {name})" in str(info.value)


def test_the_short_token_error_names_the_variable_it_came_from(tmp_path, home):
    """With a config file in play and --host given as a flag, the token's source is still
    the environment (it used to name the file)."""
    f = write(tmp_path / "c.yaml", "ppo:\n  batch_size: 4\n")
    with pytest.raises(ConfigError) as info:
        load_config(f, environ={"REINF_HOME": str(home), "REINF_AUTH_TOKEN": "short-token"},
                    overrides={"host": "0.0.0.0"})
    assert "(environment variable REINF_AUTH_TOKEN)" in str(info.value)
    assert str(f) not in str(info.value)
    write(f, "server:\n  auth_token: short-token\n")
    with pytest.raises(ConfigError, match=r"at least 16 \(.*c\.yaml\)"):
        load_config(f, environ={"REINF_HOME": str(home)}, overrides={"host": "0.0.0.0"})


def test_each_value_knows_where_it_came_from(tmp_path, home):
    f = write(tmp_path / "c.yaml", "ppo:\n  learning_rate: 0.01\nport: 9000\n")
    cfg = load_config(f, environ={"REINF_HOME": str(home), "REINF_TEMPERATURE": "0.5"},
                      overrides={"max_new_tokens": 64})
    kinds = {name: cfg.origin_kind(name) for name in
             ("learning_rate", "port", "temperature", "max_new_tokens", "top_p", "data_dir")}
    assert kinds == {"learning_rate": "file", "port": "file", "temperature": "environment",
                     "max_new_tokens": "flag", "top_p": "default", "data_dir": "environment"}
    assert cfg.env_names["temperature"] == "REINF_TEMPERATURE"
    assert cfg.origin("temperature") == "environment variable REINF_TEMPERATURE"
    assert cfg.replace(top_p=0.5).origin_kind("temperature") == "environment"  # carried over
    shown = render_yaml(cfg, origins=True)
    assert "  learning_rate: 0.01  # [file] " in shown
    assert "  temperature: 0.5  # [environment REINF_TEMPERATURE] " in shown
    assert "  max_new_tokens: 64  # [flag] " in shown and "  top_p: 0.95  # [default] " in shown
    assert "[default]" not in render_yaml(cfg)  # the reference file has no marks


def test_a_tag_table_replaces_the_default_one_whole(tmp_path, home):
    """Documented (README, config.yaml): a table set anywhere is the whole table."""
    env = {"REINF_HOME": str(home)}
    cfg = load_config(environ={**env, "REINF_TAG_ADJUSTMENTS": "{wrong: -0.5}"})
    assert cfg.rewards.tag_adjustments == {"wrong": -0.5}
    f = write(tmp_path / "c.yaml", "rewards:\n  tag_adjustments: {rude: -1}\n")
    assert load_config(f, environ=env).rewards.tag_adjustments == {"rude": -1.0}
    assert "replaces" in next(s.help for s in settings() if s.key == "tag_adjustments")


@pytest.mark.parametrize("text,line", [
    ("ppo:\n  learning_rate: 0.001\n  batch_size: [4\n", 4),
    ("server:\n  port: 8765\n   host: x\n", 3),
    ("model:\n\tdevice: cpu\n", 2),
    ("generation:\n  system_prompt: 'unclosed\n", 3),
])
def test_invalid_yaml_is_one_line_with_the_line_number(tmp_path, home, text, line):
    f = write(tmp_path / "c.yaml", text)
    with pytest.raises(ConfigError) as info:
        load_config(f, environ={"REINF_HOME": str(home)})
    message = str(info.value)
    assert "\n" not in message, message
    assert f"{f}, line {line}, column " in message and "not valid YAML" in message


def test_a_named_model_brings_its_defaults_under_everything_a_person_sets(tmp_path):
    from reinf.catalog import KNOWN_MODELS

    preset = KNOWN_MODELS["smollm2-135m"].settings
    assert preset["ppo_epochs"] != 4  # the test means something: it differs from the default
    home = {"REINF_HOME": str(tmp_path), "REINF_DEVICE": "cpu"}  # the CPU round (GPU: below)
    demo = load_config(environ=home)
    assert demo.ppo.ppo_epochs == 4 and demo.origin_kind("ppo_epochs") == "default"
    real = load_config(environ={**home, "REINF_MODEL_PATH": "smollm2-135m"})
    assert real.ppo.ppo_epochs == preset["ppo_epochs"]
    assert real.training.rollout_prompts == preset["training.rollout_prompts"]
    assert real.origin_kind("ppo_epochs") == "model"
    # config.yaml, the environment and flags each win over the model's defaults
    (tmp_path / "config.yaml").write_text("model:\n  model_path: smollm2-135m\n"
                                          "ppo:\n  ppo_epochs: 3\n")
    mine = load_config(environ={**home, "REINF_TRAINING_ROLLOUT_PROMPTS": "5"},
                       overrides={"max_new_tokens": 64})
    assert mine.ppo.ppo_epochs == 3 and mine.origin_kind("ppo_epochs") == "file"
    assert mine.training.rollout_prompts == 5
    assert mine.generation.max_new_tokens == 64
    assert mine.training.rollout_max_new_tokens == preset["training.rollout_max_new_tokens"]
    assert "[model]" in render_yaml(mine, origins=True)


def test_the_real_model_learns_styles_by_default_and_the_demo_model_does_not(tmp_path):
    from reinf.catalog import KNOWN_MODELS, NO_STYLE_LEARNING, STYLE_LEARNING

    home = {"REINF_HOME": str(tmp_path), "REINF_DEVICE": "cpu"}
    defaults = {s.public: s.default for s in settings()}
    # the "off" pins are exactly the built-in defaults, so pinning them runs the plain round
    assert {name: defaults[name] for name in NO_STYLE_LEARNING} == NO_STYLE_LEARNING
    assert set(NO_STYLE_LEARNING) <= set(STYLE_LEARNING)
    real = load_config(environ={**home, "REINF_MODEL_PATH": "smollm2-135m"})
    for name, value in STYLE_LEARNING.items():
        assert real.value(name) == value, name
    assert real.generation.explore_styles == 0.5 and real.training.styled_rollouts == 2
    assert real.origin_kind("explore_styles") == "model"
    on_gpu = load_config(environ={**home, "REINF_MODEL_PATH": "smollm2-135m",
                                  "REINF_DEVICE": "cuda"})
    assert on_gpu.training.imitate_styled == 0.5  # on a GPU too
    demo = load_config(environ=home)
    assert demo.generation.explore_styles == 0.0 and demo.training.styled_rollouts == 0
    assert KNOWN_MODELS["reinf-demo"].settings == {}
    # a person turns it off as any setting: the environment (or config.yaml) wins
    off = load_config(environ={**home, "REINF_MODEL_PATH": "smollm2-135m",
                               "REINF_EXPLORE_STYLES": "0"})
    assert off.generation.explore_styles == 0.0 and off.training.styled_rollouts == 2


def test_a_named_model_brings_a_bigger_round_where_it_trains_on_a_gpu(tmp_path):
    from reinf.catalog import KNOWN_MODELS

    known = KNOWN_MODELS["smollm2-135m"]
    gpu = known.gpu_settings
    assert gpu["training.rollout_prompts"] != known.settings["training.rollout_prompts"]
    env = {"REINF_HOME": str(tmp_path), "REINF_MODEL_PATH": "smollm2-135m"}
    on_gpu = load_config(environ={**env, "REINF_DEVICE": "cuda"})
    assert on_gpu.training.rollout_prompts == gpu["training.rollout_prompts"]
    assert on_gpu.ppo.learning_rate == gpu["learning_rate"]
    assert (on_gpu.training.rollout_iterations, on_gpu.ppo.kl_coef, on_gpu.ppo.kl_loss_coef) \
        == (2, 0.02, 0.01)
    assert on_gpu.origin_kind("kl_loss_coef") == "model"
    assert on_gpu.origin_kind("learning_rate") == "model"
    assert on_gpu.ppo.ppo_epochs == known.settings["ppo_epochs"]  # the rest still applies
    # training, not serving, decides: serving on the GPU, training on the CPU
    split = load_config(environ={**env, "REINF_DEVICE": "cuda", "REINF_TRAIN_DEVICE": "cpu"})
    assert split.training.rollout_prompts == known.settings["training.rollout_prompts"]
    cpu = load_config(environ={**env, "REINF_DEVICE": "cpu"})
    assert cpu.ppo.learning_rate != gpu["learning_rate"]
    assert cpu.training.rollout_iterations == 1  # the second pass is the GPU's alone
    assert (cpu.ppo.kl_coef, cpu.ppo.kl_loss_coef) == (0.02, 0.01)  # the model's, on both
    assert load_config(environ={"REINF_HOME": str(tmp_path)}).ppo.kl_loss_coef == 0.05
    # what a person sets still wins
    mine = load_config(environ={**env, "REINF_DEVICE": "cuda", "REINF_LEARNING_RATE": "5e-4"})
    assert mine.ppo.learning_rate == 5e-4
    assert KNOWN_MODELS["reinf-demo"].gpu_settings == {}


@pytest.mark.skipif(not sys.platform.startswith("linux") or bool(glob.glob("/dev/nvidia[0-9]*")),
                    reason="asks torch where an NVIDIA device node exists")
def test_asking_for_a_gpu_does_not_import_torch_on_a_machine_without_one(tmp_path):
    """Every command loads the config; on a machine with no NVIDIA device it must not pay
    for importing torch to learn that smollm2-135m's GPU round does not apply."""
    code = ("import sys; from reinf.config import load_config; "
            f"c = load_config(environ={{'REINF_HOME': {str(tmp_path)!r}, "
            "'REINF_MODEL_PATH': 'smollm2-135m'}); "
            "print(c.training.rollout_prompts, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    from reinf.catalog import KNOWN_MODELS
    assert out == [str(KNOWN_MODELS["smollm2-135m"].settings["training.rollout_prompts"]),
                   "False"]


@pytest.mark.parametrize("value, words", [(0, "≥ 1"), (9, "≤ 8")])
def test_best_of_is_one_to_eight(home, value, words):
    env = {"REINF_HOME": str(home)}
    with pytest.raises(ConfigError) as info:
        load_config(environ=env, overrides={"best_of": value})
    assert info.value.key == "best_of" and words in str(info.value)
    assert f"best_of = {value}" in str(info.value) and info.value.fix
    assert load_config(environ=env).generation.best_of == 1  # off by default
    assert load_config(environ=env, overrides={"best_of": 8}).generation.best_of == 8


def test_reset_comments_keys_out_and_changes_nothing_else(tmp_path, home):
    from reinf.config import comment_out_settings

    original = ("# mine\nserver:\n  port: 9000  # my port\n  threads: 4\nppo:\n"
                "  kl_coef: 0.3\n  learning_rate: 0.01\nrewards:\n  tag_adjustments:\n"
                "    rude: -1\n    wrong: -0.5\n  reward_min: -2\nmax_new_tokens: 64\n"
                "lora:\n  r: 4\n")
    f = write(tmp_path / "c.yaml", original)
    env = {"REINF_HOME": str(home)}
    reset = comment_out_settings(f, ["port", "ppo.kl_coef", "tag_adjustments",
                                     "max_new_tokens", "lora.r", "top_p"])
    assert reset == ["port", "kl_coef", "tag_adjustments", "max_new_tokens", "lora.r"]
    text = f.read_text()
    assert "  # port: 9000  # my port\n" in text and "  #   rude: -1\n" in text
    assert "# max_new_tokens: 64\n" in text and text.startswith("# mine\nserver:\n")
    cfg = load_config(f, environ=env)
    kinds = {n: cfg.origin_kind(n) for n in ("port", "kl_coef", "tag_adjustments",
                                              "max_new_tokens", "lora.r", "threads",
                                              "learning_rate", "reward_min")}
    assert kinds == {"port": "default", "kl_coef": "default", "tag_adjustments": "default",
                     "max_new_tokens": "default", "lora.r": "default", "threads": "file",
                     "learning_rate": "file", "reward_min": "file"}
    assert cfg.ppo.learning_rate == 0.01 and cfg.rewards.reward_min == -2
    assert (f.stat().st_mode & 0o777) == 0o600 or os.name != "posix"
    assert comment_out_settings(f, ["port"]) == []  # already a comment
    with pytest.raises(ConfigError, match="did you mean 'kl_coef'"):
        comment_out_settings(f, ["kl_cof"])


def test_reset_refuses_a_section_it_cannot_edit_line_by_line(tmp_path, home):
    from reinf.config import comment_out_settings

    f = write(tmp_path / "c.yaml", "ppo: {kl_coef: 0.3, learning_rate: 0.01}\n")
    with pytest.raises(ConfigError) as info:
        comment_out_settings(f, ["kl_coef"])
    assert "edit the file by hand" in info.value.fix
    assert f.read_text() == "ppo: {kl_coef: 0.3, learning_rate: 0.01}\n"  # untouched
    assert list(tmp_path.glob(".c.yaml.tmp-*")) == []


def test_a_misspelt_variable_is_named_with_the_nearest_setting():
    from reinf.config import unknown_env

    env = {"REINF_MIN_CONSISTENCY": "0.5", "REINF_EARLYSTOP": "step", "REINF_PORT": "9000",
           "REINF_TRAINING_METHOD": "rated", "REINF_HOME": "/x", "REINF_TEST_PG": "require",
           "PATH": "/bin"}
    warnings = unknown_env(env)
    assert len(warnings) == 2, warnings  # the settings, REINF_HOME and the test switch pass
    assert warnings[0].startswith("REINF_EARLYSTOP names no setting and is ignored: did you "
                                  "mean REINF_EARLY_STOP?")
    assert "did you mean REINF_TRAINING_MIN_CONSISTENCY?" in warnings[1]
    assert unknown_env({"REINF_TRAINING_MIN_CONSISTENCY": "0.5"}) == []


def test_every_command_warns_of_a_variable_that_names_no_setting(invoke, home, monkeypatch):
    monkeypatch.setenv("REINF_MIN_CONSISTENCY", "0.5")
    result = invoke("config", "show", "--json")
    assert result.exit_code == 0
    assert "warning: REINF_MIN_CONSISTENCY names no setting" in result.stderr
    shown = json.loads(result.stdout)  # the JSON on stdout stays clean
    assert shown["training"]["min_consistency"] == 0.3
