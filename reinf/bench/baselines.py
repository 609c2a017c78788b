"""The baselines ``reinf bench learn`` runs beside Reinf's PPO, on the same rating stream.

SFT and KTO train the same LoRA adapter (``lora.*``, seeded like a fresh PPO adapter) on the
same rated turns a PPO round would see (the newest ``replay_buffer_size``, through the same
reward mapper) for ``ppo_epochs`` passes: SFT in minibatches of ``batch_size`` at
``learning_rate``, as PPO; KTO with the settings TRL documents for it (below). Each round
continues from the active checkpoint, writes a checkpoint with ``reinf.training.checkpoints``
(a zero value head: neither has a critic), records a training run, and activates it; the
bench then hot-swaps it into the engine exactly as it does a PPO checkpoint. Neither has
PPO's promotion gate.

- **Reward-weighted SFT** (``sft``): the negative log-likelihood of each reply, weighted by
  ``max(reward, 0)`` times the mapper's time-decay weight. Replies rated 4-5 are imitated
  (5 twice as strongly as 4 with the default mapper); 1-3 are ignored, since a negative
  weight would push the likelihood of a reply down without bound.
- **KTO** (``kto``): TRL's ``KTOTrainer`` (trl >= 1.0: ``from trl import KTOTrainer``),
  ratings 4-5 desirable, 1-2 undesirable, 3 dropped, with the settings TRL's KTO docs
  recommend ("Usage tips") rather than PPO's (``kto_settings``): beta 0.1 (KTOConfig's
  default); learning rate 5e-6, the top of the 5e-7..5e-6 range the docs "strongly
  recommend" (KTOConfig's default is 1e-6, the docs' ceiling for beta 0.1 on full models;
  the top of the range because we train a LoRA adapter, which the docs say takes a higher
  rate than full fine-tuning); a per-step batch of at least 4 (the KL estimate pairs each
  prompt with another completion of the batch) and an effective batch of at least 16 by
  gradient accumulation; desirable/undesirable weights that bring the weighted classes to
  the 1:1 end of the docs' 1:1-4:3 range. Epochs stay ``ppo_epochs`` (the docs: "opt for
  more epochs" rather than a higher rate) and the rate constant within a round, as PPO's.
  The reference is the base model (a second, frozen copy), the same anchor as PPO's KL
  penalty. TRL tokenizes text itself, so each prompt is the decoded prompt token ids (chat
  template included) and the completion is the reply text plus EOS.
  **The learning-rate sweep** (``--kto-lr``, ``reinf.bench.learn.KTO_SWEEP``): the docs'
  rates are for full fine-tuning, and at 5e-6 a LoRA adapter barely moves in a hundred
  ratings, so KTO runs once per rate (by default 5e-6, 1e-4 and PPO's own 1e-3), each a
  separate run on the same stream, and the goals compare Reinf with the best of them
  (``reinf.bench.aggregate.best_kto``).
- **Best-of-n at serve time** (``bestofn``): no training at all. After each of Reinf's
  rounds, the base model (no adapter) samples ``n`` replies to each probe prompt with the
  product's sampling settings, the rating model of the checkpoint Reinf serves after that
  round scores them (``rating_model.safetensors``; features from the base model's hidden
  states, ``reply_features``; the trainer's pessimistic score, ``mean - pessimism * std``)
  and the top one is kept (``choose_best``; the first on a tie); the rater rates it.
  Without a trusted rating model (none yet, or its cross-validated Spearman below
  ``training.min_consistency``: the trainer's own rule for the cold start), the pick is the
  first sample, which is the base model's probe reply itself (candidate 0 has the probe's
  seeds). It tells whether training adds anything over reranking. The candidates do not
  depend on the round or the seed (the base model and the seeds are fixed), so they are
  sampled once per run (``sample_candidates``) and only the choice changes.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import random
import tempfile
import time
import warnings
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from reinf.daemon.lock import acquire_train_lock
from reinf.daemon.worker import Outcome
from reinf.errors import ReinfError
from reinf.model.adapters import load_adapter
from reinf.rewards.mapper import compute_rewards
from reinf.training import checkpoints
from reinf.training.ppo import Policy, ValueHead, build_rollout, update_mode, weighted_mean
from reinf.training.session import (fresh_adapter, load_base, prepare_for_training,
                                    resolve_train_device)
from reinf.training.promotion import promote

log = logging.getLogger("reinf.bench.baselines")
BENCH_EXTRA = 'pip install -e ".[bench]"'
KTO_BETA = 0.1                 # KTOConfig's default
KTO_LEARNING_RATE = 5e-6       # top of the range TRL's KTO docs recommend (5e-7..5e-6)
KTO_STEP_BATCH = 4             # TRL's KTO docs: a per-step batch of at least 4 ...
KTO_EFFECTIVE_BATCH = 16       # ... and an effective batch of 16 to 128
CANDIDATE_SEED_STEP = 100_000  # candidate c of probe block b is sampled with seed + c * this + b


def check_trl(instead: str = "run with --baselines sft or none") -> str:
    """TRL's version, or a ReinfError saying how to install the bench extra (or ``instead``)."""
    try:  # the bench extra: an optional dependency, looked for when asked
        import datasets  # noqa: F401
        import trl
    except ImportError as exc:
        raise ReinfError(f"the KTO baseline needs TRL and datasets ({exc.name} is missing)",
                         fix=f"{BENCH_EXTRA}, or {instead}") from None
    return trl.__version__


class BaselineRunner:
    """Runs one baseline round at a time, with ChildRunner's interface (``run`` -> Outcome)."""

    def __init__(self, kind: str, config, store, *, learning_rate: float | None = None):
        if kind not in ("sft", "kto"):
            raise ValueError(f"unknown baseline {kind!r}")
        self.kind, self.config, self.store = kind, config, store
        self.learning_rate = KTO_LEARNING_RATE if learning_rate is None else learning_rate
        self.pid = None

    def current_run_id(self) -> int | None:
        return None

    def stop(self, reason: str = "") -> None:
        pass

    def run(self, trigger: str, *, force: bool = False) -> Outcome:
        started = time.monotonic()
        lock = acquire_train_lock(self.config, trigger=trigger)
        if lock is None:
            return Outcome("skipped", "another training round is already running")
        try:
            if not force and self.store.ratings_waiting() == 0:
                return Outcome("skipped", "nothing new to train on", error="nothing_to_train")
            run = self.store.start_run(trigger, pid=os.getpid())
            try:
                outcome = self._round(run.id)
            except Exception as exc:  # noqa: BLE001 - the job boundary, as in the trainer
                log.exception("%s round failed", self.kind)
                message = f"{self.kind} round failed: {type(exc).__name__}: {exc}"
                self.store.finish_run(run.id, "failed", error=message[:500])
                outcome = Outcome("failed", message, run_id=run.id, error="error")
        finally:
            lock.release()
        outcome.seconds = time.monotonic() - started
        outcome.metrics.setdefault("seconds", outcome.seconds)
        return outcome

    def _round(self, run_id: int) -> Outcome:
        config, store = self.config, self.store
        samples = store.training_samples(config.ppo.replay_buffer_size)
        rows = {r.turn_id: r for r in compute_rewards(config, samples,
                                                      now=datetime.now(timezone.utc))}
        kept = [(s, rows[s.turn_id]) for s in samples if s.turn_id in rows and rows[s.turn_id].kept]
        round_no = sum(r.status == "succeeded" for r in store.list_runs(limit=10_000)) + 1
        seed = config.ppo.seed + round_no
        started = time.perf_counter()
        model, loaded, parent = load_trainable(config, store)
        if self.kind == "sft":
            metrics = train_sft(model, kept, config, seed)
        else:
            metrics = train_kto(model, loaded, kept, config, seed,
                                Path(config.data_dir) / "kto-work",
                                learning_rate=self.learning_rate)
        metrics.update(seconds=time.perf_counter() - started, round=round_no, parent_id=parent,
                       reward_mean=(sum(r.reward for _, r in kept) / len(kept)) if kept else 0.0)
        if not metrics["samples"]:
            reason = metrics.pop("why", "no usable samples")
            store.finish_run(run_id, "rejected", metrics=checkpoints.jsonable(metrics),
                             error=reason, samples=0)
            return Outcome("rejected", f"round skipped: {reason}", run_id=run_id,
                           metrics=metrics)
        root = checkpoints.root_dir(config)
        ckpt_id = checkpoints.create_checkpoint_id(round_no)
        hidden = model.config.get_text_config().hidden_size
        path = checkpoints.write_checkpoint(
            root, ckpt_id, model=model, value_head=ValueHead(hidden),
            state={"version": 1, "round": round_no, "baseline": self.kind},
            metrics={**metrics, "checkpoint_id": ckpt_id, "run_id": run_id})
        promote(config, store, run_id, ckpt_id, path, parent_id=parent, metrics=metrics,
                samples=metrics["samples"])
        return Outcome("succeeded", f"{self.kind} round {round_no}: checkpoint {ckpt_id}",
                       run_id=run_id, checkpoint_id=ckpt_id, metrics=metrics)


@contextlib.contextmanager
def quiet():
    """Third-party deprecation notices (peft, transformers, TRL) say nothing the person can
    act on; they stay out of the benchmark's output."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        yield


def load_trainable(config, store):
    """The base on the training device with the active checkpoint's adapter (trainable), or
    a fresh adapter seeded exactly as a first PPO round seeds its own."""
    loaded = load_base(config, resolve_train_device(config)[0])
    active = store.active_checkpoint()
    with quiet():
        model = prepare_for_training(loaded, False)
        if active is not None:
            model = load_adapter(model, Path(active.path), active.id, trainable=True)
        else:
            model = fresh_adapter(model, config, seed=config.ppo.seed)
    return model, loaded, active.id if active else None


# --- reward-weighted SFT -----------------------------------------------------------------------

def train_sft(model, kept, config, seed: int) -> dict[str, Any]:
    """``ppo_epochs`` passes of weighted NLL on the replies with a positive reward."""
    episodes = [(s.prompt_ids, s.reply_ids, s.logprobs, 1.0, row.reward,
                 max(row.reward, 0.0) * row.weight) for s, row in kept]
    episodes = [e for e in episodes if e[5] > 0 and e[0]]
    if not episodes:
        return {"samples": 0, "why": "no reply with a positive reward to imitate"}
    device = next(model.parameters()).device
    b = build_rollout(episodes, device)
    policy = Policy(model, ValueHead(model.config.get_text_config().hidden_size))
    params = [p for _, p in sorted(model.named_parameters()) if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.ppo.learning_rate, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    bs, losses = config.ppo.batch_size, []
    with update_mode(model):
        for _ in range(config.ppo.ppo_epochs):
            order = torch.randperm(len(b), generator=generator).to(device)
            for start in range(0, len(b), bs):
                mb = b.select(order[start:start + bs])
                out = policy.forward(mb, values=False)
                loss = weighted_mean(-out.logp, mb.mask, mb.weights)  # weighted NLL per token
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, config.ppo.max_grad_norm or math.inf)
                optimizer.step()
                losses.append(float(loss.detach()))
    return {"samples": len(episodes), "loss": sum(losses) / len(losses), "steps": len(losses),
            "dropped": len(kept) - len(episodes)}


# --- KTO (TRL) ---------------------------------------------------------------------------------

def build_kto_rows(kept, tokenizer, seed: int) -> list[dict[str, Any]]:
    """prompt (text, chat template included) / completion / label rows: 4-5 desirable,
    1-2 undesirable, 3 dropped; shuffled (seeded), since TRL reads them in order."""
    rows = [{"prompt": tokenizer.decode(s.prompt_ids, skip_special_tokens=False),
             "completion": s.response, "label": s.score >= 4}
            for s, _ in kept if s.score != 3 and s.prompt_ids]
    random.Random(seed).shuffle(rows)
    return rows


def kto_weights(rows) -> tuple[float, float]:
    """(desirable_weight, undesirable_weight) at the low end of the range TRL recommends
    (KTO paper, eq. 8): the larger class is weighted down to balance the smaller one."""
    n_good = sum(r["label"] for r in rows)
    n_bad = len(rows) - n_good
    if n_good and n_bad:
        return (n_bad / n_good, 1.0) if n_good > n_bad else (1.0, n_good / n_bad)
    return 1.0, 1.0


def kto_settings(config, learning_rate: float = KTO_LEARNING_RATE) -> dict[str, Any]:
    """KTO's hyperparameters (TRL's documented recommendations, see the module docstring):
    the per-step batch is ``batch_size`` (at least 4), accumulated to at least 16; the
    learning rate is the sweep's (``--kto-lr``), by default TRL's 5e-6."""
    step = max(KTO_STEP_BATCH, config.ppo.batch_size)
    accumulation = max(config.ppo.gradient_accumulation_steps,
                       math.ceil(KTO_EFFECTIVE_BATCH / step))
    return {"learning_rate": learning_rate, "beta": KTO_BETA, "batch_size": step,
            "gradient_accumulation_steps": accumulation, "effective_batch": step * accumulation,
            "epochs": config.ppo.ppo_epochs, "lr_scheduler": "constant",
            "class_weights": "balanced to 1:1 (kto_weights)"}


def kto_dataset(rows):
    """The KTO rows as a `datasets.Dataset`, named by a hash of their text.

    `Dataset.from_list` names a new table by pickling it with dill, and with pyarrow 24 or
    25 under datasets 5.2 that pickling fails ("Can't pickle <class 'MonthDayNano'>"): every
    KTO round of a GPU lease died so on 2026-11-28. A name given here skips that pickling.
    """
    import pyarrow
    from datasets import Dataset

    text = json.dumps(rows, sort_keys=True, ensure_ascii=False).encode()
    return Dataset(pyarrow.Table.from_pylist(rows),
                   fingerprint=hashlib.sha256(text).hexdigest()[:16])


def train_kto(model, loaded, kept, config, seed: int, work: Path, *,
              learning_rate: float = KTO_LEARNING_RATE) -> dict[str, Any]:
    check_trl()
    # Function-local: TRL and datasets are the bench extra (check_trl says how to get
    # them), and TRL's trainer stack loads only for a KTO round.
    import datasets
    import transformers
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import KTOConfig, KTOTrainer

    rows = build_kto_rows(kept, loaded.tokenizer, seed)
    if not rows:
        return {"samples": 0, "why": "no rating of 1-2 or 4-5 to learn from"}
    desirable, undesirable = kto_weights(rows)
    hp = kto_settings(config, learning_rate)
    ref = load_base(config, str(loaded.device)).model.eval().requires_grad_(False)
    work.mkdir(parents=True, exist_ok=True)
    cpu = str(loaded.device) == "cpu"
    datasets.disable_progress_bars()
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    trl_log = logging.getLogger("trl")
    trl_level = trl_log.level
    trl_log.setLevel(logging.ERROR)
    try:
        with quiet(), tempfile.TemporaryDirectory(dir=work) as out:
            args = KTOConfig(
                output_dir=out, learning_rate=hp["learning_rate"],
                num_train_epochs=hp["epochs"], per_device_train_batch_size=hp["batch_size"],
                gradient_accumulation_steps=hp["gradient_accumulation_steps"],
                lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
                max_grad_norm=config.ppo.max_grad_norm, beta=hp["beta"],
                desirable_weight=desirable, undesirable_weight=undesirable,
                logging_strategy="no", save_strategy="no", report_to="none", use_cpu=cpu,
                bf16=False, gradient_checkpointing=False, seed=seed, data_seed=seed,
                disable_tqdm=True, dataloader_num_workers=0, max_length=None)
            trainer = KTOTrainer(model=model, ref_model=ref, args=args,
                                 train_dataset=kto_dataset(rows),
                                 processing_class=loaded.tokenizer)
            for callback in (PrinterCallback, ProgressCallback):
                trainer.remove_callback(callback)
            result = trainer.train()
    finally:
        transformers.logging.set_verbosity(verbosity)
        trl_log.setLevel(trl_level)
    n_good = sum(r["label"] for r in rows)
    return {"samples": len(rows), "desirable": n_good, "undesirable": len(rows) - n_good,
            "loss": float(result.training_loss), "steps": int(result.global_step),
            "desirable_weight": desirable, "undesirable_weight": undesirable,
            "dropped": len(kept) - len(rows)}


# --- best-of-n at serve time ---------------------------------------------------------------

@dataclass
class Candidates:
    """``n`` base-model replies to each of ``count`` probe prompts, with their rating-model
    features, and what sampling them cost."""
    replies: list[list[Any]]           # [probe reply j][candidate c]: reinf.bench.probe.ProbeReply
    features: torch.Tensor | None      # (rows, D), one row per scored reply (``rows``)
    rows: list[tuple[int, int]]        # (j, c) of each feature row; empty replies have none
    sample_seconds: list[float]        # per candidate c: sampling all ``count`` replies
    feature_seconds: float

    @property
    def n(self) -> int:
        return len(self.sample_seconds)

    def cost(self) -> dict[str, Any]:
        """Seconds spent, for the report: sampling n x count replies (a probe's sampling n
        times over), and the features the rating model reads."""
        sampled = sum(self.sample_seconds)
        total = sampled + self.feature_seconds
        one = self.sample_seconds[0] if self.sample_seconds else 0.0
        return {"n": self.n, "replies": len(self.replies), "samples": self.n * len(self.replies),
                "sample_seconds": sampled, "sample_seconds_by_candidate": self.sample_seconds,
                "one_sample_seconds": one, "feature_seconds": self.feature_seconds,
                "seconds": total, "seconds_per_reply": total / max(len(self.replies), 1),
                "ratio_to_one_sample": total / one if one > 0 else None}


def sample_candidates(engine, prompts, n: int, count: int, *, seed: int,
                      progress=None) -> Candidates:
    """``n`` replies to each of the first ``count`` ``prompts`` from ``engine``'s model as it
    is (the bare base for best-of-n), with the product's sampling settings, through the
    probe's own sampler (``reinf.bench.probe.sample_probe``): candidate c of block b has
    seed ``seed + c * CANDIDATE_SEED_STEP + b``, so candidate 0 is the probe reply itself.
    Then every reply's rating-model features (``Engine.rating_features``: the base model's
    hidden states)."""
    from reinf.bench.probe import sample_probe

    per, seconds = [], []
    for c in range(n):
        started = time.perf_counter()
        per.append(sample_probe(engine, prompts, 0, count, seed=seed + c * CANDIDATE_SEED_STEP))
        seconds.append(time.perf_counter() - started)
        if progress:
            progress(f"  best-of-{n}: candidate {c + 1}/{n} of {count} probe replies sampled "
                     f"in {seconds[-1]:.1f} s")
    replies = [[per[c][j] for c in range(n)] for j in range(count)]
    rows = [(j, c) for j in range(count) for c in range(n)
            if replies[j][c].reply_ids and replies[j][c].prompt_ids]
    started = time.perf_counter()
    features = engine.rating_features([(replies[j][c].prompt_ids, replies[j][c].reply_ids)
                                       for j, c in rows]) if rows else None
    return Candidates(replies, features, rows, seconds, time.perf_counter() - started)


@dataclass
class Choice:
    """Which candidate best-of-n keeps for each probe reply, and why."""
    chosen: list[int]                          # candidate index per probe reply
    predicted: list[list[float | None]] | None  # the scores it chose by; None: not reranked
    consistency: float | None                  # the rating model's cross-validated Spearman
    reranked: bool


def choose_best(state: dict | None, candidates: Candidates, *, pessimism: float,
                min_consistency: float) -> Choice:
    """Best-of-n's pick with a rating model (``RatingModel.state_dict()``, as saved with a
    checkpoint): the candidate with the highest pessimistic score (``mean - pessimism *
    std``, the trainer's reward for a fresh reply), the first one on a tie. Without a rating
    model, or with one the trainer would not trust (Spearman below ``min_consistency`` or
    undefined), it keeps the first sample."""
    from reinf.training.rating_model import RatingModel

    count, n = len(candidates.replies), candidates.n
    first = [0] * count
    if state is None:
        return Choice(first, None, None, False)
    model = RatingModel.from_state_dict(state)
    if model.consistency is None or model.consistency < min_consistency \
            or candidates.features is None:
        return Choice(first, None, model.consistency, False)
    scores = model.score(candidates.features, pessimism).tolist()
    grid: list[list[float | None]] = [[None] * n for _ in range(count)]
    for (j, c), score in zip(candidates.rows, scores):
        grid[j][c] = float(score)
    chosen = [max(range(n), key=lambda c, row=row: (-math.inf if row[c] is None else row[c], -c))
              for row in grid]
    return Choice(chosen, grid, model.consistency, True)
