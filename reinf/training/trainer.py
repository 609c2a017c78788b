"""One training round: ratings -> rating model -> fresh rollouts -> PPO -> checkpoint.

``train_round(config, store, ...)`` is the unit the scheduler, the CLI and the benchmark
call. It runs RLHF's two stages incrementally (docs/training.md):

1. it refuses when no rating or pick arrived since the last finished round ("nothing new
   to train on"), unless ``force``; it records a ``training_runs`` row, reads the newest
   ``replay_buffer_size`` rated turns and maps them to rewards and weights
   (``reinf.rewards.mapper``; a broken hook fails the run);
2. loads the base model on the training device and continues from the ACTIVE checkpoint
   (``reinf.training.session``), or from its parent when the person's blind picks put it
   behind that (the picks rule, ``reinf.training.leaderboard.choose_start``); fits the **rating
   model** on every rating that is not forgotten, and the person's picks
   (``reinf.training.rating_model``, ``reinf.training.pairs``); its cross-validated
   Spearman decides the mode: ``rollouts`` once it is trustworthy, else ``rated`` (the cold
   start, and ``training.method: rated``): PPO on the rated replies alone, as the first
   version did;
3. in rollout mode, samples fresh replies from the current adapter for a few prompts
   (``reinf.training.rollouts``), scores them with the rating model and the person's
   reward mapper, and keeps the person's rated replies to the same prompts, with their
   real score, in the batch;
4. runs PPO (``reinf.training.ppo``): leave-one-out baseline over the replies to one prompt
   (``ppo.advantage: rloo``) or the value head with GAE;
5. the promotion gate: a round with NaN, whose KL per reply token to the base exceeds
   ``kl_max``, or whose perplexity on the person's well-rated replies rose more than
   ``training.max_perplexity_increase`` over the base, is ``rejected``: its row is
   recorded, no files are kept, and it is never activated; after a KL rejection the next
   round from the same parent starts with at least twice the rejected round's kl_coef;
   before it, the new adapter and the base answer the person's newest prompts and the
   rating model judges them (``vs_base``: what changed, at a glance, with the person's
   own picks against the base);
6. writes the checkpoint atomically (adapter, rating model, state, and the value head when
   the round trained it: GAE), records and activates it, applies retention, and finishes
   the run with its metrics. If a turn it trained on (or the context of one) was forgotten
   while it ran, that same transaction refuses: the run is ``rejected`` naming how many,
   and the files are removed.

Any failure finishes the run as ``failed`` with a one-line reason and raises a ReinfError
for the person; the traceback goes to ``<data_dir>/logs/trainer.log`` only.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from reinf.errors import HookError, ReinfError, TrainingError
from reinf.training import checkpoints
from reinf.training.outcome import NothingToTrain, RoundOutcome
from reinf.training.pairs import PairRows, pairs_waiting

log = logging.getLogger("reinf.training.trainer")
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
        raise NothingToTrain("nothing new to train on: no ratings or picks since the last "
                             "round", fix="rate some replies first (`reinf rate last 5`), or "
                                          "pass --force to train on the stored ratings again")
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
    episodes, skipped = select_episodes(session, kept)
    if not episodes:
        raise TrainingError(f"none of the {len(samples)} rated turns can be trained on "
                            f"({_describe(skipped, len(samples) - len(kept))})",
                            fix="rate replies the current model produced (`reinf chat`)")
    counters = session.counters
    # 2. The rating model, fitted on every rating; it decides the round's mode.
    plan = plan_round(config, store, rated, session, report, read_at=read_at)
    hp = Hyper.from_config(config.ppo)
    groups = None
    round_metrics: dict[str, Any] = {"mode": plan.mode, "mode_reason": plan.reason,
                                     **plan.metrics}
    if passed_over:
        round_metrics["passed_over"] = passed_over
        session.warnings.append(
            f"your blind picks put {passed_over[0]['checkpoint_id']} behind its parent "
            f"(lost {passed_over[0]['losses']} of {passed_over[0]['pairs']}): this round "
            f"continues from {start or 'the base model'}")
    if plan.mode == "rollouts":
        # 3. Fresh replies from the current adapter, scored by the rating model and the
        #    person's reward mapper; the rated replies to the same prompts join them.
        episodes, groups, rollout_metrics = collect_rollouts(
            config, session, plan.rating_model, samples, episodes, now=now,
            seed=config.ppo.seed + counters["round"], report=report)
        round_metrics.update(rollout_metrics)
    else:
        hp = dataclasses.replace(hp, advantage="gae")  # the value head, as the first version
    device = session.loaded.device
    b = build_rollout(episodes, device, groups=groups)
    session.reward_stats.update(b.rewards)
    if config.ppo.normalize_rewards:
        b.rewards = (b.rewards - session.reward_stats.mean) / max(session.reward_stats.std, 1e-6)
    # 4. PPO.
    report({"stage": "update", "done": 0, "total": hp.ppo_epochs
            * math.ceil(len(b) / hp.batch_size)})
    metrics = train_policy(session.policy, session.optimizer, b, session.kl_ctl, hp,
                           seed=config.ppo.seed + counters["round"], progress=progress)
    counters = {"round": counters["round"] + 1,
                "global_step": counters["global_step"] + metrics["steps"],
                "samples_seen": counters["samples_seen"] + len(b)}
    metrics.update(counters, **round_metrics, advantage=hp.advantage,
                   reward_mean=sum(e[4] for e in episodes) / len(episodes),
                   human_reward_mean=sum(r.reward for _, r in kept) / max(len(kept), 1),
                   reward_stats_mean=session.reward_stats.mean,
                   reward_stats_std=session.reward_stats.std,
                   skipped=sum(skipped.values()), skipped_reasons=skipped,
                   dropped=len(samples) - len(kept), parent_id=session.parent_id,
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
        store.finish_run(run_id, "rejected", metrics=clean, samples=len(b), error=reason,
                         checkpoint_id=ckpt_id)
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
    trained_on = {s.turn_id for s in samples}
    if plan.rating_model is not None:
        trained_on |= {s.turn_id for s in rated[:config.training.rating_model_max]}
        trained_on |= plan.pairs.turn_ids
    gone = plan.pairs.pair_ids - {p.id for p in store.list_pairs(limit=None)}
    if gone:  # a pick on a typed prompt holds no turn: the store cannot check it
        return reject_forgotten(config, store, run_id, ckpt_id, path, session.parent_id,
                                metrics, len(b), len(gone))
    record = promote(config, store, run_id, ckpt_id, path, parent_id=session.parent_id,
                     metrics=metrics, samples=len(b), turn_ids=trained_on, read_at=read_at)
    if record is not None and record.status == "rejected":
        parent = session.parent_id or "the base model"
        reason = record.metrics.get("rejected_reason", "turns forgotten while it ran")
        metrics["rejected_reason"] = reason
        return RoundResult(run_id, "rejected", metrics, ckpt_id,
                           f"round rejected: {reason}; {parent} stays active")
    return RoundResult(run_id, "succeeded", metrics, ckpt_id,
                       f"round {counters['round']} ({plan.mode}): checkpoint {ckpt_id} is "
                       f"active ({len(b)} samples, reward_mean {metrics['reward_mean']:.3f}, "
                       f"kl {metrics['kl']:.4f}/token, {metrics['seconds']:.1f} s)")


def optimizer_state(policy, optimizer, *, value_head: bool) -> dict[str, Any]:
    """The optimizer's state for the checkpoint; without the value head's moments when the
    checkpoint carries no value head (the next round that needs one starts it fresh)."""
    state = optimizer.state_dict()
    if not value_head:
        head = {id(p) for p in policy.value_head.parameters()}
        drop = {i for i, p in enumerate(policy.parameters()) if id(p) in head}
        state["state"] = {i: s for i, s in state["state"].items() if i not in drop}
    return state


# --- stage 1: the rating model ----------------------------------------------------------

@dataclass
class RoundPlan:
    mode: str                       # "rollouts" | "rated"
    reason: str                     # why, in words, for `reinf status`
    rating_model: Any               # RatingModel | None
    metrics: dict[str, Any]
    pairs: PairRows = field(default_factory=PairRows)  # the picks the rating model read


def plan_round(config, store, rated, session, report, *, read_at=None) -> RoundPlan:
    """Fit the rating model on the ``rated`` samples (every rating that is not forgotten,
    newest first) and the person's picks (reinf.training.pairs), and decide the mode: fresh
    rollouts once it is trustworthy, else the rated replies alone (the cold start)."""
    from reinf.training.pairs import collect_pairs
    from reinf.training.rating_model import (PairSet, cross_validated_pair_accuracy,
                                             fit_rating_model, reply_features, spearman_ceiling)
    from reinf.training.session import unreadable

    t = config.training
    if t.method == "rated":
        return RoundPlan("rated", "training.method is rated", None, {})
    report({"stage": "rating_model"})
    started = time.perf_counter()
    rated = [s for s in rated[:t.rating_model_max] if usable(session, s)]
    metrics: dict[str, Any] = {"rating_model_ratings": len(rated)}
    if len(rated) < t.min_ratings:
        return RoundPlan("rated", f"cold start: {len(rated)} of the {t.min_ratings} ratings the "
                         "rating model needs (training.min_ratings)", None, metrics)
    # The person's picks join the ratings: their sides are rated rows, or rows of their own.
    picked = collect_pairs(store, rated, limit=t.rating_model_max, until=read_at,
                           unreadable=lambda p, r: unreadable(session, p, r)) \
        if t.pair_weight > 0 else PairRows()
    features = reply_features(session.policy.model,
                              [(s.prompt_ids, s.reply_ids) for s in rated] + picked.sides,
                              batch_size=config.ppo.batch_size * 2)
    scores = [s.score for s in rated]
    seed = config.ppo.seed + session.counters["round"]
    pairs = PairSet.of(picked.rows) if picked.rows else None
    model = fit_rating_model(features, scores, heads=t.rating_heads, seed=seed, pairs=pairs,
                             pair_weight=t.pair_weight)
    accuracy, alone, held = cross_validated_pair_accuracy(
        features, scores, pairs, pair_weight=t.pair_weight, seed=seed) if pairs else \
        (None, None, 0)
    metrics.update(rating_model_consistency=model.consistency,
                   rating_model_consistency_ceiling=spearman_ceiling(scores),
                   rating_model_strength=model.strength,
                   rating_model_pairs=len(picked.rows),
                   rating_model_pair_accuracy=accuracy,
                   rating_model_pair_accuracy_ratings_only=alone,
                   rating_model_pairs_held_out=held,
                   rating_model_pair_scale=model.pair_scale,
                   rating_model_seconds=time.perf_counter() - started)
    if picked.skipped:
        metrics["rating_model_pairs_skipped"] = picked.skipped
    if model.consistency is None:
        return RoundPlan("rated", "cold start: the ratings so far are all the same, so the "
                         "rating model cannot be checked", model, metrics, picked)
    if model.consistency < t.min_consistency:
        return RoundPlan("rated", f"cold start: the rating model's cross-validated Spearman "
                         f"{model.consistency:.2f} is below training.min_consistency "
                         f"{t.min_consistency}", model, metrics, picked)
    return RoundPlan("rollouts", f"the rating model predicts held-out ratings with Spearman "
                     f"{model.consistency:.2f} (>= {t.min_consistency}, {len(rated)} ratings"
                     + (f", {len(picked.rows)} picks" if picked.rows else "") + ")",
                     model, metrics, picked)


def usable(session, sample) -> bool:
    """A rated turn the models can read (a reply, and nothing ``unreadable`` about it)."""
    from reinf.training.session import unreadable

    return bool(sample.reply_ids) and unreadable(session, sample.prompt_ids,
                                                 sample.reply_ids) is None


# --- stage 2 and 3: rollouts and their rewards --------------------------------------------

def collect_rollouts(config, session, rating_model, samples, episodes, *, now, seed: int,
                     report) -> tuple[list[tuple], list[int], dict[str, Any]]:
    """The round's episodes in rollout mode, with their group ids (one group per prompt).

    Fresh replies are sampled from the current adapter for ``rollout_prompts`` prompts,
    ``rollouts_per_prompt`` each, scored pessimistically by the rating model, and passed
    through the person's reward mapper and critics with their own metadata. The person's
    rated replies to the same prompts stay in the batch with their real score.
    """
    from reinf.records import Sample
    from reinf.rewards.mapper import compute_rewards
    from reinf.training.rating_model import reply_features
    from reinf.training.rollouts import choose_prompts, sample_rollouts

    t, g = config.training, config.generation
    started = time.perf_counter()
    fits = [s for s in samples if usable(session, s)]
    max_new = t.rollout_max_new_tokens or g.max_new_tokens
    fits = [s for s in fits if len(s.prompt_ids) + max_new <= session.context_limit] or fits
    prompts = choose_prompts(fits, t.rollout_prompts, newest=math.ceil(t.rollout_prompts / 2),
                             seed=seed)
    text_of = {tuple(s.prompt_ids): s.prompt for s in fits}
    total = len(prompts) * t.rollouts_per_prompt
    report({"stage": "rollouts", "done": 0, "total": total})
    rollouts = sample_rollouts(
        session.policy.model, session.loaded.tokenizer, prompts, t.rollouts_per_prompt,
        temperature=g.temperature, top_p=g.top_p, max_new_tokens=max_new, seed=seed,
        batch_size=t.rollout_batch_size,
        progress=lambda done, n: report({"stage": "rollouts", "done": done, "total": n}))
    sampled = time.perf_counter()
    features = reply_features(session.policy.model, [(r.prompt_ids, r.reply_ids) for r in rollouts],
                              batch_size=config.ppo.batch_size * 2)
    predicted = rating_model.score(features, t.pessimism).tolist()
    fresh = [Sample(turn_id=0, conversation_id=0, turn_index=0, user_id="local",
                    prompt=text_of.get(tuple(r.prompt_ids), ""), response=r.text,
                    prompt_ids=r.prompt_ids, reply_ids=r.reply_ids, logprobs=r.logprobs,
                    checkpoint_id=session.parent_id, score=score, tags=[], comment="",
                    critical=False, rated_at=now, created_at=now, temperature=g.temperature,
                    predicted=True)
             for r, score in zip(rollouts, predicted)]
    rows = compute_rewards(config, fresh, now=now,
                           labels=[f"a fresh reply to prompt {r.group + 1} (predicted score "
                                   f"{s:.2f})" for r, s in zip(rollouts, predicted)])
    group_of = {tuple(p): i for i, p in enumerate(prompts)}
    out, groups = [], []
    for r, row in zip(rollouts, rows):
        if row.kept:
            out.append((r.prompt_ids, r.reply_ids, r.logprobs, g.temperature, row.reward, 1.0))
            groups.append(r.group)
    human = [e for e in episodes if tuple(e[0]) in group_of]
    for e in human:  # a human label beats a prediction: the real score, in its prompt's group
        out.append(e)
        groups.append(group_of[tuple(e[0])])
    return out, groups, {
        "rollouts": len(rollouts), "rollout_prompts": len(prompts), "rated_in_batch": len(human),
        "rollout_tokens": sum(len(r.reply_ids) for r in rollouts),
        "predicted_score_mean": sum(predicted) / max(len(predicted), 1),
        "rollout_seconds": sampled - started, "scoring_seconds": time.perf_counter() - sampled}


# --- stage 5: the gate ----------------------------------------------------------------------

def measure_fluency(session, samples, batch_size: int, limit: int = 32) -> dict[str, Any]:
    """Perplexity of the policy and of the base on the person's well-rated replies (4-5),
    the fluency figure of the promotion gate: a preference should make those replies more
    likely, never less. Empty when no reply was rated 4 or 5."""
    from reinf.training.ppo import build_rollout, evaluate, update_mode

    good = [s for s in samples if s.score >= 4 and usable(session, s)][:limit]
    if not good:
        return {}
    b = build_rollout([(s.prompt_ids, s.reply_ids, [0.0] * len(s.reply_ids), 1.0, 0.0, 1.0)
                       for s in good], session.loaded.device)
    with update_mode(session.policy.model):
        new, _ = evaluate(session.policy, b, batch_size, values=False)
        base, _ = evaluate(session.policy, b, batch_size, adapter=False, values=False)
    tokens = float(b.mask.sum())
    ppl_new = math.exp(-float((new * b.mask).sum()) / tokens)
    ppl_base = math.exp(-float((base * b.mask).sum()) / tokens)
    return {"fluency_perplexity": ppl_new, "fluency_perplexity_base": ppl_base,
            "fluency_change": ppl_new / ppl_base - 1, "fluency_replies": len(good)}


def measure_vs_base(config, session, rating_model, rated, *, seed: int) -> dict[str, Any] | None:
    """The new adapter against the bare base on the person's own prompts, judged by the
    round's rating model: one reply each to the newest ``training.winrate_prompts`` distinct
    rated prompts, from the policy with and without its adapter, one sampling seed for both
    (so they differ by the adapter, as in compare); the mean of the heads scores each.
    None without a rating model or prompts (a cold start on a few ratings)."""
    from reinf.training.leaderboard import Record
    from reinf.training.rating_model import reply_features
    from reinf.training.rollouts import choose_prompts, sample_rollouts

    t, g = config.training, config.generation
    if rating_model is None or t.winrate_prompts == 0:
        return None
    started = time.perf_counter()
    max_new = t.rollout_max_new_tokens or g.max_new_tokens
    fits = [s for s in rated if usable(session, s)
            and len(s.prompt_ids) + max_new <= session.context_limit]
    prompts = choose_prompts(fits, t.winrate_prompts, newest=t.winrate_prompts, seed=seed)
    if not prompts:
        return None
    model = session.policy.model
    kwargs = dict(temperature=g.temperature, top_p=g.top_p, max_new_tokens=max_new, seed=seed,
                  batch_size=t.rollout_batch_size)
    new = sample_rollouts(model, session.loaded.tokenizer, prompts, 1, **kwargs)
    with model.disable_adapter():
        base = sample_rollouts(model, session.loaded.tokenizer, prompts, 1, **kwargs)
    features = reply_features(model, [(r.prompt_ids, r.reply_ids) for r in new + base],
                              batch_size=config.ppo.batch_size * 2)
    scores = rating_model.predict(features)[0].tolist()
    record = Record()
    for mine, theirs in zip(scores[:len(new)], scores[len(new):]):
        record.add(1.0 if mine > theirs else 0.0 if mine < theirs else 0.5)
    return {**record.to_dict(), "prompts": len(prompts),
            "score_mean": sum(scores[:len(new)]) / len(new),
            "base_score_mean": sum(scores[len(new):]) / len(new),
            "seconds": time.perf_counter() - started}


def reject_forgotten(config, store, run_id: int, ckpt_id: str, path: Path,
                     parent_id: str | None, metrics: dict[str, Any], samples: int,
                     gone: int) -> RoundResult:
    """A round whose rating model read picks that were forgotten while it ran: its files go,
    its checkpoint is recorded rejected and the run finishes rejected, as the store does for
    forgotten turns (Store.promote)."""
    reason = (f"{gone} of the picks this round learnt from {'was' if gone == 1 else 'were'} "
              "forgotten while it ran; nothing was promoted")
    checkpoints.remove_files(checkpoints.root_dir(config), Path(path))
    metrics["rejected_reason"] = reason
    clean = checkpoints.jsonable(metrics)
    store.add_checkpoint(ckpt_id, str(path), parent_id=parent_id, run_id=run_id,
                         metrics=clean, status="rejected")
    store.finish_run(run_id, "rejected", metrics=clean, samples=samples, error=reason,
                     checkpoint_id=ckpt_id)
    return RoundResult(run_id, "rejected", metrics, ckpt_id,
                       f"round rejected: {reason}; {parent_id or 'the base model'} stays active")


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


def promote(config, store, run_id: int, ckpt_id: str, path: Path, *, parent_id: str | None,
            metrics: dict[str, Any], samples: int, turn_ids=(), read_at=None):
    """Record a written checkpoint, make it active and finish the run as succeeded, in one
    store transaction (a kill part-way never leaves an active checkpoint beside an
    unfinished run); then apply retention (the trainer's rounds and the benchmark's
    baselines end the same way). Returns the checkpoint's record.

    ``turn_ids``: the rated turns it was trained on. When one of them was forgotten while the
    round ran, the store refuses the promotion in that same transaction (the run is
    rejected, naming how many) and the checkpoint's files are removed: they hold what it
    learned from the forgotten text."""
    record = store.promote(run_id, ckpt_id, str(path), parent_id=parent_id,
                           metrics=checkpoints.jsonable(metrics), samples=samples,
                           turn_ids=sorted(turn_ids), read_at=read_at)
    if record is not None and record.status == "rejected":
        checkpoints.remove_files(checkpoints.root_dir(config), Path(path))
        log.warning("run %s: %s", run_id, record.metrics.get("rejected_reason"))
        return record
    try:
        deleted = checkpoints.apply_retention(store, checkpoints.root_dir(config),
                                              config.ppo.keep_best)
    except OSError as exc:  # the round itself succeeded; old files can go next time
        deleted = []
        metrics.setdefault("warnings", []).append(
            f"retention could not remove old checkpoints: {exc}")
        store.finish_run(run_id, "succeeded", metrics=checkpoints.jsonable(metrics),
                         samples=samples, checkpoint_id=ckpt_id)
    log.info("run %s: checkpoint %s active; retention removed %s", run_id, ckpt_id,
             deleted or "nothing")
    return record


def gate(metrics: dict[str, Any], kl_max: float, max_perplexity_increase: float = math.inf
         ) -> str | None:
    """Why a round must not be promoted, or None."""
    # the value loss only where the value head was trained (GAE; RLOO reports nan)
    keys = ("reward_mean", "kl", "policy_loss") + (
        ("value_loss",) if metrics.get("advantage", "gae") == "gae" else ())
    numbers = [metrics[k] for k in keys]
    if metrics.get("nan") or not all(math.isfinite(x) for x in numbers):
        return "NaN in the round (loss, reward or weights)"
    if metrics["kl"] > kl_max:
        return f"KL to the base {metrics['kl']:.4f} per token exceeds kl_max {kl_max}"
    change = metrics.get("fluency_change")
    if change is not None and change > max_perplexity_increase:
        return (f"perplexity on well-rated replies rose {change:+.1%} over the base, more than "
                f"training.max_perplexity_increase {max_perplexity_increase:.0%}")
    return None


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


# --- the CLI and the child process share this ---------------------------------------------

def run_once(config, store, *, trigger: str = "manual", force: bool = False,
             progress: Callable | None = None) -> tuple[int, dict, ReinfError | None]:
    """One round -> (exit code, JSON payload, the error for the person or None)."""
    try:
        result = train_round(config, store, trigger=trigger, progress=progress, force=force)
    except ReinfError as exc:
        outcome = RoundOutcome.of_exception(exc)
        run_id = getattr(exc, "run_id", None)
        return outcome.exit_code, outcome.payload(str(exc), run_id=run_id), exc
    return RoundOutcome.of(result.status).exit_code, {**result.to_dict(), "error": None}, None


def apply_process_settings(config, *, nice: bool = False) -> None:
    """schedule.train_threads (and train_nice, for the child process); and no loading
    bars from transformers (read when it is first imported): the round has its own."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if nice and config.schedule.train_nice and hasattr(os, "setpriority"):
        # Absolute, not relative: a child the daemon already niced before exec stays at
        # train_nice instead of getting it twice. Before torch starts its thread pool:
        # Linux niceness is per thread, and new threads inherit it.
        try:
            current = os.getpriority(os.PRIO_PROCESS, 0)
            os.setpriority(os.PRIO_PROCESS, 0, max(config.schedule.train_nice, current))
        except OSError:
            pass
    if config.schedule.train_threads > 0:
        import torch
        torch.set_num_threads(config.schedule.train_threads)


class ProgressBar:
    """Progress on stderr: a line per stage, a tqdm bar over the rollouts, and one over
    epochs x minibatches with live KL and loss."""
    STAGES = {"rewards": "reading rated turns and computing rewards…",
              "load": "loading the model…",
              "rating_model": "fitting the rating model on your ratings…",
              "rollouts": "sampling fresh replies for the rating model to score…",
              "gate": "checking KL and fluency…",
              "vs_base": "comparing the new adapter with the base on your prompts…"}
    BARS = {"rollouts": ("rollouts", "reply"), "update": ("PPO", "minibatch")}

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.bars: dict[str, Any] = {}
        self.said: set[str] = set()

    def __call__(self, event: dict) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        stage = event["stage"]
        if stage in self.STAGES and stage not in self.said:
            self.said.add(stage)
            print(self.STAGES[stage], file=sys.stderr, flush=True)
        if stage not in self.BARS:
            return
        bar = self.bars.get(stage)
        if bar is None:
            desc, unit = self.BARS[stage]
            bar = self.bars[stage] = tqdm(total=event["total"], desc=desc, unit=unit,
                                          file=sys.stderr, dynamic_ncols=True)
        if event.get("done"):
            bar.update(event["done"] - bar.n)
            if stage == "update":
                bar.set_postfix_str(f"epoch {event['epoch']}/{event['epochs']} "
                                    f"kl {event['kl']:.4f} approx_kl {event['approx_kl']:.4f} "
                                    f"loss {event['loss']:+.4f}")

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m reinf.training.trainer``: one round in a child process; the JSON result is the
    last line of stdout with --json. Exit codes: see RoundOutcome (reinf.training.outcome)."""
    import argparse
    import json

    from reinf.config import load_config
    from reinf.storage.store import Store

    parser = argparse.ArgumentParser(prog="python -m reinf.training.trainer",
                                     description="Run one Reinf training round.")
    parser.add_argument("--json", action="store_true", help="print the result as JSON (last line)")
    parser.add_argument("--trigger", default="manual", help="recorded on the run (e.g. schedule)")
    parser.add_argument("--force", action="store_true", help="train even with no new ratings")
    parser.add_argument("--config", help="config file (default: $REINF_HOME/config.yaml)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    store = None
    try:
        config = load_config(args.config)
        store = Store.open(config)
        apply_process_settings(config, nice=True)
        bar = ProgressBar(enabled=not args.no_progress)
        try:
            code, payload, err = run_once(config, store, trigger=args.trigger, force=args.force,
                                          progress=bar)
        finally:
            bar.close()
    except ReinfError as exc:  # config or database trouble, before any run row exists
        failed = RoundOutcome.FAILED
        code, payload, err = failed.exit_code, failed.payload(str(exc)), exc
    finally:
        if store is not None:
            store.close()
    if err is not None:
        print(f"Error: {err}", file=sys.stderr)
    else:
        print(payload["message"], file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(payload, ensure_ascii=False), flush=True)
    return code


if __name__ == "__main__":
    exit_code = main()
    # Everything is written and closed (store, checkpoint, result line); skip the
    # interpreter's teardown of torch and transformers (about 1 s of every round on two
    # busy cores).
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(exit_code)
