"""Helpers for the trainer's end-to-end tests: a tiny model, a small config, and a
synthetic stream of rated turns whose behaviour log-probs come from the model itself.

The stream: each turn's reply starts with token GOOD or token BAD, then a few filler
tokens and EOS. The simulated person rates GOOD replies 5 and BAD replies 1. Behaviour
log-probs are what the adapter that was active when the turn was "generated" gives those
tokens (teacher forcing at the turn's temperature): exactly what the engine records.
"""
from __future__ import annotations

import random
from pathlib import Path

import torch

from reinf.config import load_config

GOOD, BAD = 40, 41          # two ordinary tokens of the tiny BPE vocabulary
TEMPERATURE = 1.0
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_model(tmp_path: Path, seed: int = 0) -> Path:
    from tiny import make_tiny_model

    return make_tiny_model(tmp_path / f"tiny-{seed}", seed=seed)


def train_config(home: Path, model_dir: Path, **overrides):
    """A config for fast CPU rounds on the tiny model (public setting names).

    ``training.method`` is ``rated`` (PPO on the rated replies alone, the cold-start mode)
    unless a test asks for ``training_method="rollouts"``: these helpers' tests check that
    method's maths; tests/e2e/test_rollouts.py covers the rating model and the rollouts."""
    settings = dict(model_path=str(model_dir), device="cpu", training_method="rated",
                    learning_rate=2e-3, batch_size=8,
                    ppo_epochs=2, lora_r=8, lora_alpha=16, lora_dropout=0.0,
                    lora_target_modules=ALL_LINEAR, kl_coef=0.02, kl_max=1.0, target_kl=0.0,
                    half_life_days=0.0, replay_buffer_size=64, keep_best=2)
    settings.update(overrides)
    return load_config(environ={"REINF_HOME": str(home)}).replace(**settings)


def load_policy(model_dir: Path, checkpoint: Path | str | None = None):
    """The base model, with the checkpoint's adapter when given, in eval mode."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    if checkpoint is not None:
        model = PeftModel.from_pretrained(model, str(checkpoint))
    return model.eval()


def reply_logprobs(model, prompt: list[int], reply: list[int], temperature: float = TEMPERATURE
                   ) -> list[float]:
    """log_softmax(logits / T) of each reply token given what precedes it, in fp32."""
    ids = torch.tensor([prompt + reply])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(-1, torch.tensor(reply)[:, None]).squeeze(-1).tolist()


def make_prompt(rng: random.Random) -> list[int]:
    return [1] + [rng.randrange(3, 300) for _ in range(rng.randrange(4, 9))] + [1]


def add_rated_turns(store, model, n: int, *, seed: int, checkpoint_id: str | None = None,
                    good_fraction: float = 0.5) -> list[int]:
    """Append ``n`` turns generated "by" ``model`` and rate them (GOOD -> 5, BAD -> 1)."""
    rng = random.Random(seed)
    conv = store.create_conversation(f"synthetic {seed}")
    turn_ids = []
    for i in range(n):
        good = rng.random() < good_fraction
        prompt = make_prompt(rng)
        reply = [GOOD if good else BAD] + [rng.randrange(3, 300) for _ in range(2)] + [2]
        turn = store.append_turn(conv.id, f"prompt {seed}-{i}", "GOOD" if good else "BAD",
                                 prompt_ids=prompt, reply_ids=reply,
                                 logprobs=reply_logprobs(model, prompt, reply),
                                 checkpoint_id=checkpoint_id,
                                 gen_params={"temperature": TEMPERATURE})
        store.rate(turn.id, 5 if good else 1)
        turn_ids.append(turn.id)
    return turn_ids


def first_token_logp(model, token: int, n: int = 24, seed: int = 999) -> float:
    """Mean log-prob of ``token`` as the first reply token over held-out prompts."""
    rng = random.Random(seed)
    total = 0.0
    for _ in range(n):
        total += reply_logprobs(model, make_prompt(rng), [token])[0]
    return total / n


def lora_vector(checkpoint: Path | str) -> torch.Tensor:
    """All LoRA weights of a checkpoint, flattened in name order."""
    from safetensors.torch import load_file

    tensors = load_file(str(Path(checkpoint) / "adapter_model.safetensors"))
    return torch.cat([tensors[k].flatten().float() for k in sorted(tensors)])


def one_thread():
    """Tiny models run fastest on one thread, above all on a shared, busy CPU; restores the
    previous setting afterwards (use as a generator fixture)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def threads_restored():
    """`reinf bench ... --threads N` sets torch's thread count in the test's own process:
    put the previous one back afterwards (use as a generator fixture)."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)
