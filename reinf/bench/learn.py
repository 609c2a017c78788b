"""``reinf bench learn``: does rating really teach it, and how fast?

The whole loop runs with a simulated rater (``reinf.bench.raters``), through the daemon's code:
``ChatService`` + ``Engine`` generate and store each turn, ``Store.rate`` records the
rating, ``reinf.scheduler.run_job`` runs a round as soon as ``train_after`` new ratings
wait (the daemon's ratings trigger, ``min_waiting``), the round is ``reinf.training.trainer``'s
(``run_once`` -> ``train_round``, promotion gate included) and a promoted checkpoint is
hot-swapped with ``engine.request_swap``, as ``Daemon._adopt`` does. Two differences from
``reinf serve``, both for speed and determinism: the round runs in this process
(``--child`` runs it in the daemon's child process, ``reinf.worker.ChildRunner``), and the
chat waits for it (in the daemon, replies keep coming from the old adapter meanwhile).

**The identical rating stream.** Every method (Reinf's PPO and each baseline,
``reinf.bench.baselines``) starts from the same base model in its own temporary data directory
and gets the same prompts (``sample_prompts(seed, ratings)``), the same sampling seed for
the i-th reply, the same rater (a fresh instance: the noisy rater flips the same rating
positions), and the same schedule (a round after every ``train_after`` ratings). Each
method rates its own on-policy replies: a method's learning shows in what it says next,
so it must be the one generating. Until the first round all methods produce the same
replies and ratings.

Each window of ``window`` ratings reports the mean rating and the share of replies in the
preferred style, and at its end (not counted in the loop's time) the measurements of
``reinf.bench.probe``: KL to the base on probe replies, held-out perplexity, and for PPO the
value head's reward consistency (Spearman against held-out ratings).
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from reinf.errors import BadInput

METHODS = {"reinf": "Reinf (PPO)", "sft": "reward-weighted SFT", "kto": "KTO (TRL)"}
PROBE_SEED = 1_000_003      # sampling seeds of probe replies: fixed across windows and methods


@dataclass(frozen=True)
class LearnPlan:
    rater: str = "prefers-terse"
    ratings: int = 200
    train_after: int = 0          # 0: the config's train_after_ratings
    seed: int = 0
    window: int = 20
    target: float = 4.0
    probe: int = 16               # probe replies per window
    final_probe: int = 128        # probe replies of the base and the final evaluation
    heldout: int = 200            # held-out corpus items for perplexity
    methods: tuple[str, ...] = ("reinf", "sft", "kto")
    child: bool = False
    keep: bool = False


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run_learn(config, plan: LearnPlan, *, progress: Callable[[str], None] = say) -> dict:
    """Run every method of ``plan`` on the same stream; returns the report (JSON-ready)."""
    from reinf.bench.raters import load_rater

    if plan.ratings < 1 or plan.window < 1 or plan.probe < 1:
        raise BadInput("ratings, window and probe must be at least 1")
    unknown = [m for m in plan.methods if m not in METHODS]
    if unknown:
        raise BadInput(f"unknown baseline {unknown[0]!r}",
                       fix="--baselines takes sft, kto, sft,kto or none")
    if "kto" in plan.methods:
        from reinf.bench.baselines import check_trl
        check_trl()
    rater = load_rater(plan.rater, seed=plan.seed)
    k = plan.train_after or config.schedule.train_after_ratings
    if k < 1:
        raise BadInput("train_after must be at least 1 (train_after_ratings is 0 = off)",
                       fix="pass --train-after 8")
    started = time.perf_counter()
    shared: dict[str, Any] = {}
    results = {}
    for method in plan.methods:
        progress(f"[{method}] {METHODS[method]}: {plan.ratings} ratings, a round every {k}")
        results[method] = run_method(method, config, plan, k, shared, progress)
    from reinf.bench.generation import machine
    report = {
        "benchmark": "learn", "rater": {"name": rater.name, "description": rater.description},
        "plan": {**asdict(plan), "train_after": k}, "machine": machine(),
        "model": shared["model"], "config": {s: dict(v) for s, v in config.to_dict().items()
                                             if s in ("lora", "ppo", "schedule")},
        "base": shared["base"], "methods": results,
        "seconds": time.perf_counter() - started,
    }
    report["goals"] = check_goals(report)
    return report


@dataclass
class Context:
    """One method's run: its own data directory, store, engine and rounds."""
    method: str
    config: Any
    store: Any
    engine: Any
    chat: Any
    runner: Any
    home: Path
    rounds: list[dict] = field(default_factory=list)


def build_context(method: str, config, plan: LearnPlan, k: int) -> Context:
    from reinf.chat import ChatService
    from reinf.config import load_config, render_yaml
    from reinf.engine import Engine
    from reinf.store import Store

    home = Path(tempfile.mkdtemp(prefix=f"reinf-bench-{method}-"))
    cfg = config.replace(data_dir=str(home), db_url=None, train_after_ratings=k,
                         train_interval_minutes=0.0)
    # A config file in the data directory, so a child trainer (--child) sees these settings.
    (home / "config.yaml").write_text(render_yaml(cfg), encoding="utf-8")
    cfg = load_config(home / "config.yaml", environ={"REINF_HOME": str(home)})
    store = Store.open(cfg)
    engine = Engine.load(cfg)
    if method != "reinf":
        from reinf.bench.baselines import BaselineRunner
        runner = BaselineRunner(method, cfg, store)
    elif plan.child:
        from reinf.worker import ChildRunner
        runner = ChildRunner(cfg, store)
    else:
        runner = InlineRunner(cfg, store)
    return Context(method, cfg, store, engine, ChatService(engine, store, cfg), runner, home)


class InlineRunner:
    """ChildRunner's interface in this process: ``reinf.training.trainer.run_once`` under the train
    lock, its JSON result read back by the daemon's own ``reinf.worker.interpret``."""

    def __init__(self, config, store):
        self.config, self.store, self.pid = config, store, None

    def run(self, trigger: str, *, force: bool = False):
        from reinf.lock import acquire_train_lock
        from reinf.training.trainer import run_once
        from reinf.worker import Outcome, interpret

        started = time.monotonic()
        lock = acquire_train_lock(self.config, trigger=trigger)
        if lock is None:
            return Outcome("skipped", "another training round is already running")
        try:
            code, payload, _ = run_once(self.config, self.store, trigger=trigger, force=force)
        finally:
            lock.release()
        outcome = interpret(code, [json.dumps(payload)], [], None)
        outcome.seconds = time.monotonic() - started
        return outcome


def adopt(ctx: Context, outcome) -> dict:
    """What ``Daemon._round`` does with a round's outcome: swap a promoted checkpoint in."""
    result = outcome.to_dict()
    if outcome.status == "succeeded" and outcome.checkpoint_id:
        record = ctx.store.get_checkpoint(outcome.checkpoint_id)
        result["swap_pause_ms"] = ctx.engine.request_swap(outcome.checkpoint_id, record.path)
    return result


def run_method(method: str, config, plan: LearnPlan, k: int, shared: dict,
               progress: Callable[[str], None]) -> dict:
    import shutil

    import torch

    from reinf.demo.corpus import sample_prompts
    from reinf.bench.raters import load_rater
    from reinf.scheduler import run_job, utcnow

    torch.manual_seed(plan.seed)
    ctx = build_context(method, config, plan, k)
    try:
        rater = load_rater(plan.rater, seed=plan.seed)
        if "heldout" not in shared:
            prepare_shared(ctx, plan, shared)
        if "base" not in shared:
            shared["base"] = evaluate(ctx, plan, shared, plan.final_probe, base=True)
        windows = [{"ratings": 0, **shared["base"]}]

        def round_fn(trigger: str, force: bool) -> dict:
            return adopt(ctx, ctx.runner.run(trigger, force=force))

        scores, preferred, seconds, loop, eval_seconds = [], [], [], 0.0, 0.0
        for i, prompt in enumerate(sample_prompts(plan.seed, plan.ratings)):
            t0 = time.perf_counter()
            turn = ctx.chat.send(prompt, seed=plan.seed * 100_003 + i)
            score = rater(prompt, turn.reply)
            ctx.store.rate(turn.id, score)
            scores.append(score)
            preferred.append(rater.is_preferred(turn.reply, score))
            seconds.append(loop + time.perf_counter() - t0)
            result = run_job("ratings", force=False, round_fn=round_fn, store=ctx.store,
                             now=utcnow, min_waiting=k)
            if result["status"] != "skipped":
                ctx.rounds.append(summarize_round(result, i + 1))
            loop += time.perf_counter() - t0
            n = i + 1
            if n % plan.window == 0 or n == plan.ratings:
                t1 = time.perf_counter()
                w = evaluate(ctx, plan, shared, plan.probe)
                eval_seconds += time.perf_counter() - t1
                recent = scores[-plan.window:]
                windows.append({"ratings": n, "mean_rating": statistics.fmean(recent),
                                "preferred_share": statistics.fmean(preferred[-plan.window:]),
                                "rounds": len(ctx.rounds), "seconds": loop, **w})
                progress(f"[{method}] {n}/{plan.ratings} ratings: mean {windows[-1]['mean_rating']:.2f}"
                         f", preferred {windows[-1]['preferred_share']:.0%}, KL {w['kl']:.4f}, "
                         f"ppl {w['perplexity']:.3f} (preferred style {w['perplexity_preferred'] or 0:.3f}), "
                         f"{len(ctx.rounds)} rounds, {loop:.0f} s")
        t1 = time.perf_counter()
        final = evaluate(ctx, plan, shared, plan.final_probe)
        eval_seconds += time.perf_counter() - t1
        reached = ratings_to_target(scores, plan.window, plan.target)
        held = ratings_to_target(scores, plan.window, plan.target, held=True)
        pauses = [r["swap_pause_ms"] for r in ctx.rounds if r.get("swap_pause_ms") is not None]
        return {
            "label": METHODS[method], "windows": windows, "final": final, "rounds": ctx.rounds,
            "ratings_to_target": reached, "seconds_to_target":
                seconds[reached - 1] if reached else None,
            "ratings_to_target_held": held, "seconds_to_target_held":
                seconds[held - 1] if held else None,
            "scores": scores, "preferred": [int(p) for p in preferred],
            "loop_seconds": loop, "eval_seconds": eval_seconds,
            "rounds_succeeded": sum(r["status"] == "succeeded" for r in ctx.rounds),
            "rounds_rejected": sum(r["status"] == "rejected" for r in ctx.rounds),
            "swap_pause_ms_median": statistics.median(pauses) if pauses else None,
            "data_dir": str(ctx.home) if plan.keep else None,
        }
    finally:
        ctx.store.close()
        if not plan.keep:
            shutil.rmtree(ctx.home, ignore_errors=True)


def prepare_shared(ctx: Context, plan: LearnPlan, shared: dict) -> None:
    """What every method measures against: held-out corpus items and their ratings, probe
    prompts, and the model's name."""
    from reinf.demo.corpus import sample_prompts
    from reinf.bench.probe import load_heldout
    from reinf.bench.raters import load_rater

    heldout = load_heldout(ctx.engine.tokenizer, plan.heldout)
    judge = load_rater(plan.rater, seed=plan.seed + 2)  # its own stream: held-out ratings
    shared["heldout"] = heldout
    shared["heldout_scores"] = [judge(p, r) for p, r in zip(heldout.prompts, heldout.replies)]
    shared["heldout_preferred"] = [judge.is_preferred(r, s) for r, s in
                                   zip(heldout.replies, shared["heldout_scores"])]
    shared["probe_prompts"] = sample_prompts(plan.seed + 1, plan.final_probe)
    shared["model"] = {"name": ctx.engine.model_name, "parameters":
                       sum(p.numel() for p in ctx.engine.model.parameters())}


def evaluate(ctx: Context, plan: LearnPlan, shared: dict, n_probe: int, *,
             base: bool = False) -> dict:
    """Probe replies from the live engine, rated by a held-out rater; then KL, perplexity
    and predicted rewards from the active checkpoint (reinf.bench.probe)."""
    from reinf.bench.probe import load_policy, measure_policy, spearman, subset_perplexity
    from reinf.bench.raters import load_rater

    judge = load_rater(plan.rater, seed=plan.seed + 1)
    replies, scores, good = [], [], []
    for j, prompt in enumerate(shared["probe_prompts"][:n_probe]):
        params = ctx.engine.generation_params(seed=PROBE_SEED + j)
        reply = ctx.engine.stream_prompt(ctx.engine.build_prompt([], prompt), params).wait()
        score = judge(prompt, reply.text)
        replies.append(reply)
        scores.append(score)
        good.append(judge.is_preferred(reply.text, score))
    active = None if base else ctx.store.active_checkpoint()
    policy = load_policy(ctx.config, active.path if active else None, cache=shared)
    episodes = [(r.prompt_ids, r.reply_ids, r.logprobs, r.gen_params["temperature"], 0.0, 1.0)
                for r in replies if r.reply_ids]
    m = measure_policy(policy, episodes, shared["heldout"], adapter=active is not None,
                       batch_size=ctx.config.ppo.batch_size * 2)
    probe_scores = [s for s, r in zip(scores, replies) if r.reply_ids]
    return {"probe_mean_rating": statistics.fmean(scores),
            "probe_preferred_share": statistics.fmean(good), "kl": m["kl"],
            "perplexity": m["perplexity"], "probe": len(replies),
            "perplexity_preferred": subset_perplexity(m["heldout_nll"], m["heldout_tokens"],
                                                      shared["heldout_preferred"]),
            "active_checkpoint": active.id if active else None,
            "consistency_probe": spearman(m["probe_values"], probe_scores),
            "consistency_heldout": spearman(m["heldout_values"], shared["heldout_scores"])}


def summarize_round(result: dict, after: int) -> dict:
    m = result.get("metrics") or {}
    keys = ("kl", "approx_kl", "kl_coef", "reward_mean", "samples", "epochs_run", "loss",
            "explained_variance", "clipfrac", "seconds")
    return {"after_ratings": after, "status": result["status"],
            "checkpoint_id": result.get("checkpoint_id"), "message": result.get("message"),
            "swap_pause_ms": result.get("swap_pause_ms"),
            **{k: m[k] for k in keys if k in m}}


def ratings_to_target(scores: list[int], window: int, target: float, *,
                      held: bool = False) -> int | None:
    """The first n at which the mean of the last ``window`` ratings (all of them while
    fewer) reaches ``target``, counting from n = window (or the end, if shorter).

    ``held=True``: the first n from which that rolling mean stays at or above ``target``
    through the last rating. One lucky window of a 50/50 policy can reach a target once
    (a window of 20 binary ratings has a standard error of about 0.9 on the mean rating);
    holding it to the end of the run needs a policy that has really moved."""
    first = min(window, len(scores))
    means = [statistics.fmean(scores[max(0, n - window):n]) for n in range(first, len(scores) + 1)]
    if not held:
        return next((first + i for i, m in enumerate(means) if m >= target), None)
    reached = None
    for i, m in enumerate(means):
        if m < target:
            reached = None
        elif reached is None:
            reached = first + i
    return reached


def ratio(new: float | None, old: float | None) -> float | None:
    return None if new is None or not old else new / old - 1


def check_goals(report: dict) -> dict:
    """The issue's goals for the default configuration (Reinf's PPO), with the figures."""
    ppo = report["methods"].get("reinf")
    if ppo is None:
        return {}
    base = report["base"]
    window = report["plan"]["window"]
    scores = ppo["scores"]

    def rolling(n: int) -> float | None:
        return statistics.fmean(scores[max(0, n - window):n]) if len(scores) >= n else None

    at120 = rolling(120)
    last = ppo["windows"][-1]
    ppl_change = ppo["final"]["perplexity"] / base["perplexity"] - 1
    # Held, not first reached: a first reach is mostly the luck of one window.
    others = {m: r["ratings_to_target_held"] for m, r in report["methods"].items()
              if m != "reinf"}
    mine = ppo["ratings_to_target_held"]
    return {
        "rise_by_120": {"base_mean": base["probe_mean_rating"], "mean_at_120": at120,
                        "rise": None if at120 is None else at120 - base["probe_mean_rating"],
                        "met": at120 is not None and at120 - base["probe_mean_rating"] >= 1.0},
        "share_by_200": {"base_share": base["probe_preferred_share"],
                         "last_window_share": last["preferred_share"],
                         "final_probe_share": ppo["final"]["probe_preferred_share"],
                         "met": len(scores) >= 200 and last["preferred_share"] >= 0.9},
        "perplexity": {"base": base["perplexity"], "final": ppo["final"]["perplexity"],
                       "change": ppl_change, "met": ppl_change <= 0.10,
                       "preferred_change": ratio(ppo["final"].get("perplexity_preferred"),
                                                 base.get("perplexity_preferred"))},
        "fewer_ratings_than_baselines": {
            "reinf": mine, **others,
            "met": bool(others) and mine is not None and all(v is None or mine < v
                                                             for v in others.values())},
    }
