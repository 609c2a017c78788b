"""Configuration: every setting declared once, with its help text.

Precedence, lowest to highest: built-in defaults, the config file, environment
variables, command-line flags. Loading yields a frozen ``Config`` whose sections
are frozen dataclasses. Each setting has a *public name*: the leaf name
(``learning_rate``), except LoRA and training settings, which keep their section
(``lora.r``, ``training.method``). The environment variable is the public name upper-cased with dots
as underscores after a ``REINF_`` prefix (``REINF_LORA_R``). Only the training-schedule keys
(``BARE_ENV``) are also read without the prefix (``TRAIN_INTERVAL_MINUTES``); the prefixed
form wins when both are set. Every value remembers where it came from (``Config.origins``)
so that errors and ``reinf config show`` can name it.

The reference file ``config.yaml`` at the repository root is generated from
these declarations by :func:`render_yaml`; a test keeps the two in step.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from reinf.errors import ConfigError
# resolve_model_path is not used here: reinf/bench/learn.py still imports it from this
# module (new code imports it from reinf.catalog).
from reinf.catalog import DEMO_MODEL, resolve_model_path  # noqa: F401
from reinf.catalog import model_preset, trains_on_gpu

ENV_PREFIX = "REINF_"
# The only settings also read from an unprefixed variable (TRAIN_AFTER_RATINGS=3), as the
# README has always shown them. Any other bare name (HOST, PORT, DEVICE, DB_URL) belongs to
# the shell, the container or the CI job, which set them for other programs.
BARE_ENV = ("train_interval_minutes", "train_after_ratings")
# REINF_ variables that are not settings: where the data and the config are, what the server
# hands its own child processes, and the test suite's switches (these and REINF_TEST_*).
OTHER_ENV = ("REINF_HOME", "REINF_CONFIG", "REINF_HOOK_PARENT", "REINF_TRAIN_NICE",
             "REINF_SKIP_BROWSER", "REINF_CHROMIUM", "REINF_CHROMEDRIVER", "REINF_BENCH_HIDDEN")
DEFAULT_HOME = "~/.reinf"
CONFIG_FILENAME = "config.yaml"


def setting(default: Any, help: str, *, min: float | None = None, max: float | None = None,
            choices: tuple[str, ...] | None = None, fix: str | None = None) -> Any:
    """Declare one setting: its default, one line of help, and its allowed range."""
    meta = {"help": help, "min": min, "max": max, "choices": choices, "fix": fix}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class ServerConfig:
    host: str = setting("127.0.0.1", "address to bind; anything but loopback requires auth_token")
    port: int = setting(8765, "TCP port of the web UI and API", min=1, max=65535)
    auth_token: str | None = setting(None, "bearer token clients must send (required off loopback)")
    allowed_hosts: list[str] = setting([], "extra Host header names to accept besides localhost")
    max_request_bytes: int = setting(1_000_000, "largest request body accepted, in bytes", min=1024)
    max_message_chars: int = setting(16_000, "longest chat message accepted, in characters", min=1)
    threads: int = setting(8, "worker threads of the WSGI server", min=1, max=256)
    connection_limit: int = setting(200, "connections open at once; more wait to be accepted",
                                    min=10, max=4000)
    request_header_timeout_seconds: float = setting(
        15.0, "close a connection with no complete request (idle, a request head still "
              "arriving, or a body stalled this long; a body gets 4 x this in all) after "
              "this long; a streaming reply is never cut by it", min=1.0,
        max=600.0)


@dataclass(frozen=True)
class StorageConfig:
    data_dir: str | None = setting(None, "where all state lives; null = $REINF_HOME or ~/.reinf")
    db_url: str | None = setting(None, "SQLAlchemy URL; null = sqlite:///<data_dir>/reinf.db")
    busy_timeout_ms: int = setting(15_000, "how long SQLite waits for a lock before failing", min=0)
    log_max_bytes: int = setting(5_000_000, "size at which the log file rotates", min=10_000)
    log_backups: int = setting(3, "rotated log files kept", min=0)


@dataclass(frozen=True)
class ModelConfig:
    model_path: str = setting(DEMO_MODEL, "a named model (`reinf models`: reinf-demo, "
                              "smollm2-135m), a local directory or a hub id")
    device: str = setting("auto", "where the model runs", choices=("auto", "cuda", "mps", "cpu"))
    quantization: str = setting("none", "bitsandbytes base weights (CUDA only)",
                                choices=("none", "8bit", "4bit"))
    dtype: str = setting("auto", "weights dtype; auto = bf16 on CUDA, fp32 elsewhere",
                         choices=("auto", "float32", "bfloat16", "float16"))
    trust_remote_code: bool = setting(False, "allow model code from the hub (off: safer)")
    max_history: int | None = setting(None, "past turns sent with each message; null = auto: 4 "
                                            "on the demo model (trained on short chats), else "
                                            "as many as fit the context budget, at most 32; "
                                            "0 = none", min=0)
    max_context_tokens: int = setting(0, "prompt token budget; 0 = the model's own limit", min=0)


@dataclass(frozen=True)
class GenerationConfig:
    temperature: float = setting(0.8, "sampling temperature", min=0.01, max=5.0)
    top_p: float = setting(0.95, "nucleus sampling mass", min=0.01, max=1.0)
    max_new_tokens: int = setting(128, "longest reply, in tokens", min=1, max=32_768)
    system_prompt: str | None = setting(None, "system message of new conversations (one may set "
                                              "its own); null = none")
    best_of: int = setting(1, "replies sampled per message; the rating model of the active "
                              "checkpoint keeps the one it scores highest (pessimistic score); "
                              "1 = off. Costs about N replies' compute in one batch, and the "
                              "reply appears when all are done (no token streaming)", min=1, max=8)
    explore_styles: float = setting(0.0, "share of replies asked for in a style (a hidden "
                                         "instruction from training.styles_file appended to "
                                         "your message: a list, one sentence, an example, "
                                         "...), so your ratings and picks show which ways of "
                                         "answering you like; 0 = off (docs/training.md, "
                                         "\"Exploring styles\")", min=0.0, max=1.0)
    explore_pick: str = setting(
        "ratings", "which style explore_styles asks for: ratings = by your ratings of the "
                   "replies asked for in each (styles you rated above your usual are asked "
                   "for more often, unrated ones are still tried); uniform = each equally "
                   "often (docs/training.md, \"Exploring styles\")",
        choices=("ratings", "uniform"))


@dataclass(frozen=True)
class LoraConfig:
    r: int = setting(8, "LoRA rank", min=1, max=1024)
    alpha: int = setting(16, "LoRA scaling numerator (scale = alpha / r)", min=1)
    dropout: float = setting(0.05, "LoRA dropout; PPO and the bench's SFT baseline turn it off in "
                                   "every pass, so only the bench's KTO baseline (TRL) uses it",
                             min=0.0, max=0.9)
    target_modules: list[str] | str = setting(
        "auto", "layers that get adapters: auto = the attention projections of the loaded "
                "model, all-linear, or a list of names (q_proj, v_proj)",
        choices=("auto", "all-linear"))


@dataclass(frozen=True)
class PPOConfig:
    learning_rate: float = setting(1e-3, "Adam learning rate of the adapter", min=0.0, max=1.0)
    batch_size: int = setting(8, "rated turns per forward/backward minibatch", min=1)
    gradient_accumulation_steps: int = setting(1, "minibatches per optimizer step", min=1)
    ppo_epochs: int = setting(4, "passes over the round's samples", min=1, max=100)
    ppo_clip: float = setting(0.2, "clip range of the policy ratio", min=0.0, max=10.0)
    value_clip: float = setting(0.2, "clip range of the value update (GAE rounds)", min=0.0,
                                max=100.0)
    vf_coef: float = setting(0.5, "weight of the value loss (GAE rounds only: RLOO has no value "
                                  "head)", min=0.0)
    ent_coef: float = setting(0.0, "weight of the entropy bonus", min=0.0)
    dual_clip: float = setting(3.0, "bound c > 1 on the loss of stale samples with huge ratios; "
                                    "0 = off", min=0.0,
                               fix="set dual_clip to 0 (off) or a value above 1, such as 3")
    value_detach: bool = setting(True, "the value head (GAE rounds) reads detached hidden states "
                                       "(trains only itself)")
    normalize_rewards: bool = setting(False, "subtract the running mean of rewards and divide "
                                             "by their running std (stats always reported)")
    max_grad_norm: float = setting(1.0, "gradient-norm clip", min=0.0)
    kl_coef: float = setting(0.1, "per-token KL penalty to the base model in the return; with "
                                  "adaptive_kl, the least it is", min=0.0)
    kl_loss_coef: float = setting(0.05, "weight of the KL to the base as a loss term (k3 on the "
                                       "sampled tokens, as in GRPO); 0 = off", min=0.0)
    anchor_coef: float = setting(0.0, "weight of the anchor: KL(base || policy) on text the "
                                      "base model wrote itself, a minibatch each optimizer "
                                      "step, so a style costs less general text; 0 = off",
                                 min=0.0)
    adaptive_kl: bool = setting(True, "after each PPO pass (once a round unless "
                                      "training.rollout_iterations > 1), raise the KL penalty "
                                      "while KL is above kl_target, lower it back towards "
                                      "kl_coef while below; false = a fixed kl_coef")
    kl_target: float = setting(0.05, "KL per reply token (nats) above which the adaptive "
                                     "controller raises the KL penalty", min=0.0)
    kl_horizon: int = setting(1, "PPO passes the KL controller takes to close its error "
                                 "(clipped to ±20%): 1 = up to 20% a pass", min=1, max=100,
                              fix="kl_horizon counts training rounds now, not samples: set it "
                                  "to 1 (the default), or delete the line")
    kl_max: float = setting(1.0, "promotion gate: reject a round whose KL per token exceeds this",
                            min=0.0)
    target_kl: float = setting(0.1, "stop a round early when approx_kl exceeds this; 0 = never",
                               min=0.0)
    early_stop: str = setting("epoch", "when target_kl is checked: epoch = after each pass "
                                       "over the batch; step = after every optimizer step, "
                                       "on the last 4 minibatches, leaving out the episodes "
                                       "the imitation term reads",
                              choices=("epoch", "step"))
    advantage: str = setting("rloo", "baseline of every round: rloo = leave-one-out over the "
                                     "replies to one prompt (a rated reply alone with its "
                                     "prompt: over the other rated replies); gae = value "
                                     "head + GAE",
                             choices=("rloo", "gae"))
    gamma: float = setting(1.0, "discount of GAE", min=0.0, max=1.0)
    lam: float = setting(0.95, "lambda of GAE", min=0.0, max=1.0)
    replay_buffer_size: int = setting(256, "newest rated turns revisited in a round", min=1)
    train_device: str = setting("auto", "where training runs; auto = the serving device",
                                choices=("auto", "cuda", "mps", "cpu"))
    gradient_checkpointing: bool = setting(False, "trade compute for memory on large models")
    keep_best: int = setting(3, "checkpoints kept besides the active one and its parent", min=0)
    seed: int = setting(0, "seed of minibatch shuffling and adapter initialisation", min=0)


@dataclass(frozen=True)
class TrainingConfig:
    method: str = setting("rollouts", "rollouts = a rating model scores fresh replies for PPO; "
                                      "rated = PPO on rated replies only",
                          choices=("rollouts", "rated"))
    rollout_prompts: int = setting(16, "prompts a round samples fresh replies for (newest rated "
                                      "first, then replayed)", min=1, max=4096)
    rollouts_per_prompt: int = setting(4, "fresh replies sampled for each of those prompts",
                                       min=2, max=64)
    rollout_batch_size: int = setting(16, "replies sampled together (one batched forward per "
                                          "token)", min=1, max=1024)
    rollout_iterations: int = setting(1, "times a rollout round samples fresh replies from "
                                         "the adapter as it stands and takes a PPO step on "
                                         "them, against the same rating model",
                                      min=1, max=64)
    rollout_max_new_tokens: int = setting(0, "longest rollout reply; 0 = max_new_tokens",
                                          min=0, max=32_768)
    styled_rollouts: int = setting(0, "of each prompt's rollouts_per_prompt fresh replies, "
                                      "this many are asked for in a style (an instruction "
                                      "from training.styles_file appended to the prompt: a "
                                      "list, one sentence, an example, ...), then scored and "
                                      "trained on as plain answers, so a round can move the "
                                      "model towards ways of answering it seldom picks; 0 = "
                                      "off (docs/training.md, \"Styled rollouts\")",
                                   min=0, max=64)
    styled_pick: str = setting(
        "ratings", "which styles styled_rollouts asks for: ratings = by your ratings of the "
                   "replies served in each (generation.explore_styles): the style you rated "
                   "furthest above your usual (twice or more) in each prompt's first "
                   "styled rollout, the "
                   "others as explore_pick draws; uniform = each equally often. Uniform "
                   "until a reply served in a style is rated",
        choices=("ratings", "uniform"))
    styles_file: str | None = setting(None, "style instructions for styled_rollouts and "
                                            "explore_styles, one a line in a text file; null = "
                                            "the built-in list")
    min_ratings: int = setting(8, "ratings needed before the rating model may score rollouts",
                               min=2)
    min_consistency: float = setting(0.3, "cross-validated Spearman the rating model needs; "
                                          "below it a round trains on rated replies only",
                                     min=-1.0, max=1.0)
    rating_heads: int = setting(5, "bootstrap heads of the rating model's ensemble", min=1,
                                max=64)
    pessimism: float = setting(0.5, "predicted score = ensemble mean - pessimism x its std",
                               min=0.0, max=10.0)
    rating_model_max: int = setting(1024, "newest ratings the rating model is fitted on",
                                    min=4)
    pair_weight: float = setting(1.0, "weight of your picks (compare, regenerate) in the "
                                      "rating model beside your ratings: 1 = as the joint "
                                      "likelihood of both has it; 0 = ratings only",
                                 min=0.0, max=100.0)
    rewrite_imitation: float = setting(1.0, "weight of your rewrites' log-likelihood in the "
                                            "PPO loss (imitation; docs/training.md, "
                                            "\"Rewrites\"); 0 = PPO's clipped objective alone",
                                       min=0.0, max=100.0)
    rewrite_imitation_rule: str = setting(
        "once", "which rewrites (and imitate_rated replies) the imitation reads: once = each "
                "in the rounds until an adapter that imitated it is promoted; until-likely = "
                "all, in every round, each token while the model finds it less likely than "
                "its own replies' tokens (replies asked for in a style, imitate_explored and "
                "imitate_styled, are always imitated until likely)",
        choices=("once", "until-likely"))
    imitate_rated: int = setting(0, "replies you rated this score or higher are imitated as "
                                    "your rewrites are (the same weight, rewrite_imitation, "
                                    "and rule): a 5 shows what you want as a rewrite does; "
                                    "0 = off (docs/training.md, \"Imitating your best-rated "
                                    "replies\")", min=0, max=5)
    imitate_explored: int = setting(0, "replies served in a style (generation.explore_styles) "
                                       "that you rated this score or higher, and half a point "
                                       "or more above your mean rating, are imitated as "
                                       "plain answers to your message, as your rewrites are "
                                       "(until likely, in every round); 0 = off "
                                       "(docs/training.md, \"Exploring styles\")",
                                    min=0, max=5)
    imitate_styled: float = setting(0.0, "a styled rollout (styled_rollouts) the rating "
                                         "model scores at least this many rating points "
                                         "above the plain replies to its prompt (the "
                                         "pessimistic score, plus its style's lift in your "
                                         "ratings; before the rating model is trusted, a "
                                         "reply in the style lifted this much) is imitated "
                                         "as a plain answer, "
                                         "as your rewrites are (until likely), the best one a "
                                         "prompt: it moves further than PPO's clip lets it; "
                                         "0 = off "
                                         "(docs/training.md, \"Styled rollouts\")",
                                    min=0.0, max=4.0)
    winrate_prompts: int = setting(16, "after each round, the new adapter and the base answer "
                                       "this many of your newest prompts and the rating model "
                                       "judges them (the win rate vs base); 0 = off",
                                   min=0, max=256)
    drift_budget: float = setting(0.0, "after each round, the most the adapter may raise "
                                       "the perplexity of text the base model wrote itself, "
                                       "past each passage's first 3 tokens "
                                       "(0.03 = +3%); above it the whole adapter is scaled "
                                       "towards the base until it is within; 0 = off "
                                       "(docs/training.md, \"The drift budget\")",
                                  min=0.0, max=1.0)
    max_perplexity_increase: float = setting(0.25, "promotion gate: reject a round whose "
                                                   "perplexity on well-rated replies rises "
                                                   "more than this (0.25 = +25%)", min=0.0)
    max_train_tokens: int = setting(1024, "longest prompt + reply a round trains on or samples "
                                          "rollouts from; longer rated turns are skipped (the "
                                          "round reports them as too long). It bounds the "
                                          "round's memory: see the plan in `reinf status`",
                                    min=64, max=1_048_576)
    base_quantization: str = setting("auto", "bitsandbytes weights of the trainer's copy of the "
                                             "base (CUDA only); auto = quantization, or 4bit "
                                             "where the memory plan (`reinf status`) says an "
                                             "unquantized one will not fit beside the server",
                                     choices=("auto", "none", "8bit", "4bit"))


@dataclass(frozen=True)
class ScheduleConfig:
    train_interval_minutes: float = setting(30.0, "train at least this often; 0 = never on a timer",
                                            min=0.0)
    train_after_ratings: int = setting(8, "train as soon as this many new ratings arrive; 0 = off",
                                       min=0)
    train_timeout_minutes: float = setting(30.0, "kill a training round that runs longer", min=0.1)
    train_threads: int = setting(0, "CPU threads for training; 0 = torch's default", min=0)
    train_nice: int = setting(10, "niceness of the trainer process, so chat stays responsive",
                              min=0, max=19)


@dataclass(frozen=True)
class RewardsConfig:
    reward_mapper: str = setting("default", "default, or path/to/file.py:function")
    critical_bonus: float = setting(0.5, "extra reward magnitude for turns flagged critical",
                                    min=0.0)
    tag_adjustments: dict[str, float] = setting(
        {"too technical": -0.2, "needs examples": -0.1, "too long": -0.2, "wrong": -0.3,
         "great tone": 0.2}, "reward added per tag; a table set here or in "
                            "REINF_TAG_ADJUSTMENTS replaces this one whole (list every tag)")
    half_life_days: float = setting(30.0, "age at which a rating's weight halves; 0 = no decay",
                                    min=0.0)
    reward_min: float = setting(-2.0, "lowest final reward (clip)")
    reward_max: float = setting(2.0, "highest final reward (clip)")
    hook_timeout_seconds: float = setting(2.0, "longest a reward hook may run per rating", min=0.01)
    hook_import_timeout_seconds: float = setting(10.0, "longest a reward hook may take to import",
                                                 min=0.1)
    hook_memory_mb: int = setting(4096, "address space a reward hook's process (and what it "
                                        "starts) may use, in MiB; 0 = no limit", min=0)
    critics: dict[str, float] = setting({"length": 0.0, "repetition": 0.0, "format": 0.0},
                                        "weight of each automatic critic; 0 = off")
    critic_combine: str = setting("weighted_average", "how human reward and critics combine",
                                  choices=("weighted_average", "min", "consensus"))
    human_weight: float = setting(1.0, "weight of the human reward in weighted_average", min=0.0)
    length_target_chars: int = setting(300, "reply length the length critic aims at", min=1)


SECTIONS: dict[str, type] = {
    "server": ServerConfig, "storage": StorageConfig, "model": ModelConfig,
    "generation": GenerationConfig, "lora": LoraConfig, "ppo": PPOConfig,
    "training": TrainingConfig, "schedule": ScheduleConfig, "rewards": RewardsConfig,
}
#: Sections whose settings keep the section in their public name (``lora.r``,
#: ``training.method``): their keys are too generic to stand alone.
PREFIXED = ("lora", "training")


@dataclass(frozen=True)
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    rewards: RewardsConfig = field(default_factory=RewardsConfig)
    # Where the file settings came from (None: defaults only). Not a setting.
    source: str | None = None
    # Public name -> "model" (a named model's preset), "file", "environment", "flag" or
    # "override"; a name not here has its default. Not settings, and not part of equality.
    origins: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    # Public name -> the environment variable it was read from (REINF_PORT).
    env_names: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def data_dir(self) -> Path:
        return Path(self.storage.data_dir).expanduser() if self.storage.data_dir else home_dir()

    @property
    def db_url(self) -> str:
        return self.storage.db_url or f"sqlite:///{self.data_dir / 'reinf.db'}"

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS}

    def value(self, name: str) -> Any:
        """Setting ``name``'s value, by public name (``kl_coef``, ``lora.r``)."""
        info = _by_public()[name]
        return getattr(getattr(self, info.section), info.key)

    def origin_kind(self, name: str) -> str:
        """Where setting ``name`` (public name) came from: default, file, environment, flag
        or override."""
        return self.origins.get(name, "default")

    def origin(self, name: str) -> str:
        """Where setting ``name`` came from, for a message: the file's path, "environment
        variable REINF_PORT", "command-line flag", ... ."""
        return _describe_origin(name, self.origins, self.env_names, self.source)

    def replace(self, **overrides: Any) -> "Config":
        """A copy with some settings changed, by public name: ``cfg.replace(learning_rate=1e-3)``.

        Values go through the same checks as the config file; ``lora.r`` is spelt ``lora_r``
        and ``training.method`` ``training_method``.
        """
        flat = {name.replace("_", ".", 1) if name.startswith(tuple(s + "_" for s in PREFIXED))
                else name: value for name, value in overrides.items()}
        return _build(self.to_dict(), flat, kind="override", file=self.source,
                      origins=self.origins, env_names=self.env_names)


# --- the table of settings -------------------------------------------------------------

@dataclass(frozen=True)
class SettingInfo:
    section: str
    key: str
    public: str          # name in docs, flags and overrides: "learning_rate", "lora.r"
    env: str             # "LEARNING_RATE", "LORA_R"
    type: Any
    default: Any
    help: str
    meta: Mapping[str, Any]


def settings() -> list[SettingInfo]:
    """Every setting, in declaration order."""
    out = []
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            public = f"{section}.{f.name}" if section in PREFIXED else f.name
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            out.append(SettingInfo(section, f.name, public, public.replace(".", "_").upper(),
                                   hints[f.name], default, f.metadata["help"], f.metadata))
    return out


def _by_public() -> dict[str, SettingInfo]:
    return {s.public: s for s in settings()}


# --- loading ---------------------------------------------------------------------------

def home_dir(environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    return Path(environ.get("REINF_HOME") or DEFAULT_HOME).expanduser()


def find_config_file(environ: Mapping[str, str] | None = None) -> Path | None:
    """The config file to read when none is given: $REINF_CONFIG, else <home>/config.yaml."""
    environ = os.environ if environ is None else environ
    if environ.get("REINF_CONFIG"):
        return Path(environ["REINF_CONFIG"]).expanduser()
    candidate = home_dir(environ) / CONFIG_FILENAME
    return candidate if candidate.exists() else None


def load_config(path: str | Path | None = None, *, environ: Mapping[str, str] | None = None,
                overrides: Mapping[str, Any] | None = None) -> Config:
    """Load the effective config: defaults < the named model's defaults (``model_preset``)
    < file < environment < ``overrides`` (flags).

    ``path`` None means :func:`find_config_file`. ``overrides`` maps public names to
    values; None values are ignored, so click options can be passed straight through.
    """
    environ = os.environ if environ is None else environ
    file = Path(path).expanduser() if path else find_config_file(environ)
    tree: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    in_file: set[str] = set()
    if file is not None:
        in_file = _merge_file(tree, file)
    env_values, env_names = _read_env(environ)
    cfg = _build(tree, env_values, kind="environment", file=str(file) if file else None,
                 origins={name: "file" for name in in_file}, env_names=env_names)
    flags = {k: v for k, v in (overrides or {}).items() if v is not None}
    if flags:
        cfg = _build(cfg.to_dict(), flags, kind="flag", file=cfg.source, origins=cfg.origins,
                     env_names=cfg.env_names)
    preset = {name: value for name, value in _model_preset_of(cfg).items()
              if cfg.origin_kind(name) == "default"}
    if preset:  # the named model's own defaults, under anything the person set
        cfg = _build(cfg.to_dict(), preset, kind="model", file=cfg.source, origins=cfg.origins,
                     env_names=cfg.env_names)
    return cfg


def hidden_model_defaults(cfg: Config) -> dict[str, tuple[Any, Any]]:
    """The named model's own defaults (``model_preset``) that config.yaml hides: public name
    -> (the file's value, the model's). A key set in the file wins over the model's, which
    is right when the person chose it; a file written by an earlier ``reinf init`` set
    every key to the built-in default, and so hid them all without anyone choosing."""
    return {name: (cfg.value(name), model_value)
            for name, model_value in _model_preset_of(cfg).items()
            if cfg.origin_kind(name) == "file" and cfg.value(name) != model_value}


def _model_preset_of(cfg: Config) -> dict[str, Any]:
    """The named model's own defaults for where ``cfg`` trains (``model_preset``)."""
    return model_preset(cfg.model.model_path,
                        gpu=lambda: trains_on_gpu(cfg.model.device, cfg.ppo.train_device))


def hidden_model_defaults_note(cfg: Config, *, at_default_only: bool = False) -> str | None:
    """One line naming what :func:`hidden_model_defaults` found and the fix, or None. With
    ``at_default_only``, only keys the file sets to the built-in default count: the mark of
    a file from an earlier ``reinf init`` rather than of a choice (``reinf status`` warns
    of those; ``reinf config show`` names them all)."""
    hidden = hidden_model_defaults(cfg)
    if at_default_only:
        defaults = {s.public: s.default for s in settings()}
        hidden = {name: pair for name, pair in hidden.items() if pair[0] == defaults[name]}
    if not hidden:
        return None
    shown = ", ".join(f"{name} {json.dumps(mine)} (model: {json.dumps(model)})"
                      for name, (mine, model) in hidden.items())
    return (f"{cfg.source} sets {len(hidden)} key(s) that {cfg.model.model_path} has its own "
            f"defaults for: {shown}; `reinf config reset --model-defaults` comments those "
            "lines out to take the model's (a config.yaml from an earlier `reinf init` sets "
            "every key to the built-in default)")


def _merge_file(tree: dict[str, dict[str, Any]], file: Path) -> set[str]:
    """Put the file's settings into ``tree``; return their public names."""
    where = str(file)
    if not file.exists():
        raise ConfigError(f"config file {where} does not exist",
                          fix="create it with `reinf init`, or point REINF_CONFIG elsewhere")
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise _yaml_error(where, exc) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where} is not UTF-8 text (byte {exc.start})",
                          fix="save it as UTF-8, or delete it to use the defaults") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping of sections to settings",
                          fix="start from the reference config.yaml")
    public = _by_public()
    by_place = {(s.section, s.key): s.public for s in public.values()}
    found: set[str] = set()
    for top, value in data.items():
        if top in SECTIONS:
            if value is None:
                continue
            if not isinstance(value, dict):
                raise ConfigError(f"section '{top}' in {where} must be a mapping",
                                  key=top, fix="indent its settings under it")
            known = {f.name for f in dataclasses.fields(SECTIONS[top])}
            for key, v in value.items():
                if key not in known:
                    raise ConfigError(f"unknown key '{top}.{key}' in {where}", key=f"{top}.{key}",
                                      fix=_suggest(str(key), known, f"remove it from section '{top}'"))
                tree[top][key] = v
                found.add(by_place[(top, key)])
        elif top in public:  # a flat public name at top level is accepted too
            info = public[top]
            tree[info.section][info.key] = value
            found.add(top)
        else:
            raise ConfigError(f"unknown key '{top}' in {where}", key=str(top),
                              fix=_suggest(str(top), set(SECTIONS) | set(public), "remove it"))
    return found


def _yaml_error(where: str, exc: yaml.YAMLError) -> ConfigError:
    """One line: the file, the line and column, what the parser found. PyYAML's own text
    spans several lines (a context, a caret drawing, a note)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None) or str(exc)
    context, start = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and start and context != problem:  # "while scanning a quoted scalar"
        problem = f"{problem}, {context} that starts on line {start.line + 1}"
    problem = " ".join(str(problem).split())
    place = f"{where}, line {mark.line + 1}, column {mark.column + 1}" if mark else where
    return ConfigError(f"{place}: not valid YAML ({problem})",
                       fix="fix the syntax there (indentation, a missing colon or quote), or "
                           "delete the file to use the defaults")


def _read_env(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The settings given in the environment (public name -> text) and the variable each
    came from."""
    values: dict[str, Any] = {}
    names: dict[str, str] = {}
    for info in settings():
        candidates = [ENV_PREFIX + info.env] + ([info.env] if info.public in BARE_ENV else [])
        for var in candidates:  # the prefixed name first: it wins
            if environ.get(var) is not None:
                if not (info.public == "data_dir" and environ.get("REINF_HOME")):
                    values[info.public], names[info.public] = environ[var], var
                break
    if environ.get("REINF_HOME"):
        values["data_dir"], names["data_dir"] = environ["REINF_HOME"], "REINF_HOME"
    return values, names


def setting_variables() -> list[str]:
    """The REINF_ variable of every setting, in declaration order (REINF_PORT,
    REINF_TRAINING_METHOD)."""
    return [ENV_PREFIX + info.env for info in settings()]


def unknown_env(environ: Mapping[str, str] | None = None) -> list[str]:
    """A warning for each REINF_ variable in ``environ`` that names no setting (it is
    ignored, so a misspelt one would silently leave the default), with the nearest name."""
    environ = os.environ if environ is None else environ
    known = setting_variables()
    warnings = []
    for var in sorted(environ):
        if not var.startswith(ENV_PREFIX) or var in known or var in OTHER_ENV \
                or var.startswith("REINF_TEST_"):
            continue
        near = difflib.get_close_matches(var, known, n=1, cutoff=0.6)
        hint = f"did you mean {near[0]}? " if near else ""
        warnings.append(f"{var} names no setting and is ignored: {hint}`reinf config show` "
                        "lists the settings; the variable is REINF_ and the key upper-cased "
                        "(lora.* and training.* keep their section: REINF_TRAINING_METHOD)")
    return warnings


def _describe_origin(name: str, origins: Mapping[str, str], env_names: Mapping[str, str],
                     file: str | None) -> str:
    kind = origins.get(name)
    if kind == "environment":
        return f"environment variable {env_names.get(name, ENV_PREFIX + name.upper())}"
    if kind == "flag":
        return "command-line flag"
    if kind == "override":
        return "override"
    if kind == "model":
        return "the model's defaults (`reinf models`)"
    return file or "the defaults"


def _build(tree: Mapping[str, Mapping[str, Any]], flat: Mapping[str, Any], *, kind: str,
           file: str | None, origins: Mapping[str, str] | None = None,
           env_names: Mapping[str, str] | None = None) -> Config:
    """Apply ``flat`` (public name -> value, from ``kind``: environment, flag, override)
    over ``tree``, check, freeze. ``origins`` says where ``tree``'s values came from."""
    public = _by_public()
    merged = {name: dict(tree.get(name, {})) for name in SECTIONS}
    origins = dict(origins or {})
    env_names = dict(env_names or {})
    for name, value in flat.items():
        if name not in public:
            where = _describe_origin(name, {name: kind}, env_names, file)
            raise ConfigError(f"unknown setting '{name}' ({where})", key=name,
                              fix=_suggest(name, set(public), "see `reinf config show`"))
        info = public[name]
        merged[info.section][info.key] = value
        origins[name] = kind
    sections = {}
    for info in settings():
        where = _describe_origin(info.public, origins, env_names, file)
        raw = merged[info.section].get(info.key, info.default)
        merged[info.section][info.key] = _coerce(info, raw, where, from_text=info.public in flat
                                                 and isinstance(raw, str))
    for name, cls in SECTIONS.items():
        sections[name] = cls(**merged[name])
    data_dir = sections["storage"].data_dir or str(home_dir({}))
    sections["storage"] = dataclasses.replace(sections["storage"], data_dir=data_dir)
    cfg = Config(**sections, source=file, origins=origins, env_names=env_names)
    _check_combinations(cfg, cfg.origin)
    return cfg


def _coerce(info: SettingInfo, raw: Any, where: str, from_text: bool) -> Any:
    """Turn ``raw`` into the setting's type, or raise a ConfigError naming key, place and fix."""
    typ, meta = info.type, info.meta
    args = typing.get_args(typ)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), typ) if optional else typ
    origin = typing.get_origin(base) or base

    def fail(expected: str) -> ConfigError:
        fix = meta.get("fix") or f"set {info.public} to {expected}"
        return ConfigError(f"{info.public} = {raw!r} ({where}): expected {expected}",
                           key=info.public, fix=fix)

    if origin is not list and list in (typing.get_origin(a) for a in args):
        return _coerce_names(info, raw, where, from_text)
    if from_text and origin in (list, dict, bool):
        if origin is list and not raw.strip().startswith("["):
            raw = [p.strip() for p in raw.split(",") if p.strip()]
        else:
            try:
                raw = yaml.safe_load(raw)
            except yaml.YAMLError:
                raise fail(f"a {origin.__name__} written as YAML") from None
    if raw is None or (from_text and optional and str(raw).lower() in ("", "null", "none")):
        if optional:
            return None
        raise fail(f"a {_type_name(origin)}")
    if origin is bool:
        if isinstance(raw, bool):
            value = raw
        elif isinstance(raw, str) and raw.lower() in ("1", "true", "yes", "on", "0", "false",
                                                       "no", "off"):
            value = raw.lower() in ("1", "true", "yes", "on")
        else:
            raise fail("true or false")
    elif origin is int:
        try:
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError
            value = int(raw)
        except (TypeError, ValueError):
            raise fail("a whole number") from None
    elif origin is float:
        try:
            if isinstance(raw, bool):
                raise ValueError
            value = float(raw)
        except (TypeError, ValueError):
            raise fail("a number") from None
        if not math.isfinite(value):
            raise fail("a finite number")
    elif origin is str:
        if not isinstance(raw, (str, int, float)) or isinstance(raw, bool):
            raise fail("a string")
        value = str(raw)
    elif origin is list:
        if not isinstance(raw, list) or not all(isinstance(x, str) and x for x in raw):
            raise fail("a list of names")
        value = list(raw)
    elif origin is dict:
        if not isinstance(raw, dict):
            raise fail("a mapping of names to numbers")
        value = {}
        for k, v in raw.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ConfigError(f"{info.public}[{k!r}] = {v!r} ({where}): expected a number",
                                  key=info.public, fix=f"give {k!r} a number such as -0.2")
            value[str(k)] = float(v)
    else:  # pragma: no cover - a new setting type needs a branch here
        raise TypeError(f"unsupported setting type {typ}")
    if meta.get("choices") and value not in meta["choices"]:
        raise fail("one of " + ", ".join(meta["choices"]))
    if meta.get("min") is not None and value < meta["min"]:
        raise fail(f"a value ≥ {meta['min']}")
    if meta.get("max") is not None and value > meta["max"]:
        raise fail(f"a value ≤ {meta['max']}")
    return value


def _coerce_names(info: SettingInfo, raw: Any, where: str, from_text: bool) -> str | list[str]:
    """A setting that is one of its ``choices`` (``auto``) or a non-empty list of names;
    from text, a comma-separated string or a YAML list."""
    words = info.meta["choices"] or ()
    expected = f"{', '.join(words)}, or a list of names"
    fix = (f"set {info.public} to {' or '.join(words)}, or to a list of layer names such "
           "as [q_proj, v_proj]")
    value = raw
    if isinstance(value, str):
        if value.strip().lower() in words:
            return value.strip().lower()
        if not from_text:
            raise ConfigError(f"{info.public} = {raw!r} ({where}): expected {expected}",
                              key=info.public, fix=fix)
        try:
            value = yaml.safe_load(value) if value.strip().startswith("[") else \
                [p.strip() for p in value.split(",") if p.strip()]
        except yaml.YAMLError:
            value = None
    if not isinstance(value, list) or not value or \
            not all(isinstance(x, str) and x.strip() for x in value):
        raise ConfigError(f"{info.public} = {raw!r} ({where}): expected {expected}",
                          key=info.public, fix=fix)
    names = [x.strip() for x in value]
    for name in names:
        if name.lower() in words:
            raise ConfigError(f"{info.public} = {raw!r} ({where}): {name} is a value of its "
                              "own, not a layer name", key=info.public,
                              fix=f"set {info.public}: {name.lower()} (not in a list)")
    return names


def _type_name(origin: Any) -> str:
    return {int: "whole number", float: "number", str: "string", bool: "boolean",
            list: "list", dict: "mapping"}.get(origin, str(origin))


def _check_combinations(cfg: Config, origin: Callable[[str], str]) -> None:
    """Settings that are valid alone but not together; ``origin(name)`` says where a
    setting's value came from (a file, an environment variable, ...)."""
    r = cfg.rewards
    if r.reward_min >= r.reward_max:
        raise ConfigError(f"reward_min ({r.reward_min}) must be below reward_max ({r.reward_max})"
                          f" ({origin('reward_min')})", key="reward_min",
                          fix="e.g. reward_min: -2, reward_max: 2")
    if 0 < cfg.ppo.dual_clip <= 1:
        raise ConfigError(f"dual_clip = {cfg.ppo.dual_clip} ({origin('dual_clip')}): a bound at "
                          "or below 1 would flatten every negative advantage", key="dual_clip",
                          fix="set dual_clip to 0 (off) or a value above 1, such as 3")
    if cfg.ppo.batch_size > cfg.ppo.replay_buffer_size:
        raise ConfigError(f"batch_size ({cfg.ppo.batch_size}) exceeds replay_buffer_size "
                          f"({cfg.ppo.replay_buffer_size}) ({origin('batch_size')})",
                          key="batch_size",
                          fix="lower batch_size or raise replay_buffer_size")
    token, min_chars = cfg.server.auth_token, 16
    make_one = f"e.g. REINF_AUTH_TOKEN=$(openssl rand -hex {min_chars})"
    if token and not token.strip():
        raise ConfigError(f"auth_token is blank ({origin('auth_token')})", key="auth_token",
                          fix=f"set a random token of at least {min_chars} characters "
                              f"({make_one}), or remove auth_token")
    if not is_loopback(cfg.server.host) and not token:
        raise ConfigError(f"host {cfg.server.host} is reachable from other machines but "
                          f"auth_token is not set ({origin('host')})", key="auth_token",
                          fix=f"set auth_token ({make_one}) or bind host to 127.0.0.1")
    if not is_loopback(cfg.server.host) and len(token.strip()) < min_chars:
        raise ConfigError(f"host {cfg.server.host} is reachable from other machines but "
                          f"auth_token is only {len(token.strip())} characters; it must be at "
                          f"least {min_chars} ({origin('auth_token')})", key="auth_token",
                          fix=f"set a longer auth_token ({make_one}) or bind host to "
                              "127.0.0.1")


def is_loopback(host: str) -> bool:
    return host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")


def _suggest(word: str, options: set[str], otherwise: str) -> str:
    close = difflib.get_close_matches(word, sorted(options), n=1)
    return f"did you mean '{close[0]}'?" if close else otherwise


# --- editing the file ------------------------------------------------------------------

def comment_out_settings(file: Path, names: list[str]) -> list[str]:
    """Comment the lines of settings ``names`` (public names, or ``section.key``) out of
    config file ``file``, so each takes its default again (the named model's own where it
    has one): ``reinf config reset``. The value stays in the file, as a comment, so nothing
    a person wrote is lost. Returns the public names that were set there; a name set in a
    form this cannot edit (a flow-style section) is an error, and nothing is written."""
    public = _by_public()
    by_place = {f"{s.section}.{s.key}": s.public for s in public.values()}
    wanted: list[str] = []
    for name in names:
        if name not in public and name not in by_place:
            raise ConfigError(f"unknown setting '{name}'", key=name,
                              fix=_suggest(name, set(public) | set(by_place),
                                           "`reinf config show` lists every key"))
        wanted.append(name if name in public else by_place[name])
    text = file.read_text(encoding="utf-8")
    in_file = _merge_file({section: {} for section in SECTIONS}, file)
    targets = [name for name in dict.fromkeys(wanted) if name in in_file]
    if not targets:
        return []
    places = {(public[n].section, public[n].key) for n in targets} | {(None, n) for n in targets}
    out, section, cut_below = [], None, None
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        indent = len(body) - len(body.lstrip())
        if cut_below is not None:  # the rest of a value that spans lines
            if not body.strip() or indent > cut_below:
                out.append(_commented(line, cut_below) if body.strip() else line)
                continue
            cut_below = None
        stripped = body.strip()
        key = stripped.split(":", 1)[0].strip() if ":" in stripped else None
        if indent == 0 and key is not None and not stripped.startswith("#"):
            section = key if key in SECTIONS else None
            if section is None and (None, key) in places:
                out.append(_commented(line, 0))
                cut_below = 0
                continue
        elif section is not None and key is not None and not stripped.startswith("#") \
                and (section, key) in places:
            out.append(_commented(line, indent))
            cut_below = indent
            continue
        out.append(line)
    new_text = "".join(out)
    try:  # the edit must remove exactly those settings and change nothing else
        before = yaml.safe_load(text) or {}
        after = yaml.safe_load(new_text) or {}
    except yaml.YAMLError:
        after = None
    expected = {top: ({k: v for k, v in value.items() if (top, k) not in places}
                      if top in SECTIONS and isinstance(value, dict) else value)
                for top, value in before.items() if (None, top) not in places}
    if after is None or _without_empty(after) != _without_empty(expected):
        raise ConfigError(f"could not comment {', '.join(targets)} out of {file} line by line "
                          "(a section written on one line?)",
                          fix="edit the file by hand: delete those keys or put `#` before them")
    scratch = file.with_name(f".{file.name}.tmp-{os.getpid()}")
    try:  # 600, like everything in the data directory; then one rename, never half a file
        with os.fdopen(os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w",
                       encoding="utf-8") as handle:
            handle.write(new_text)
        os.replace(scratch, file)
    finally:
        scratch.unlink(missing_ok=True)
    return targets


def _without_empty(tree: dict) -> dict:
    """A parsed file without its empty sections (a section whose keys are all comments
    reads as None)."""
    return {key: value for key, value in tree.items() if value not in (None, {})}


def _commented(line: str, indent: int) -> str:
    return f"{line[:indent]}# {line[indent:]}"


# --- output ----------------------------------------------------------------------------

def render_yaml(cfg: Config | None = None, *, origins: bool = False,
                commented: bool = False, model: str | None = None) -> str:
    """The config as commented YAML: every key, a one-line comment, its value. With
    ``origins``, each comment starts with where the value came from: ``[default]``,
    ``[model]`` (the named model's preset), ``[file]``, ``[environment REINF_PORT]``,
    ``[flag]`` (``reinf config show``). With ``commented``, every key line is itself a
    comment (``  # port: 8765  # help``): the file ``reinf init`` writes, where a key takes
    its default, or the named model's own, until the person uncomments it. ``model``: a
    named model whose own defaults (``KnownModel.settings``, where it trains on the CPU)
    those lines show instead, marked with the built-in value, so the file does not say "off"
    of what the model turns on."""
    cfg = cfg or Config(storage=StorageConfig())
    preset = model_preset(model) if model else {}  # the CPU's: no GPU is asked about
    if commented:
        lines = ["# Reinf configuration: every key, its default and one line of help.",
                 "# Every key is commented out, so it takes its default, or the model's own",
                 "# (`reinf config show` marks those [model]); uncomment a line to set it.",
                 "# Precedence: defaults < the model's defaults < this file < environment",
                 "# (REINF_KEY) < flags.", ""]
    else:
        lines = ["# Reinf configuration. Every key, its default and one line of help.",
                 "# Precedence: defaults < the model's defaults < this file < environment",
                 "# (REINF_KEY) < flags. `reinf init` writes this file into $REINF_HOME with",
                 "# every key commented out; uncomment and edit there what you change.", ""]
    values = cfg.to_dict()
    current = None
    for info in settings():
        if info.section != current:
            if current is not None:
                lines.append("")
            lines.append(f"{info.section}:")
            current = info.section
        value = values[info.section][info.key]
        mark = ""
        if info.public in preset and preset[info.public] != value:
            built_in = json.dumps(value, ensure_ascii=False) if value is not None else "null"
            value, mark = preset[info.public], f"[{model}'s default; built-in {built_in}] "
        dumped = json.dumps(value, ensure_ascii=False) if value is not None else "null"
        if origins:
            kind = cfg.origin_kind(info.public)
            mark = f"[{kind} {cfg.env_names[info.public]}] " if kind == "environment" \
                else f"[{kind}] "
        lines.append(f"  {'# ' if commented else ''}{info.key}: {dumped}  # {mark}{info.help}")
    return "\n".join(lines) + "\n"
