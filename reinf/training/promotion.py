"""Stages 5 and 6 of a round: the promotion gate, and promotion.

A trained adapter is measured before anything is kept (``reinf.training.trainer`` calls
these in order; docs/training.md):

- ``measure_fluency``: perplexity of the policy and of the base on the person's well-rated
  replies;
- ``measure_vs_base``: the new adapter and the base answer the person's newest prompts and
  the round's rating model judges them (``vs_base``: what changed, at a glance; not a gate);
- ``gate``: why a round must not be promoted (NaN, KL per reply token over ``kl_max``,
  fluency worse than ``training.max_perplexity_increase``), or None;
- ``promote``: record, activate and finish the run in one store transaction, then
  retention; the store refuses it when a turn the round trained on was forgotten while it
  ran. The benchmark's baselines (``reinf.bench.baselines``) end their rounds through it too;
- ``reject_forgotten``: the same refusal for forgotten picks, which the store cannot check.

torch loads inside the functions only.
"""
from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

from reinf.training import checkpoints
from reinf.training.plan import usable

log = logging.getLogger("reinf.training.promotion")


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


def gate(metrics: dict[str, Any], kl_max: float, max_perplexity_increase: float = math.inf
         ) -> str | None:
    """Why a round must not be promoted, or None."""
    # the value loss only where the value head was trained (GAE; RLOO reports nan)
    keys = ("reward_mean", "kl", "policy_loss") + (
        ("value_loss",) if metrics.get("advantage", "gae") == "gae" else ())
    numbers = [metrics[k] for k in keys]
    if metrics.get("nan") or not all(math.isfinite(x) for x in numbers):
        why = metrics.get("nan_reason")
        return "NaN in the round (" + (why or "loss, reward or weights") + ")"
    if metrics["kl"] > kl_max:
        return f"KL to the base {metrics['kl']:.4f} per token exceeds kl_max {kl_max}"
    change = metrics.get("fluency_change")
    if change is not None and change > max_perplexity_increase:
        return (f"perplexity on well-rated replies rose {change:+.1%} over the base, more than "
                f"training.max_perplexity_increase {max_perplexity_increase:.0%}")
    return None


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


def reject_forgotten(config, store, run_id: int, ckpt_id: str, path: Path,
                     parent_id: str | None, metrics: dict[str, Any], samples: int,
                     gone: int) -> str:
    """A round whose rating model read picks that were forgotten while it ran: its files go,
    its checkpoint is recorded rejected and the run finishes rejected, as the store does for
    forgotten turns (Store.promote). Returns the reason, for the round's result."""
    reason = (f"{gone} of the picks this round learnt from {'was' if gone == 1 else 'were'} "
              "forgotten while it ran; nothing was promoted")
    checkpoints.remove_files(checkpoints.root_dir(config), Path(path))
    metrics["rejected_reason"] = reason
    clean = checkpoints.jsonable(metrics)
    store.add_checkpoint(ckpt_id, str(path), parent_id=parent_id, run_id=run_id,
                         metrics=clean, status="rejected")
    store.finish_run(run_id, "rejected", metrics=clean, samples=samples, error=reason,
                     checkpoint_id=ckpt_id)
    return reason
