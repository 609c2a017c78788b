"""``reinf bench round``: which way one training round moves the model, in minutes.

A learning run (``reinf bench learn``) answers "did 48 ratings teach it?" after hours on a
CPU, and its probe moves by about ±0.2 between seeds on its own, so a change to the method
(the trust gate, the cold start, rollouts per prompt, the learning rate) needs many such
runs to show. This measures one round instead, with the trainer's own code and far less
noise, by asking how the round changed the probabilities of replies it never saw:

1. **Held-out replies**, sampled once from the model as it is (no adapter): ``replies``
   replies to each of ``prompts`` training-side prompts (the rollouts' sampler and
   settings), scored by each rater. The probe prompts are never used.
2. For each rater and each **arm** (a name and config overrides: ``rated`` trains on the
   rated replies alone, ``rollouts`` on fresh rollouts whatever the rating model's
   consistency, ``rated-v1`` is the first version's method; ``sft``, ``kto`` and ``kto@LR``
   are the baselines of ``reinf bench learn``, ``reinf.bench.baselines``): a data directory
   of its own, the same ``ratings`` other training-side prompts answered by the model
   (``ChatService.send_many``, seeded, so every arm rates the same replies) and rated by the
   rater, then one real round (``train_round`` or the baseline's, forced, in this process).
3. The held-out replies scored with that round's adapter and without it. Per reply, the
   round's log-ratio ``Δ = log π_new(reply) − log π_base(reply)`` (at the sampling
   temperature), and from it:

   - **pairwise**: of the pairs of replies to one prompt that the rater scores differently,
     the share whose better reply the round made more likely relative to the worse one
     (0.50: the round moved nothing the rater cares about);
   - **estimated change**: the mean rating the new policy would get on those prompts minus
     the base's, by self-normalised importance weighting of the base's own samples
     (weights ``e^Δ`` within a prompt). It is an estimate, good while the round stays close
     to the base; **ESS** (effective sample size over replies per prompt, 1.0 = all alike)
     says how close.

4. With ``resample`` (``--resample``), the held-out prompts answered afresh by the round's
   adapter, with the same sampler, settings and seed, and rated: **resampled change**, the
   mean rating of those replies minus the base's. It costs a sampling pass an arm, and it
   sees what the estimate cannot: replies the base almost never writes (the estimate
   reweights the base's own replies, so a style none of them has is invisible to it). It is
   noisier, a few dozen replies' mean.

One round from the base after ``ratings`` ratings is the first step of a learning run, not
its whole story: later rounds start from an adapter and a policy whose replies differ.
"""
from __future__ import annotations

import contextlib
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from reinf.catalog import NO_STYLE_LEARNING

#: What ``reinf bench round`` does when not told otherwise.
PLAN = {"ratings": 32, "prompts": 32, "replies": 8, "seed": 0}

#: The built-in arms: config overrides by public name (``Config.replace``), and the bench's
#: own keys (BENCH_KEYS). ``kto@LR`` is KTO at learning rate LR, one point of the sweep
#: ``reinf bench learn --kto-lr`` runs.
#: Every built-in arm learns no styles unless it says so (``catalog.NO_STYLE_LEARNING``
#: under its own keys), as when its published figures were measured, also on a model whose
#: own defaults learn them (``catalog.STYLE_LEARNING``); a ``NAME:key=value`` arm starts
#: from the config as it is.
_ARMS: dict[str, dict[str, Any]] = {
    "rated": {"training.method": "rated"},
    "rollouts": {"training.min_consistency": -1.0},
    # rollouts with half of each prompt's replies asked for in a style (reinf.training.styles)
    # (drawn uniformly, as when the published figures were measured)
    "styled": {"training.min_consistency": -1.0, "training.styled_rollouts": 2,
               "training.styled_pick": "uniform"},
    # styled, with half of the rated replies served in a style (generation.explore_styles)
    "explore": {"training.min_consistency": -1.0, "training.styled_rollouts": 2,
                "training.styled_pick": "uniform", "explore_styles": 0.5,
                "explore_pick": "uniform"},
    # the first version's method, as `reinf bench learn`'s rated baseline runs it
    "rated-v1": {"training.method": "rated", "kl_loss_coef": 0.0, "advantage": "gae"},
    "sft": {"baseline": "sft"},
    "kto": {"baseline": "kto"},
}
ARMS: dict[str, dict[str, Any]] = {name: {**NO_STYLE_LEARNING, **arm}
                                   for name, arm in _ARMS.items()}
#: Arm keys that are not config settings: ``baseline`` (``sft`` or ``kto``: the round is
#: ``reinf.bench.baselines``' instead of the trainer's) and ``kto_lr`` (KTO's learning rate;
#: TRL's recommended 5e-6 when not given).
BENCH_KEYS = ("baseline", "kto_lr")


def parse_arm(spec: str) -> tuple[str, dict[str, Any]]:
    """``NAME`` (a built-in arm, or ``kto@LR``) or ``NAME:key=value,key=value``: config
    overrides by public name, ``r8:training.min_consistency=-1,training.rollouts_per_prompt=8``,
    and the bench's own keys (BENCH_KEYS). The config values stay text here;
    ``Config.replace`` reads and checks them as it reads environment variables."""
    from reinf.errors import BadInput

    name, _, rest = spec.partition(":")
    name = name.strip()
    if not rest:
        if name.startswith("kto@"):
            return name, check_bench_keys(name, {**NO_STYLE_LEARNING, "baseline": "kto",
                                                 "kto_lr": name[4:]})
        if name not in ARMS:
            raise BadInput(f"unknown arm {name!r}",
                           fix=f"use {', '.join(ARMS)}, kto@LR, or NAME:key=value,... with "
                               "config overrides (`reinf config` lists the keys)")
        return name, dict(ARMS[name])
    overrides: dict[str, Any] = {}
    for item in rest.split(","):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise BadInput(f"arm {spec!r}: {item!r} is not key=value",
                           fix="write NAME:key=value,key=value, e.g. "
                               "r8:training.min_consistency=-1,training.rollouts_per_prompt=8")
        overrides[key.strip()] = value.strip()
    return name or "arm", check_bench_keys(spec, overrides)


def check_bench_keys(spec: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` with ``kto_lr`` read as a number; a clear error for a bad baseline or
    rate. The config keys are left to ``Config.replace``."""
    from reinf.errors import BadInput

    baseline = overrides.get("baseline")
    if baseline is not None and baseline not in ("sft", "kto"):
        raise BadInput(f"arm {spec!r}: baseline must be sft or kto, not {baseline!r}",
                       fix="write baseline=sft or baseline=kto")
    if "kto_lr" in overrides:
        try:
            rate = float(overrides["kto_lr"])
        except ValueError:
            rate = math.nan
        if not 0 < rate < 1 or baseline != "kto":
            raise BadInput(f"arm {spec!r}: kto_lr needs baseline=kto and a learning rate "
                           f"between 0 and 1, got {overrides['kto_lr']!r}",
                           fix="write kto@1e-4, or NAME:baseline=kto,kto_lr=1e-4")
        overrides = {**overrides, "kto_lr": rate}
    return overrides


def split_arm(overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config overrides, bench keys) of an arm."""
    return ({k: v for k, v in overrides.items() if k not in BENCH_KEYS},
            {k: v for k, v in overrides.items() if k in BENCH_KEYS})


def run_round_study(config, raters: Sequence[str], arms: Sequence[tuple[str, dict[str, Any]]],
                    *, ratings: int = PLAN["ratings"], prompts: int = PLAN["prompts"],
                    replies: int = PLAN["replies"], seed: int = PLAN["seed"],
                    resample: bool = False,
                    progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The report (module docstring): ``{"model", ..., "raters": {name: {arm: figures}}}``.
    With ``resample``, each round's adapter also answers the held-out prompts afresh (module
    docstring, 4.)."""
    import torch

    from reinf.bench.generation import machine
    from reinf.bench.prompts import load_builtin, split_prompts, stream_prompts
    from reinf.bench.raters import is_unseen, load_rater
    from reinf.errors import BadInput
    from reinf.model.modeling import build_prompt_ids, load_model
    from reinf.training.rollouts import sample_rollouts

    say = progress or (lambda text: print(f"[round] {text}", file=sys.stderr, flush=True))
    train_side, _probe = split_prompts(load_builtin())
    if ratings + prompts > len(train_side):
        raise BadInput(f"--ratings + --prompts ({ratings + prompts}) exceed the "
                       f"{len(train_side)} training-side prompts",
                       fix="pass fewer --ratings or --prompts")
    configs = {}  # (config, bench keys) by arm; built first, so a bad override fails early
    for name, overrides in arms:
        settings, keys = split_arm(overrides)
        configs[name] = (config.replace(**settings), keys)
    if any(keys.get("baseline") == "kto" for _, keys in configs.values()):
        from reinf.bench.baselines import check_trl
        check_trl(instead="leave out the KTO arms")
    loaded_raters = {name: load_rater(name, seed=seed) for name in raters}
    texts = stream_prompts(train_side, seed, ratings + prompts)
    rated_texts, held_texts = texts[:ratings], texts[ratings:]

    torch.manual_seed(seed)
    loaded = load_model(config)
    model, tokenizer = loaded.model, loaded.tokenizer
    g, t = config.generation, config.training
    max_new = t.rollout_max_new_tokens or g.max_new_tokens
    ids = [build_prompt_ids(tokenizer, [], text, max_history=0, max_context_tokens=0,
                            max_new_tokens=max_new) for text in held_texts]
    started = time.perf_counter()
    say(f"sampling {prompts} held-out prompts × {replies} replies from {loaded.name}…")
    held = [r for r in sample_rollouts(model, tokenizer, ids, replies, temperature=g.temperature,
                                       top_p=g.top_p, max_new_tokens=max_new, seed=seed,
                                       batch_size=t.rollout_batch_size)
            if r.reply_ids]
    report: dict[str, Any] = {
        "model": loaded.name, "machine": machine(), "ratings": ratings, "prompts": prompts,
        "replies_per_prompt": replies, "replies": len(held), "seed": seed, "resample": resample,
        "temperature": g.temperature, "max_new_tokens": max_new,
        "arms": {name: overrides for name, overrides in arms},
        "sample_seconds": round(time.perf_counter() - started, 1), "raters": {}}
    for rater_name, rater in loaded_raters.items():
        scores = [float(rater(held_texts[r.group], r.text)) for r in held]
        out: dict[str, Any] = {"unseen": is_unseen(rater_name),
                               "held_out_mean": round(statistics.fmean(scores), 3)}
        for arm, (arm_config, bench_keys) in configs.items():
            say(f"{rater_name}, arm {arm}: {ratings} ratings, one round…")
            with one_round(arm_config, rater, rated_texts, seed,
                           **bench_keys) as (outcome, path, given):
                figures: dict[str, Any] = {"status": outcome.status,
                                           "rated_mean": round(given, 3),
                                           "seconds": round(outcome.seconds, 1)}
                metrics = outcome.metrics or {}
                if bench_keys.get("baseline"):
                    figures["mode"] = bench_keys["baseline"]
                for key in ("mode", "rating_model_consistency", "kl", "rollouts", "iterations",
                            "rated_imitated", "explored_imitated", "imitation_active",
                            "approx_kl", "clipfrac",
                            "steps", "early_stopped", "styled_rollouts",
                            "styled_score_gain", "style_gains", "style_counts",
                            "styled_imitated", "style_lifts"):
                    if metrics.get(key) is not None:
                        figures[key] = metrics[key]
                if path is not None:
                    deltas = round_deltas(model, held, path, outcome.checkpoint_id,
                                          temperature=g.temperature,
                                          batch_size=config.ppo.batch_size)
                    figures.update(judge_round(held, scores, deltas))
                    if resample:
                        fresh = resample_round(model, tokenizer, ids, replies, path,
                                               outcome.checkpoint_id, seed=seed,
                                               temperature=g.temperature, top_p=g.top_p,
                                               max_new_tokens=max_new,
                                               batch_size=t.rollout_batch_size)
                        mean = statistics.fmean(rater(held_texts[r.group], r.text)
                                                for r in fresh)
                        figures.update(resampled_mean=round(mean, 3),
                                       resampled_change=round(mean - out["held_out_mean"], 3))
                else:
                    figures["message"] = outcome.message
            out[arm] = figures
            say(f"{rater_name}, arm {arm}: {describe(figures)}")
        report["raters"][rater_name] = out
    return report


@contextlib.contextmanager
def one_round(config, rater, texts: Sequence[str], seed: int, *, baseline: str | None = None,
              kto_lr: float | None = None):
    """A fresh data directory (``reinf.bench.harness.bench_home``): ``texts`` answered by the
    model and rated by ``rater``, then one forced round in this process: the trainer's, or
    with ``baseline`` (``sft``, ``kto``) that baseline's (``reinf.bench.baselines``). Yields
    the round's outcome, its checkpoint's directory (None unless it succeeded) and the mean
    rating given; the directory is removed on leaving."""
    import shutil

    from reinf.bench.harness import InlineRunner, bench_home
    from reinf.serving.chat import ChatService
    from reinf.serving.engine import Engine
    from reinf.storage.store import Store

    home, cfg = bench_home(config, "round", train_after_ratings=0,
                           training_winrate_prompts=0)
    try:
        store = Store.open(cfg)
        try:
            turns = ChatService(Engine.load(cfg), store, cfg).send_many(list(texts), seed=seed)
            given = [rater(text, turn.reply) for text, turn in zip(texts, turns)]
            for turn, score in zip(turns, given):
                store.rate(turn.id, score)
            if baseline:
                from reinf.bench.baselines import BaselineRunner
                runner = BaselineRunner(baseline, cfg, store, learning_rate=kto_lr)
            else:
                runner = InlineRunner(cfg, store)
            outcome = runner.run("manual", force=True)
            path = None
            if outcome.status == "succeeded" and outcome.checkpoint_id:
                path = Path(store.get_checkpoint(outcome.checkpoint_id).path)
        finally:
            store.close()
        yield outcome, path, statistics.fmean(given)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def round_deltas(model, held, path: Path, checkpoint_id: str, *, temperature: float,
                 batch_size: int) -> list[float]:
    """Per held-out reply, log π_new − log π_base over its tokens (the round's adapter on
    ``model`` and off), at the sampling temperature. ``model`` is left as it was."""
    from reinf.model.adapters import load_adapter
    from reinf.training.ppo import Policy, ValueHead, build_rollout, evaluate, update_mode

    peft = load_adapter(model, path, checkpoint_id)
    try:
        policy = Policy(peft, ValueHead(1))
        b = build_rollout([(r.prompt_ids, r.reply_ids, r.logprobs, temperature, 0.0, 1.0)
                           for r in held], next(model.parameters()).device)
        with update_mode(peft):
            new, _ = evaluate(policy, b, batch_size, values=False)
            base, _ = evaluate(policy, b, batch_size, adapter=False, values=False)
        return ((new - base) * b.mask).sum(1).tolist()
    finally:
        peft.unload()  # the LoRA layers out again: the next arm starts from the bare base


def resample_round(model, tokenizer, ids, replies: int, path: Path, checkpoint_id: str, *,
                   seed: int, temperature: float, top_p: float, max_new_tokens: int,
                   batch_size: int) -> list:
    """``replies`` fresh replies to each of the prompts ``ids`` from the round's adapter on
    ``model``, with the sampler, settings and seed the held-out replies were drawn with (so
    where the adapter changed nothing, the replies are the same). ``model`` is left as it
    was."""
    from reinf.model.adapters import load_adapter
    from reinf.training.rollouts import sample_rollouts

    peft = load_adapter(model, path, checkpoint_id)
    try:
        return [r for r in sample_rollouts(peft, tokenizer, ids, replies,
                                           temperature=temperature, top_p=top_p,
                                           max_new_tokens=max_new_tokens, seed=seed,
                                           batch_size=batch_size) if r.reply_ids]
    finally:
        peft.unload()


def judge_round(held, scores: Sequence[float], deltas: Sequence[float]) -> dict[str, Any]:
    """Pairwise agreement of the round's log-ratios with the rater, and the importance-weighted
    change of the mean rating (module docstring)."""
    groups: dict[int, list[int]] = {}
    for i, r in enumerate(held):
        groups.setdefault(r.group, []).append(i)
    agree, total = 0.0, 0
    changes, ess = [], []
    for members in groups.values():
        for a in range(len(members)):
            for b in range(a + 1, len(members)):
                i, j = members[a], members[b]
                if scores[i] != scores[j]:  # a tie in Δ (no change) counts half
                    total += 1
                    moved = (deltas[i] - deltas[j]) * (scores[i] - scores[j])
                    agree += 1.0 if moved > 0 else 0.5 if moved == 0 else 0.0
        top = max(deltas[i] for i in members)
        w = [math.exp(deltas[i] - top) for i in members]
        new = sum(wi * scores[i] for wi, i in zip(w, members)) / sum(w)
        changes.append(new - statistics.fmean(scores[i] for i in members))
        ess.append(sum(w) ** 2 / sum(wi * wi for wi in w) / len(members))
    return {"pairwise": round(agree / total, 3) if total else None, "pairs": total,
            "estimated_change": round(statistics.fmean(changes), 4),
            "ess": round(statistics.fmean(ess), 3),
            "mean_abs_delta": round(statistics.fmean(abs(d) for d in deltas), 4)}


def describe(f: dict[str, Any]) -> str:
    if f["status"] != "succeeded":
        return f"{f['status']}: {f.get('message', '')}"
    rho = f.get("rating_model_consistency")
    return (f"{f.get('mode', '?')} round"
            + (f" (rating model's cross-validated Spearman {rho:.2f})" if rho is not None else "")
            + f", pairwise {fmt(f['pairwise'])} of {f['pairs']} pairs, "
            f"estimated change {f['estimated_change']:+.3f} (ESS {f['ess']:.2f}), mean |Δ| "
            f"{f['mean_abs_delta']:.3f}, KL {kl_text(f.get('kl'))}, {f['seconds']:.0f} s"
            + (f", resampled change {f['resampled_change']:+.3f}"
               if "resampled_change" in f else "")
            + steps_text(f) + passes_text(f.get("iterations")))


def steps_text(f: dict[str, Any]) -> str:
    """How many optimizer steps the round took, and whether the early stop (target_kl)
    ended it, with how far the last pass moved the policy (approx_kl, clipfrac)."""
    if f.get("steps") is None:
        return ""
    return (f"; {f['steps']} steps" + (", stopped early" if f.get("early_stopped") else "")
            + (f", approx_kl {f['approx_kl']:.3f}, clipfrac {f['clipfrac']:.2f}"
               if f.get("approx_kl") is not None and f.get("clipfrac") is not None else ""))


def passes_text(passes: list[dict] | None) -> str:
    """A round of several passes (training.rollout_iterations): each pass's KL to the base
    and its rollouts' mean predicted score, where it left the policy."""
    if not passes:
        return ""
    return "; passes: " + ", ".join(f"KL {p['kl']:.4f} predicted {p['predicted_score_mean']:.2f}"
                                    for p in passes)


def kl_text(kl: float | None) -> str:
    """A round's KL to the base, or "-" for the baselines, which do not report one."""
    return "-" if kl is None else f"{kl:.4f}"


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def format_round_study(report: dict) -> str:
    """The text report: one line per rater and arm."""
    width = max([5] + [len(name) + 2 for name in report["raters"]])
    lines = [f"reinf bench round: {report['model']}, one round after {report['ratings']} "
             f"ratings; judged on {report['replies']} held-out replies to {report['prompts']} "
             f"training-side prompts ({report['replies_per_prompt']} each, sampled in "
             f"{report['sample_seconds']:.0f} s), seed {report['seed']}",
             f"  machine: {report['machine']}", "",
             f"  {'rater':<{width}} {'arm':<12} {'mode':<9} {'rm rho':>6} {'pairwise':>8} "
             f"{'pairs':>5} {'est. change':>11} {'ESS':>5} {'KL':>7} {'seconds':>7}"
             + (f" {'resampled':>9}" if report.get("resample") else "")]
    for name, r in report["raters"].items():
        label = name + ("" if r["unseen"] else " *")
        for arm in report["arms"]:
            f = r[arm]
            if f["status"] != "succeeded":
                lines.append(f"  {label:<{width}} {arm:<12} {f['status']}: "
                             f"{f.get('message', '')}")
            else:
                rho = f.get("rating_model_consistency")
                lines.append(
                    f"  {label:<{width}} {arm:<12} {f.get('mode', '?'):<9} {fmt(rho):>6} "
                    f"{fmt(f['pairwise']):>8} {f['pairs']:>5} {f['estimated_change']:>+11.3f} "
                    f"{f['ess']:>5.2f} {kl_text(f.get('kl')):>7} {f['seconds']:>7.0f}"
                    + (f" {f['resampled_change']:>+9.3f}" if "resampled_change" in f else ""))
            label = ""
    lines += ["", "  pairwise: of the held-out pairs of replies to one prompt the rater scores "
                  "differently, the share whose better reply the round made relatively more "
                  "likely (0.50 = no direction); est. change: the new policy's mean rating "
                  "on those prompts minus the base's, by importance weighting (ESS near 1: "
                  "reliable); rm rho: the rating model's cross-validated Spearman (the trust "
                  "gate's figure); * = a rater used to choose defaults"
              + ("; resampled: the mean rating of the held-out prompts answered afresh by "
                 "the round's adapter (same sampler and seed) minus the base's"
                 if report.get("resample") else "")]
    return "\n".join(lines)
