"""The training session of a round: the base model on the training device, the adapter
and value head, the optimizer, and the state carried from round to round.

A round continues from the ACTIVE checkpoint: its adapter (``reinf.model.adapters.load_adapter``,
trainable), value head, optimizer state, KL controller, running reward statistics and
counters. With the base model active (first round, or ``reinf rollback base``) everything
starts fresh: a new adapter seeded by ``ppo.seed``, a zero value head, ``kl_coef`` from the
config. Changing ``lora.*`` affects only fresh adapters (a warning says so). A damaged
``trainer_state.pt`` or ``value_head.safetensors`` in the active checkpoint does not stop
the round: that part starts fresh (the counters come from ``metrics.json``), and a one-line
warning in the round's metrics names the checkpoint and the file.

After a round rejected for its KL, the next round from the same parent starts with at
least the rejected round's doubled kl_coef, so it does not repeat the same rejection.

peft (which imports transformers) is imported where an adapter is made, not at the top: the
benchmarks' baselines import this module, and their unit tests run without transformers.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

# load_base calls memory.trainer_quantization and modeling.load_model through their modules,
# so that tests can stand in for them there.
from reinf.errors import ModelError, ReinfError
from reinf.model import memory
from reinf.model import modeling
from reinf.model.adapters import load_adapter
from reinf.model.lora import adapted_layers, fan_in_fan_out, lora_targets, target_layers
from reinf.model.modeling import cuda_facts, get_context_limit, quiet_peft
from reinf.training import checkpoints
from reinf.training.ppo import KLController, Policy, RunningMoments, ValueHead

log = logging.getLogger("reinf.training")


@dataclass
class Session:
    """Everything a round trains and carries forward."""
    policy: Policy
    optimizer: torch.optim.Optimizer
    kl_ctl: KLController
    reward_stats: RunningMoments
    counters: dict[str, int]         # round, global_step, samples_seen
    parent_id: str | None
    loaded: Any                      # reinf.model.modeling.LoadedModel
    warnings: list[str] = field(default_factory=list)
    context_limit: int = 0           # longest prompt + reply the model takes, in tokens


# --- model, adapter and state ---------------------------------------------------------------

def resolve_train_device(config) -> tuple[str | None, list[str]]:
    """The device to load for training (None: the serving device) and any warning."""
    want = config.ppo.train_device
    if want == "auto":
        return None, []
    here = modeling.visible_devices()
    if want == "cuda" and not here["cuda"]:
        return "cpu", ["train_device cuda: no CUDA GPU here, training on the CPU"]
    if want == "mps" and not here["mps"]:
        return "cpu", ["train_device mps: MPS is not available, training on the CPU"]
    return want, []


def load_base(config, device: str | None):
    """The base model for training, via reinf.model.modeling; a missing model says so plainly.

    Its quantization is ``training.base_quantization`` (reinf.model.memory.trainer_quantization):
    with ``auto``, a 4-bit base where the memory plan says an unquantized one will not fit
    beside the server on the GPU; the round's warnings then say so."""
    quantization, why = memory.trainer_quantization(config)
    try:
        loaded = modeling.load_model(config, device=device, for_training=True,
                                     quantization=quantization)
    except ModelError as exc:
        if exc.message.startswith("no model"):
            raise ModelError(f"model missing: {exc.message}", fix=exc.fix, key=exc.key) from exc
        raise
    if why and loaded.quantization != "none":
        log.warning(why)
        loaded.warnings.append(why)
    return loaded


def prepare_for_training(loaded, gradient_checkpointing: bool):
    """QLoRA preparation for a 4/8-bit base, activation checkpointing when asked, no KV cache."""
    model = loaded.model
    if getattr(loaded, "quantization", "none") in ("4bit", "8bit"):
        from peft import prepare_model_for_kbit_training  # peft: see the module docstring
        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=gradient_checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False})
    elif gradient_checkpointing:
        enable_checkpointing(model)
        model.enable_input_require_grads()
    model.config.use_cache = False
    return model


def enable_checkpointing(model) -> None:
    """Activation checkpointing, non-reentrant: ``activation_checkpointing_enable`` from
    transformers 5.24, ``gradient_checkpointing_enable`` before (deprecated since)."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable({"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False})


def build_session(config, store) -> Session:
    """Load the base, then the active checkpoint (or a fresh adapter) and all PPO state."""
    device, warnings = resolve_train_device(config)
    loaded = load_base(config, device)
    warnings += list(getattr(loaded, "warnings", []) or [])
    ppo = config.ppo
    with quiet_peft():
        model = prepare_for_training(loaded, ppo.gradient_checkpointing)
    active = store.active_checkpoint()
    hidden = model.config.get_text_config().hidden_size
    value_head = ValueHead(hidden)
    state: dict[str, Any] = {}
    with quiet_peft():
        if active is not None:
            ckpt = checkpoints.load_checkpoint(Path(active.path))
            peft_model = load_adapter(model, ckpt.path, active.id, trainable=True)
            value_head = _load_value_head(ckpt, hidden)
            state = _usable_state(ckpt)
            warnings += _damage_warnings(active.id, ckpt)
            warnings += _lora_drift(config, peft_model)
        else:
            peft_model = fresh_adapter(model, config, seed=ppo.seed)
    value_head.to(loaded.device)
    # native bf16 only (cuda_facts): emulated bf16 is slow
    amp = torch.bfloat16 if (str(loaded.device).startswith("cuda")
                             and cuda_facts()[0]) else None
    policy = Policy(peft_model, value_head, amp_dtype=amp,
                    detach_value=ppo.value_detach)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=ppo.learning_rate, weight_decay=0.0)
    if state.get("optimizer"):
        try:
            optimizer.load_state_dict(state["optimizer"])
        except (ValueError, KeyError) as exc:
            warnings.append(f"optimizer state did not match the adapter ({exc}); starting it "
                            "fresh")
        for group in optimizer.param_groups:
            group["lr"] = ppo.learning_rate  # the config's value wins over the saved one
    kl_ctl = KLController(ppo.kl_coef, ppo.kl_target, ppo.kl_horizon, ppo.adaptive_kl)
    if ppo.adaptive_kl and state.get("kl_controller"):
        kl_ctl.load_state_dict(state["kl_controller"])  # checked by _usable_state
    parent_id = active.id if active else None
    if ppo.adaptive_kl:
        kl_ctl.coef = max(kl_ctl.coef, _after_rejection(store, parent_id))
    stats = RunningMoments()
    if state.get("reward_stats"):
        stats.load_state_dict(state["reward_stats"])
    counters = {k: int(state.get(k, 0)) for k in ("round", "global_step", "samples_seen")}
    # The longest row a round reads: the model's own limit, or less (training.max_train_tokens
    # bounds the round's memory, reinf.model.memory).
    limit = min(get_context_limit(loaded.model, loaded.tokenizer),
                config.training.max_train_tokens)
    return Session(policy, optimizer, kl_ctl, stats, counters, parent_id, loaded, warnings,
                   context_limit=limit)


def _load_value_head(ckpt, hidden: int) -> ValueHead:
    """The checkpoint's value head; a fresh one (zero, as in a first round) where its file
    is damaged or does not fit this model, named in ``ckpt.damaged``."""
    head = ValueHead(hidden)
    if ckpt.value_head is None:
        return head
    try:
        head.load_state_dict(ckpt.value_head)
    except (RuntimeError, KeyError, ValueError, TypeError) as exc:
        ckpt.damaged.append((checkpoints.VALUE_HEAD, checkpoints.one_line(exc)))
        return ValueHead(hidden)  # not a half-loaded one
    return head


def _usable_state(ckpt) -> dict[str, Any]:
    """The trainer state to continue from. Where trainer_state.pt is damaged (or holds what
    the optimizer, KL controller and reward statistics cannot take), those start fresh and
    only the round counters carry on, from metrics.json; ``ckpt.damaged`` names the file."""
    state = ckpt.state
    if state is not None:
        try:  # what build_session does with it, on throwaway objects
            if state.get("kl_controller"):
                KLController(0.1, 6.0, 10_000).load_state_dict(state["kl_controller"])
            if state.get("reward_stats"):
                RunningMoments().load_state_dict(state["reward_stats"])
            for name in ("round", "global_step", "samples_seen"):
                int(state.get(name, 0))
            if state.get("optimizer") and not isinstance(state["optimizer"], dict):
                raise TypeError("the optimizer state is not a mapping")
            return state
        except (KeyError, ValueError, TypeError) as exc:
            ckpt.damaged.append((checkpoints.TRAINER_STATE, checkpoints.one_line(exc)))
    counters = {}
    for name in ("round", "global_step", "samples_seen"):
        value = ckpt.metrics.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            counters[name] = value
    return counters


def _damage_warnings(checkpoint_id: str, ckpt) -> list[str]:
    """One line per damaged file of the active checkpoint: which, why, and what this round
    does instead (it writes a whole new checkpoint, so the damage stops with it)."""
    instead = {checkpoints.VALUE_HEAD: "a fresh value head",
               checkpoints.TRAINER_STATE: "a fresh optimizer, KL controller and reward "
                                          "statistics",
               checkpoints.METRICS: "no metrics from it"}
    out = []
    for name, why in dict(ckpt.damaged).items():
        text = (f"checkpoint {checkpoint_id}: {name} cannot be read ({why}); this round "
                f"continues from its adapter with {instead.get(name, 'that part fresh')} — "
                "`reinf rollback` to its parent if you would rather not")
        log.warning("%s (%s)", text, ckpt.path / name)
        out.append(text)
    return out


def fresh_adapter(model, config, *, seed: int):
    """``model`` with a new LoRA adapter as ``lora.*`` says, its A matrices drawn from
    ``seed`` (LoRA initialises them from the global RNG, which is left as it was)."""
    from peft import LoraConfig, get_peft_model  # peft: see the module docstring

    targets = lora_targets(model, config.lora.target_modules)
    lora = LoraConfig(r=config.lora.r, lora_alpha=config.lora.alpha,
                      lora_dropout=config.lora.dropout, task_type="CAUSAL_LM",
                      target_modules=targets, fan_in_fan_out=fan_in_fan_out(model, targets))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, lora)


def _after_rejection(store, parent_id: str | None) -> float:
    """kl_coef to start from when the last round from this parent was rejected for its KL."""
    runs = [r for r in store.list_runs(limit=5) if r.status in ("succeeded", "rejected")]
    if runs and runs[0].status == "rejected" and runs[0].metrics.get("parent_id") == parent_id:
        value = runs[0].metrics.get("kl_coef_next")
        return float(value) if isinstance(value, (int, float)) else 0.0
    return 0.0


def _lora_drift(config, peft_model) -> list[str]:
    """A warning when ``lora.*`` no longer describes the checkpoint's adapter. Targets are
    compared as the layers they select in this model (``auto`` and a list naming the same
    layers agree), never as the setting's spelling."""
    saved = peft_model.peft_config["default"]
    have = adapted_layers(peft_model)
    try:
        want = target_layers(peft_model, lora_targets(peft_model, config.lora.target_modules))
    except ReinfError as exc:
        want, why = None, f": {exc.message}"
    else:
        why = "" if want == have else (f": the adapter is on {_leaves(have)}, the setting "
                                       f"selects {_leaves(want)}")
    if saved.r != config.lora.r or want != have:
        return [f"lora settings changed (checkpoint r={saved.r}{why}); they apply after "
                "`reinf rollback base` starts a fresh adapter"]
    return []


def _leaves(names: set[str]) -> str:
    return ", ".join(sorted({n.rsplit(".", 1)[-1] for n in names})) or "no layer"


def unreadable(session: Session, prompt_ids, reply_ids) -> str | None:
    """Why the model cannot read prompt + reply ("no_prompt", "too_long", "bad_tokens"),
    or None. The rating model and PPO skip the same turns for the same reasons."""
    ids = list(prompt_ids) + list(reply_ids)
    vocab = session.policy.model.get_input_embeddings().num_embeddings
    if not prompt_ids:
        return "no_prompt"
    if session.context_limit and len(ids) > session.context_limit:
        return "too_long"
    if min(ids) < 0 or max(ids) >= vocab:
        return "bad_tokens"
    return None


def select_episodes(session: Session, kept, used: list | None = None
                    ) -> tuple[list[tuple], dict[str, int]]:
    """(prompt_ids, reply_ids, logprobs, temperature, reward, weight) per usable sample,
    and how many were skipped for which reason; ``used``, when given, gets each episode's
    sample, in the same order."""
    skipped = {"logprobs_mismatch": 0, "too_long": 0, "no_prompt": 0, "bad_tokens": 0,
               "bad_temperature": 0}
    episodes = []
    for sample, row in kept:
        if len(sample.logprobs) != len(sample.reply_ids):
            skipped["logprobs_mismatch"] += 1
        elif reason := unreadable(session, sample.prompt_ids, sample.reply_ids):
            skipped[reason] += 1
        elif not sample.temperature > 0:
            skipped["bad_temperature"] += 1
        else:
            # a reply served in a style: its log-probs are of the styled prompt, not this one
            logprobs = None if sample.styled else sample.logprobs
            episodes.append((sample.prompt_ids, sample.reply_ids, logprobs,
                             sample.temperature, row.reward, row.weight))
            if used is not None:
                used.append(sample)
    return episodes, {k: v for k, v in skipped.items() if v}
