"""One training round: ratings -> rating model -> fresh rollouts -> PPO -> checkpoint.

``train_round(config, store, ...)`` is the unit the scheduler, the CLI and the benchmark
call. It runs RLHF's two stages incrementally (docs/training.md):

1. it refuses when no rating, pick or rewrite arrived since the last finished round
   ("nothing new to train on"), unless ``force``; it records a ``training_runs`` row,
   reads the newest ``replay_buffer_size`` rated turns and maps them to rewards and weights
   (``reinf.rewards.mapper``; a broken hook fails the run);
2. loads the base model on the training device and continues from the ACTIVE checkpoint
   (``reinf.training.session``), or from its parent when the person's blind picks put it
   behind that (the picks rule, ``reinf.training.leaderboard.choose_start``); fits the **rating
   model** on every rating that is not forgotten, the person's rewrites (a 5 each, and a
   pick over the turn's reply) and their picks (``reinf.training.plan``, with
   ``reinf.training.rating_model``, ``reinf.training.rewrites`` and
   ``reinf.training.pairs``); its cross-validated Spearman decides the mode: ``rollouts``
   once it is trustworthy, else ``rated`` (the cold start, and ``training.method: rated``):
   PPO on the rated replies alone, as the first version did (with RLOO's baseline under
   ``ppo.advantage: rloo``, the default: the other rated replies; GAE as then under ``gae``);
3. in rollout mode, samples fresh replies from the current adapter for a few prompts
   (``reinf.training.plan``, through ``reinf.training.rollouts``), scores them with the
   rating model and the person's reward mapper, and keeps the person's rated replies to the
   same prompts, with their real score, in the batch; in either mode the person's rewrites
   join the batch as demonstrations, rewarded as a 5, and are also imitated
   (``training.rewrite_imitation_rule``: once, or until likely; ``reinf.training.rewrites``),
   and with ``training.imitate_rated`` so are the rated replies scored that high; the
   replies asked for in a style (``imitate_explored``, ``imitate_styled``) are imitated
   until likely, in every round, whatever that rule;
4. runs PPO (``reinf.training.ppo``): leave-one-out baseline over the replies to one prompt
   (``ppo.advantage: rloo``; a rated reply alone with its prompt: over the other rated
   replies) or the value head with GAE; in rollout mode, stages 3 and 4 run
   ``training.rollout_iterations`` times, each on fresh replies from the adapter as the
   last pass left it, against the same rating model;
   with ``training.drift_budget`` > 0, an adapter that raised the perplexity of the base
   model's own text by more than that is then scaled towards the base until it is within
   (``reinf.training.budget``);
5. the promotion gate (``reinf.training.promotion``): a round with NaN, whose KL per reply
   token to the base exceeds ``kl_max``, or whose perplexity on the person's well-rated
   replies rose more than ``training.max_perplexity_increase`` over the base, is
   ``rejected``: its row is recorded, no files are kept, and it is never activated; after
   a KL rejection the next round from the same parent starts with at least twice the
   rejected round's kl_coef; before it, the new adapter and the base answer the person's
   newest prompts and the rating model judges them (``vs_base``: what changed, at a glance,
   with the person's own picks against the base);
6. writes the checkpoint atomically (adapter, rating model, state, and the value head when
   the round trained it: GAE), records and activates it, applies retention, and finishes
   the run with its metrics. If a turn it trained on (or the context of one) was forgotten
   while it ran, that same transaction refuses: the run is ``rejected`` naming how many,
   and the files are removed.

Any failure finishes the run as ``failed`` with a one-line reason and raises a ReinfError
for the person; the traceback goes to ``<data_dir>/logs/trainer.log`` only.

The stages live in those modules, so ``_run`` reads as the round's outline. The process
around a round (arguments, progress, the exit code and the JSON result line) is
``reinf.training.child``: the daemon runs ``python -m reinf.training.child``.
"""
from __future__ import annotations

import math
import os
import time
import traceback
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from reinf.errors import HookError, ReinfError, TrainingError
from reinf.training import checkpoints
from reinf.training.outcome import NothingToTrain
from reinf.training.pairs import pairs_waiting
from reinf.training.plan import collect_rollouts, plan_round, styled_demonstrations
from reinf.training.styles import usual_rating
from reinf.training.rewrites import (best_rated_episodes, demonstrations, imitated_before,
                                     read_rewrites)
from reinf.training.promotion import (gate, measure_fluency, measure_vs_base, promote,
                                      reject_forgotten)

STATE_VERSION = 1
OOM_FIX = ("lower batch_size (raise gradient_accumulation_steps to keep the step size), set "
           "gradient_checkpointing: true, or quantization: 4bit on CUDA")


@dataclass
class RoundResult:
    run_id: int | None
    status: str                      # succeeded | rejected | failed | skipped
    metrics: dict[str, Any]
    checkpoint_id: str | None
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "status": self.status, "checkpoint_id": self.checkpoint_id,
                "metrics": checkpoints.jsonable(self.metrics), "message": self.message}


# --- the round ------------------------------------------------------------------------

def train_round(config, store, *, trigger: str = "manual", progress: Callable | None = None,
                now: datetime | None = None, force: bool = False) -> RoundResult:
    """Run one training round; see the module docstring. Raises ReinfError on failure."""
    started = time.perf_counter()
    root = checkpoints.root_dir(config)
    checkpoints.clean_stray(root)
    if not force and store.ratings_waiting() == 0 and not pairs_waiting(store):
        raise NothingToTrain("nothing new to train on: no ratings, picks or rewrites since "
                             "the last round",
                             fix="rate some replies first (`reinf rate last 5`), or pass "
                                 "--force to train on the stored ratings again")
    run = store.start_run(trigger, pid=os.getpid())
    try:
        return _run(config, store, run.id, root, progress, now, started)
    except BaseException as exc:  # KeyboardInterrupt too: the row must not stay "running"
        reason = _one_line(exc)
        _log_failure(config, run.id, exc)
        store.finish_run(run.id, "failed", error=reason,
                         metrics={"seconds": time.perf_counter() - started})
        if isinstance(exc, HookError):
            broken = HookError(f"reward hook broken: {exc.message}", fix=exc.fix, key=exc.key)
            broken.path, broken.line = getattr(exc, "path", None), getattr(exc, "line", None)
            broken.run_id = run.id
            raise broken from exc
        if isinstance(exc, ReinfError):
            exc.run_id = run.id
            raise
        if not isinstance(exc, Exception):
            raise
        fix = (OOM_FIX if type(exc).__name__ in ("OutOfMemoryError", "MemoryError")
               else f"details in {_log_path(config)}; run `reinf train` again after fixing "
                    "the cause")
        err = TrainingError(f"training failed: {reason}", fix=fix)
        err.run_id = run.id
        raise err from exc


def _run(config, store, run_id: int, root: Path, progress, now, started) -> RoundResult:
    # torch and transformers load only once there is work: a round with nothing to do
    # (the daemon's child, every few minutes) stays cheap.
    from reinf.training.leaderboard import choose_start, picks_vs_base
    from reinf.rewards.mapper import compute_rewards
    from reinf.training.anchor import anchor_episodes
    from reinf.training.budget import DRIFT_TEXTS, NO_BUDGET, hold_to_budget
    from reinf.training.ppo import Hyper, build_rollout, train_policy
    from reinf.training.session import build_session, select_episodes

    report = progress or (lambda event: None)
    now = now or datetime.now(timezone.utc)
    # 1. The person's ratings, mapped to rewards (a broken hook stops the round here).
    # One read serves both: PPO's replay buffer is the newest part of what the rating model
    # is fitted on.
    rated = store.training_samples(max(config.ppo.replay_buffer_size,
                                       config.training.rating_model_max)
                                   if config.training.method == "rollouts"
                                   else config.ppo.replay_buffer_size)
    read_at = datetime.now(timezone.utc)  # a forget after this is checked at promotion
    samples = rated[:config.ppo.replay_buffer_size]
    report({"stage": "rewards", "samples": len(samples)})
    rows = compute_rewards(config, samples, now=now)
    by_turn = {row.turn_id: row for row in rows}
    kept = [(s, by_turn[s.turn_id]) for s in samples
            if s.turn_id in by_turn and by_turn[s.turn_id].kept]
    report({"stage": "load"})
    # The picks rule: a round does not build on a checkpoint the person's blind picks put
    # behind its parent; it continues from that parent (reinf.training.leaderboard.choose_start).
    start, passed_over = choose_start(store)
    session = build_session(config, store if not passed_over else StartFrom(store, start))
    used: list = []
    episodes, skipped = select_episodes(session, kept, used)
    # The person's rewrites: ratings of 5 and picks for the rating model, demonstrations for
    # PPO (reinf.training.rewrites; a broken hook stops the round here too).
    rewrites = read_rewrites(store, session, limit=config.training.rating_model_max,
                             until=read_at)
    until_likely = config.training.rewrite_imitation_rule == "until-likely"
    before = None if until_likely else imitated_before(store, session.parent_id)
    demos = demonstrations(config, rewrites, now=now, imitated_before=before)
    shown = demos.episodes
    # the rewrites the imitation term reads, by identity in the batch (new since the adapter,
    # or every one while it is less likely than the model's own replies: until-likely), and
    # with training.imitate_rated the rated replies scored that high, by the same rule
    imitate_ids = {id(e) for e in demos.imitated}
    best_rated = best_rated_episodes(config.training.imitate_rated, episodes, used,
                                     imitated_before=before)
    # the model's own replies asked for in a style (imitate_explored here, imitate_styled
    # below) are imitated until likely in every round, whichever rule the rewrites follow:
    # imitated once, gives-example's held-out perplexity rose 15% (docs/benchmarks.md)
    # (rated at least EXPLORED_MARGIN above the person's mean rating: a 5 from someone who
    # rates everything 5 says nothing of the style; the usual is the one the lifts read)
    # one read of the person's ratings by style serves this margin and the styled rollouts
    by_style = (store.style_ratings()
                if config.training.imitate_explored or config.training.styled_rollouts else None)
    explored = best_rated_episodes(
        0, episodes, used, imitated_before=None, explored=config.training.imitate_explored,
        usual=usual_rating(by_style) if config.training.imitate_explored else None)
    until_ids = {id(e) for e in explored}
    best_ids = {id(e) for e in best_rated} | until_ids  # the rated replies imitated
    imitate_ids |= best_ids
    if not episodes:
        raise TrainingError(f"none of the {len(samples)} rated turns can be trained on "
                            f"({_describe(skipped, len(samples) - len(kept))})",
                            fix="rate replies the current model produced (`reinf chat`)")
    counters = session.counters
    # 2. The rating model, fitted on every rating; it decides the round's mode.
    plan = plan_round(config, store, rated, session, report, read_at=read_at,
                      rewrites=rewrites)
    hp = replace(Hyper.from_config(config.ppo),
                 imitation_coef=config.training.rewrite_imitation,
                 imitation_until_likely=until_likely)
    round_metrics: dict[str, Any] = {"mode": plan.mode, "mode_reason": plan.reason,
                                     **plan.metrics}
    if passed_over:
        round_metrics["passed_over"] = passed_over
        session.warnings.append(
            f"your blind picks put {passed_over[0]['checkpoint_id']} behind its parent "
            f"(lost {passed_over[0]['losses']} of {passed_over[0]['pairs']}): this round "
            f"continues from {start or 'the base model'}")
    # 3. and 4., once, or ``training.rollout_iterations`` times in rollout mode: fresh
    #    replies from the adapter as it stands, scored by this round's rating model and the
    #    person's reward mapper (the rated replies to the same prompts join them), then PPO.
    device = session.loaded.device
    iterations = config.training.rollout_iterations if plan.mode == "rollouts" else 1
    t = config.training
    # the person's ratings by style: training.styled_pick draws the styled rollouts' styles
    # by them, training.imitate_styled reads each style's lift (in a rated round too)
    rated_styles = (by_style if t.styled_rollouts and (
        t.imitate_styled or (plan.mode == "rollouts" and t.styled_pick == "ratings"))
        else None)
    # The base model's own passages: ppo.anchor_coef keeps them likely at every step, and
    # training.drift_budget bounds how far the round's adapter moved them (step 4b)
    own_text = (anchor_episodes(config, session, report=report)
                if hp.anchor_coef > 0 or t.drift_budget > 0 else None)
    anchor = build_rollout(own_text, device) if hp.anchor_coef > 0 else None
    passes: list[dict[str, Any]] = []
    for i in range(iterations):
        seed = config.ppo.seed + counters["round"] + ITERATION_SEED_STRIDE * i
        step = report if iterations == 1 else _numbered(report, i + 1, iterations)
        batch, groups, rollout_metrics = episodes + shown, None, {}
        imitated, until = imitate_ids, until_ids
        if plan.mode == "rollouts":
            # the rewrites' prompts are chosen as the ratings' are, newest first
            prompted = sorted(samples + rewrites.samples, key=lambda s: s.rated_at,
                              reverse=True)
            batch, groups, styled_ids, rollout_metrics = collect_rollouts(
                config, session, plan.rating_model, prompted, episodes + shown, now=now,
                seed=seed, report=step, rated=rated_styles, imitate_ids=imitate_ids)
            # training.imitate_styled: the styled rollouts the rating model liked best (this
            # pass's only: an id is an object's while it lives)
            imitated = imitate_ids | styled_ids
            until = until_ids | styled_ids
        else:
            # training.imitate_styled before the rating model is trusted: replies in the
            # style the person's ratings lift most, imitated (reinf.training.plan)
            styled, rollout_metrics = styled_demonstrations(
                config, session, samples, rated_styles, now=now, seed=seed, report=step)
            batch = batch + styled
            imitated = imitate_ids | {id(e) for e in styled}
            until = until_ids | {id(e) for e in styled}
            if hp.advantage == "rloo":
                # A rated round's baseline under RLOO: the other rated (or styled) replies
                # to the same prompt, else the mean of every other reply in the batch.
                groups = prompt_groups(batch)
        b = build_rollout(batch, device, groups=groups,
                          demos=[id(e) in imitated for e in batch] if imitated else None,
                          until=[id(e) in until for e in batch] if until else None)
        session.reward_stats.update(b.rewards)
        if config.ppo.normalize_rewards:
            b.rewards = (b.rewards - session.reward_stats.mean) / max(session.reward_stats.std,
                                                                      1e-6)
        step({"stage": "update", "done": 0, "total": hp.ppo_epochs
              * math.ceil(len(b) / hp.batch_size)})
        passes.append({**train_policy(session.policy, session.optimizer, b, session.kl_ctl, hp,
                                      seed=seed, progress=step if progress else None,
                                      anchor=anchor),
                       **rollout_metrics})
        # a NaN step, or a KL the gate will reject anyway: more passes cannot save the round
        if passes[-1]["nan"] or passes[-1]["kl"] > config.ppo.kl_max:
            break
    metrics = merge_passes(passes)
    # 4b. The drift budget: an adapter that moved the base's own text more than
    #     training.drift_budget is scaled towards the base until it is within.
    metrics.update(hold_to_budget(session.policy, build_rollout(own_text[:DRIFT_TEXTS], device),
                                  t.drift_budget, hp.batch_size, report=report)
                   if t.drift_budget > 0 and not metrics["nan"] else NO_BUDGET)
    episodes = batch
    counters = {"round": counters["round"] + 1,
                "global_step": counters["global_step"] + metrics["steps"],
                "samples_seen": counters["samples_seen"] + metrics["samples"]}
    metrics.update(counters, **round_metrics, advantage=hp.advantage,
                   reward_mean=sum(e[4] for e in episodes) / len(episodes),
                   human_reward_mean=sum(r.reward for _, r in kept) / max(len(kept), 1),
                   reward_stats_mean=session.reward_stats.mean,
                   reward_stats_std=session.reward_stats.std,
                   skipped=sum(skipped.values()), skipped_reasons=skipped,
                   dropped=len(samples) - len(kept), parent_id=session.parent_id,
                   rewrites=len(shown), rewrites_imitated=len(demos.imitated),
                   # in rollout mode only those rated replies to the rollouts' prompts
                   rated_imitated=sum(id(e) in best_ids for e in episodes),
                   explored_imitated=sum(id(e) in until_ids for e in episodes),
                   rewrites_skipped=rewrites.skipped,
                   device=str(device), warnings=session.warnings)
    # 5. The promotion gate: NaN, KL to the base, fluency on well-rated replies.
    report({"stage": "gate"})
    metrics.update(measure_fluency(session, samples, hp.batch_size))
    # What changed, at a glance: the new adapter against the base on the person's prompts.
    report({"stage": "vs_base"})
    metrics["vs_base"] = {
        "by_rating_model": measure_vs_base(config, session, plan.rating_model, rated,
                                           seed=config.ppo.seed + counters["round"]),
        "by_your_picks": picks_vs_base(store, session.parent_id)}
    reason = gate(metrics, config.ppo.kl_max, config.training.max_perplexity_increase)
    ckpt_id = checkpoints.create_checkpoint_id(counters["round"])
    metrics["seconds"] = time.perf_counter() - started
    if reason:
        metrics["rejected_reason"] = reason
        metrics["kl_coef_next"] = max(metrics["kl_coef_next"], 2 * metrics["kl_coef"]) \
            if reason.startswith("KL") else metrics["kl_coef_next"]
        clean = checkpoints.jsonable(metrics)
        store.add_checkpoint(ckpt_id, str(root / ckpt_id), parent_id=session.parent_id,
                             run_id=run_id, metrics=clean, status="rejected")
        store.finish_run(run_id, "rejected", metrics=clean, samples=metrics["samples"],
                         error=reason, checkpoint_id=ckpt_id)
        parent = session.parent_id or "the base model"
        return RoundResult(run_id, "rejected", metrics, ckpt_id,
                           f"round rejected: {reason}; {parent} stays active")
    # 6. The checkpoint, written atomically, then promoted. The value head goes with it only
    #    when this round trained it (GAE); an RLOO round neither read nor trained it.
    report({"stage": "checkpoint", "checkpoint_id": ckpt_id})
    value_head = session.policy.value_head if hp.advantage == "gae" else None
    state = {"version": STATE_VERSION,
             "optimizer": optimizer_state(session.policy, session.optimizer,
                                          value_head=value_head is not None),
             "kl_controller": session.kl_ctl.state_dict(),
             "reward_stats": session.reward_stats.state_dict(), **counters}
    lineage = {"checkpoint_id": ckpt_id, "parent_id": session.parent_id, "run_id": run_id,
               "base_model": session.loaded.name}
    path = checkpoints.write_checkpoint(
        root, ckpt_id, model=session.policy.model, value_head=value_head,
        state=state, metrics={**metrics, **lineage},
        rating_model=plan.rating_model.state_dict() if plan.rating_model else None,
        base_model_name=config.model.model_path)
    metrics["seconds"] = time.perf_counter() - started
    # What the checkpoint learned from: the rated turns of the PPO batch and the gate, and
    # every rating the rating model it carries was fitted on.
    trained_on = {s.turn_id for s in samples} | rewrites.turn_ids
    if plan.rating_model is not None:
        trained_on |= {s.turn_id for s in rated[:config.training.rating_model_max]}
        trained_on |= plan.pairs.turn_ids
    gone = plan.pairs.pair_ids - {p.id for p in store.list_pairs(limit=None)}
    if gone:  # a pick on a typed prompt holds no turn: the store cannot check it
        reason = reject_forgotten(config, store, run_id, ckpt_id, path, session.parent_id,
                                  metrics, metrics["samples"], len(gone))
        return RoundResult(run_id, "rejected", metrics, ckpt_id, f"round rejected: {reason}; "
                           f"{session.parent_id or 'the base model'} stays active")
    record = promote(config, store, run_id, ckpt_id, path, parent_id=session.parent_id,
                     metrics=metrics, samples=metrics["samples"], turn_ids=trained_on,
                     read_at=read_at)
    if record is not None and record.status == "rejected":
        parent = session.parent_id or "the base model"
        reason = record.metrics.get("rejected_reason", "turns forgotten while it ran")
        metrics["rejected_reason"] = reason
        return RoundResult(run_id, "rejected", metrics, ckpt_id,
                           f"round rejected: {reason}; {parent} stays active")
    return RoundResult(run_id, "succeeded", metrics, ckpt_id,
                       f"round {counters['round']} ({plan.mode}): checkpoint {ckpt_id} is "
                       f"active ({metrics['samples']} samples, "
                       f"reward_mean {metrics['reward_mean']:.3f}, "
                       f"kl {metrics['kl']:.4f}/token, {metrics['seconds']:.1f} s)")


# Iteration i of a round samples and shuffles with the round's seed + i x this stride, so
# iteration 0 is the one-pass round exactly and no later round's seed is reused soon.
ITERATION_SEED_STRIDE = 7919
# Figures an iterated round adds up over its passes; every other figure is the last pass's
# (where the round left the policy: its KL, KL coefficient, clip fraction, ...).
PASS_SUMS = ("steps", "samples", "tokens", "update_seconds", "rollouts", "rollout_tokens",
             "rollout_seconds", "scoring_seconds", "styled_imitated")
# Per pass in ``metrics["iterations"]`` when a round ran more than one.
PASS_FIGURES = ("samples", "predicted_score_mean", "reward_mean", "kl", "approx_kl", "clipfrac",
                "staleness", "kl_coef", "epochs_run", "update_seconds", "rollout_seconds")


def merge_passes(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """One round's metrics from its PPO passes: the last pass's, with the counts and times
    of ``PASS_SUMS`` added up, ``nan`` and ``early_stopped`` if any pass had them, and, for
    more than one pass, each pass's ``PASS_FIGURES`` under ``iterations``."""
    merged = dict(passes[-1])
    for key in PASS_SUMS:
        if all(key in p for p in passes):
            merged[key] = sum(p[key] for p in passes)
    merged["nan"] = any(p["nan"] for p in passes)
    merged["nan_reason"] = next((p.get("nan_reason") for p in passes if p.get("nan_reason")),
                                None)
    merged["early_stopped"] = any(p["early_stopped"] for p in passes)
    if len(passes) > 1:
        merged["iterations"] = [{k: p[k] for k in PASS_FIGURES if k in p} for p in passes]
    return merged


def _numbered(report: Callable, i: int, n: int) -> Callable:
    """``report`` with each event marked as pass ``i`` of ``n`` (the progress bars say so)."""
    return lambda event: report({**event, "iteration": i, "iterations": n})


def prompt_groups(episodes) -> list[int]:
    """One group id per episode, shared by the episodes with the same prompt."""
    ids: dict[tuple, int] = {}
    return [ids.setdefault(tuple(e[0]), len(ids)) for e in episodes]


def optimizer_state(policy, optimizer, *, value_head: bool) -> dict[str, Any]:
    """The optimizer's state for the checkpoint; without the value head's moments when the
    checkpoint carries no value head (the next round that needs one starts it fresh)."""
    state = optimizer.state_dict()
    if not value_head:
        head = {id(p) for p in policy.value_head.parameters()}
        drop = {i for i, p in enumerate(policy.parameters()) if id(p) in head}
        state["state"] = {i: s for i, s in state["state"].items() if i not in drop}
    return state


class StartFrom:
    """The store as ``build_session`` reads it, with ``active_checkpoint()`` naming the
    checkpoint the round continues from (the picks rule, reinf.training.leaderboard.choose_start)
    instead of the active one; everything else is the store's."""

    def __init__(self, store, checkpoint_id: str | None):
        self._store, self._start = store, checkpoint_id

    def active_checkpoint(self):
        return self._store.get_checkpoint(self._start) if self._start else None

    def __getattr__(self, name: str):
        return getattr(self._store, name)


# --- logging --------------------------------------------------------------------------

def _describe(skipped: dict[str, int], dropped: int) -> str:
    parts = [f"{n} {reason.replace('_', ' ')}" for reason, n in skipped.items()]
    if dropped:
        parts.append(f"{dropped} dropped by the reward critics")
    return ", ".join(parts) or "none rated"


def _one_line(exc: BaseException) -> str:
    text = exc.message if isinstance(exc, ReinfError) else f"{type(exc).__name__}: {exc}"
    return " ".join(str(text).split())[:500] or type(exc).__name__


def _log_path(config) -> Path:
    return config.data_dir / "logs" / "trainer.log"


def _log_failure(config, run_id: int, exc: BaseException) -> None:
    """The traceback goes to the trainer log file only, never to the person's terminal."""
    try:
        path = _log_path(config)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"{datetime.now(timezone.utc).isoformat(timespec='seconds')} run {run_id} "
                     f"failed: {_one_line(exc)}\n")
            fh.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    except OSError:
        pass
