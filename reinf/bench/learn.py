"""``reinf bench learn``: does rating really teach it, and how fast?

The whole loop runs with a simulated rater (``reinf.bench.raters``), through the daemon's code:
``ChatService`` + ``Engine`` generate and store each turn, ``Store.rate`` records the
rating, ``reinf.daemon.scheduler.run_job`` runs a round as soon as ``train_after`` new ratings
wait (the daemon's ratings trigger, ``min_waiting``), the round is ``reinf.training.trainer``'s
(``run_once`` -> ``train_round``, promotion gate included) and a promoted checkpoint is
hot-swapped with ``engine.request_swap``, as ``Daemon._adopt`` does. Two differences from
``reinf serve``, both for speed and determinism: the round runs in this process
(``--child`` runs it in the daemon's child process, ``reinf.daemon.worker.ChildRunner``), and the
chat waits for it (in the daemon, replies keep coming from the old adapter meanwhile).

**The identical rating stream.** Every method (Reinf as configured, the same trainer on rated
replies only, and the baselines of ``reinf.bench.baselines``) starts from the same base model in
its own temporary data directory and gets, for one seed, the same prompts (that seed's
training stream, ``reinf.bench.prompts``), the same sampling seed for the i-th reply, the
same rater (a fresh instance: a noisy rater flips the same rating positions) and the same
schedule (a round after every ``train_after`` ratings). Each method rates its own on-policy
replies, so until the first round all methods produce the same replies and ratings. ``seeds``
runs it all again on seed, seed + 1, ...; the report gives each figure's mean over seeds and
its min-max.

**The prompts** (``reinf.bench.prompts.build_prompt_plan``). On a real model the training
streams and the probe are the two sides of the built-in prompt set (or of ``--prompts``
FILE, or ``--prompts`` and ``--probe-prompts``), split by a fixed rule on the normalised
text. On the demo model the training streams stay the demo corpus's prompts
(``sample_prompts(seed, ratings)``, as its figures always were) and the probe is the rest of
the corpus's prompt space. Either way the probe is **held out**: no probe prompt, and no
near-duplicate of one (the same normalised text), is a training prompt of the run, and on
the demo model none is in the demo model's own training split; the plan checks it, and the
report says how many overlaps it dropped (``prompts``).

**The probe curve.** After every round, the active checkpoint answers the first ``probe`` of
the probe prompts in their fixed order (repeated in order when there are fewer; sampled in
batches of 16, block b with seed ``PROBE_SEED + b``: the same for every round, method and
seed) and a judge
(the rater, seeded ``PROBE_SEED``) rates them; the same pass measures KL to the base and
perplexity on the demo corpus's held-out slice (``reinf.bench.probe``; about a quarter of
the probe's time, so it runs per round too).
**Pairs** (``pairs_every`` N, ``--pairs-every``): every Nth interaction the simulated person
gives a pair instead of a rating, at the same cost (``give_pair``): the reply, another one to
the same message through regenerate's path, the better of the two by the rater picked (a
regenerate pair), a tie when it scores them the same. The x axis (``ratings`` in the curves)
then counts interactions, ratings and pairs alike, a round comes after every ``train_after``
interactions, and the live windows count the first reply of a pair as a rating would.

"Ratings to target" reads this curve, not the live ratings: 64 fixed prompts have far less luck
in them than a window of 16 live ratings, and "held" asks that the curve stay at or above the
target from that round to the end of the run.
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from reinf.errors import BadInput

METHODS = {"reinf": "Reinf (default config)", "rated": "PPO on rated replies only",
           "sft": "reward-weighted SFT", "kto": "KTO (TRL)"}
BASELINES = ("rated", "sft", "kto")
PROBE_SEED = 1_000_003      # probe prompts, sampling seeds, judge: fixed across rounds and runs
PAIR_SEED = 50_000          # a pair's second reply: its sampling seed is the first's + this
# The goals, checked on Reinf's means over seeds (check_goals).
GOAL_RISE, GOAL_RISE_BY = 1.0, 48             # probe mean +1.0 over the base by 48 ratings
GOAL_SHARE, GOAL_SHARE_BY = 0.9, 96           # preferred share >= 90% by 96 ratings
GOAL_PPL_PREFERRED = 0.05                     # perplexity on preferred-style replies +5% at most
GOAL_SPEARMAN, GOAL_SPEARMAN_AFTER = 0.8, 48  # rating model's cross-validated Spearman
POINT_KEYS = ("probe_mean_rating", "probe_preferred_share", "kl", "perplexity",
              "perplexity_preferred", "rating_model_consistency")


@dataclass(frozen=True)
class LearnPlan:
    rater: str = "prefers-terse"
    ratings: int = 96
    train_after: int = 0          # 0: the config's train_after_ratings
    seed: int = 0
    seeds: int = 3                # runs on seed, seed + 1, ...
    window: int = 16
    target: float = 4.0
    probe: int = 64               # probe replies after every round
    final_probe: int = 128        # probe replies of the base and the final evaluation
    heldout: int = 200            # held-out corpus items for perplexity
    methods: tuple[str, ...] = ("reinf", "rated", "sft", "kto")
    child: bool = False
    keep: bool = False
    prompts: str | None = None        # training prompts (.txt or .jsonl); None: built in
    probe_prompts: str | None = None  # probe prompts; None: the other side of the split
    pairs_every: int = 0          # every Nth interaction is a pair, not a rating; 0: never


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run_learn(config, plan: LearnPlan, *, progress: Callable[[str], None] = say) -> dict:
    """Run every method of ``plan`` on each seed's stream; returns the report (JSON-ready)."""
    from reinf.bench.raters import load_rater

    if min(plan.ratings, plan.seeds, plan.window, plan.probe, plan.final_probe) < 1:
        raise BadInput("ratings, seeds, window, probe and final_probe must be at least 1")
    if plan.pairs_every == 1 or plan.pairs_every < 0:
        raise BadInput("--pairs-every must be 0 (ratings only) or at least 2: the rating "
                       "model needs ratings beside the pairs", fix="pass --pairs-every 4")
    unknown = [m for m in plan.methods if m not in METHODS]
    if unknown:
        raise BadInput(f"unknown baseline {unknown[0]!r}",
                       fix="--baselines takes a comma list of rated, sft and kto, or none")
    if "kto" in plan.methods:
        from reinf.bench.baselines import check_trl
        check_trl()
    rater = load_rater(plan.rater, seed=plan.seed)
    k = plan.train_after or config.schedule.train_after_ratings
    if k < 1:
        raise BadInput("train_after must be at least 1 (train_after_ratings is 0 = off)",
                       fix="pass --train-after 8")
    seeds = list(range(plan.seed, plan.seed + plan.seeds))
    prompts = plan_prompts(config, plan, seeds)
    from reinf.config import resolve_model_path
    from reinf.model.modeling import check_model_path
    check_model_path(resolve_model_path(config), config)  # before any temporary directory
    info = prompts.info
    progress(f"prompts: {info['train_prompts']} training ({info['train_source']}), "
             f"{info['probe_prompts']} probe ({info['probe_source']}), disjoint; "
             f"{info['overlaps_removed']} overlapping probe prompt(s) dropped")
    started = time.perf_counter()
    shared: dict[str, Any] = {"prompt_plan": prompts}
    runs: dict[str, list[dict]] = {m: [] for m in plan.methods}
    for seed in seeds:
        for method in plan.methods:
            progress(f"[{method} seed {seed}] {label_of(method, config)}: {plan.ratings} "
                     + (f"interactions (a pair every {plan.pairs_every})"
                        if plan.pairs_every else "ratings") + f", a round every {k}")
            runs[method].append(run_method(method, config, plan, k, seed, shared, progress))
    from reinf.bench.generation import machine
    methods = {m: {"label": label_of(m, config), "settings": settings_of(m, config),
                   **summarize_method(runs[m], plan, shared["base"])} for m in plan.methods}
    report = {
        "benchmark": "learn", "rater": {"name": rater.name, "description": rater.description,
                                        "unseen": rater.unseen},
        "prompts": {**info, "probe_replies": max(plan.probe, plan.final_probe)},
        "plan": {**asdict(plan), "train_after": k}, "seeds": seeds, "machine": machine(),
        "model": shared["model"], "config": {s: dict(v) for s, v in config.to_dict().items()
                                             if s in ("lora", "ppo", "training", "schedule")},
        "base": shared["base"], "base_curve": shared["base_curve"], "methods": methods,
        "seconds": time.perf_counter() - started,
    }
    report["goals"] = check_goals(report)
    return report


def plan_prompts(config, plan: LearnPlan, seeds: list[int]):
    """The run's training streams and its held-out probe (``reinf.bench.prompts``): the
    demo model keeps its corpus's prompts for training, any other model uses the prompt set."""
    from reinf.bench.prompts import build_prompt_plan
    from reinf.config import DEMO_MODEL, resolve_model_path

    path = resolve_model_path(config)
    demo = Path(path).name == DEMO_MODEL
    return build_prompt_plan(demo=demo, seeds=seeds, ratings=plan.ratings,
                             prompts_file=plan.prompts, probe_file=plan.probe_prompts,
                             model_dir=path if demo else None)


def format_prompts(report: dict) -> str:
    """The prompt lines of the text report: where training and probe prompts came from."""
    p, rater = report["prompts"], report["rater"]
    lines = [f"prompts: {p['train_prompts']} training ({p['train_source']}); "
             f"{p['probe_prompts']} probe ({p['probe_source']}; up to {p['probe_replies']} "
             "replies a measurement)",
             f"  the probe is held out: no probe prompt (or near-duplicate) is a training "
             f"prompt; {p['overlaps_removed']} overlapping probe prompt(s) dropped"]
    if p.get("split"):
        lines.append(f"  split: {p['split']}")
    lines.append(f"rater {rater['name']}: " + (
        "unseen (never used to choose a default)" if rater.get("unseen") else
        "used to choose the defaults (raters.TUNED_ON), so not an unseen rater"))
    return "\n".join(lines)


def label_of(method: str, config) -> str:
    return f"Reinf ({config.training.method})" if method == "reinf" else METHODS[method]


def settings_of(method: str, config) -> dict:
    """What the method trains with, for the report (KTO's own settings: baselines.py)."""
    if method == "kto":
        from reinf.bench.baselines import kto_settings
        return kto_settings(config)
    p = config.ppo
    out = {"learning_rate": p.learning_rate, "batch_size": p.batch_size, "epochs": p.ppo_epochs}
    if method in ("reinf", "rated"):
        out["training_method"] = "rated" if method == "rated" else config.training.method
        out["kl_loss_coef"] = 0.0 if method == "rated" else p.kl_loss_coef
    return out


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
    from reinf.serving.chat import ChatService
    from reinf.config import load_config, render_yaml
    from reinf.serving.engine import Engine
    from reinf.storage.store import Store

    home = Path(tempfile.mkdtemp(prefix=f"reinf-bench-{method}-"))
    link_pulled_model(config, home)
    # the first version's method: rated replies only, the KL penalty in the return only
    extra = {"training_method": "rated", "kl_loss_coef": 0.0} if method == "rated" else {}
    cfg = config.replace(data_dir=str(home), db_url=None, train_after_ratings=k,
                         train_interval_minutes=0.0, **extra)
    # A config file in the data directory, so a child trainer (--child) sees these settings.
    (home / "config.yaml").write_text(render_yaml(cfg), encoding="utf-8")
    cfg = load_config(home / "config.yaml", environ={"REINF_HOME": str(home)})
    store = Store.open(cfg)
    engine = Engine.load(cfg)
    if method not in ("reinf", "rated"):
        from reinf.bench.baselines import BaselineRunner
        runner = BaselineRunner(method, cfg, store)
    elif plan.child:
        from reinf.daemon.worker import ChildRunner
        runner = ChildRunner(cfg, store)
    else:
        runner = InlineRunner(cfg, store)
    return Context(method, cfg, store, engine, ChatService(engine, store, cfg), runner, home)


def link_pulled_model(config, home: Path) -> None:
    """A named model (``reinf pull``) lives in the person's data directory; the run's own
    temporary one links to it, so the name (and the model's preset defaults) still apply."""
    from reinf.catalog import KNOWN_MODELS, pulled_dir

    name = config.model.model_path
    if name in KNOWN_MODELS and KNOWN_MODELS[name].source is not None:
        source = pulled_dir(config.data_dir, name)
        if source.is_dir():
            target = pulled_dir(home, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(source.resolve(), target_is_directory=True)


class InlineRunner:
    """ChildRunner's interface in this process: ``reinf.training.trainer.run_once`` under the train
    lock, its JSON result read back by the daemon's own ``reinf.daemon.worker.interpret``."""

    def __init__(self, config, store):
        self.config, self.store, self.pid = config, store, None

    def run(self, trigger: str, *, force: bool = False):
        from reinf.daemon.lock import acquire_train_lock
        from reinf.training.trainer import run_once
        from reinf.daemon.worker import Outcome, interpret

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


def run_method(method: str, config, plan: LearnPlan, k: int, seed: int, shared: dict,
               progress: Callable[[str], None]) -> dict:
    """One method on one seed's stream: the per-seed detail of the report."""
    import shutil

    import torch

    from reinf.bench.raters import load_rater
    from reinf.daemon.scheduler import run_job, utcnow

    torch.manual_seed(seed)
    ctx = build_context(method, config, plan, k)
    tag = f"[{method} seed {seed}]"
    try:
        rater = load_rater(plan.rater, seed=seed)
        if "heldout" not in shared:
            prepare_shared(ctx, plan, shared)
        probe = Probe(ctx, plan, shared, progress)
        if "base" not in shared:
            shared["base"] = probe.measure(max(plan.probe, plan.final_probe))
            shared["base_curve"] = probe.measure(plan.probe)
        curve = [{"ratings": 0, "seconds": 0.0, **shared["base_curve"]}]
        windows = [{"ratings": 0, **shared["base_curve"]}]

        def round_fn(trigger: str, force: bool) -> dict:
            return adopt(ctx, ctx.runner.run(trigger, force=force))

        scores, preferred, loop = [], [], 0.0
        picks: Counter = Counter()
        last_round = 0
        for i, prompt in enumerate(shared["prompt_plan"].streams[seed]):
            n = i + 1
            t0 = time.perf_counter()
            if plan.pairs_every and n % plan.pairs_every == 0:
                score, good, outcome = give_pair(ctx, rater, prompt, seed * 100_003 + i)
                picks[outcome] += 1
            else:
                turn = ctx.chat.send(prompt, seed=seed * 100_003 + i)
                score = rater(prompt, turn.reply)
                ctx.store.rate(turn.id, score)
                good = rater.is_preferred(turn.reply, score, prompt=prompt)
            scores.append(score)
            preferred.append(good)
            t1 = time.perf_counter()
            if plan.pairs_every:  # a round after every k interactions, ratings and pairs alike
                result = run_job("ratings", force=False, round_fn=round_fn, store=ctx.store,
                                 now=utcnow) if n - last_round >= k else {"status": "skipped"}
            else:
                result = run_job("ratings", force=False, round_fn=round_fn, store=ctx.store,
                                 now=utcnow, min_waiting=k)
            last_round = n if result["status"] != "skipped" else last_round
            loop += time.perf_counter() - t0
            if result["status"] != "skipped":
                rnd = {**summarize_round(result, n), "wall_seconds": time.perf_counter() - t1}
                ctx.rounds.append(rnd)
                point = probe.measure(plan.probe)
                curve.append({"ratings": n, "seconds": loop, "status": rnd["status"],
                              "mode": rnd.get("mode"), "rating_model_consistency":
                                  rnd.get("rating_model_consistency"), **point})
                progress(f"{tag} round after {n}: {rnd['status']}"
                         f"{' (' + rnd['mode'] + ')' if rnd.get('mode') else ''} in "
                         f"{rnd['wall_seconds']:.1f} s; probe mean {point['probe_mean_rating']:.2f}"
                         f", preferred {point['probe_preferred_share']:.0%}, KL {point['kl']:.4f}")
            if n % plan.window == 0 or n == plan.ratings:
                last = windows[-1]["ratings"]
                windows.append({"ratings": n, "mean_rating": statistics.fmean(scores[last:]),
                                "preferred_share": statistics.fmean(preferred[last:]),
                                "rounds": len(ctx.rounds), "seconds": loop,
                                **probe.measure(plan.probe)})
                w = windows[-1]
                progress(f"{tag} {n}/{plan.ratings} ratings: live mean {w['mean_rating']:.2f}, "
                         f"preferred {w['preferred_share']:.0%}; ppl {w['perplexity']:.3f} "
                         f"(preferred style {w['perplexity_preferred'] or 0:.3f}), {loop:.0f} s")
        final = probe.measure(max(plan.probe, plan.final_probe))
        points = [(p["ratings"], p["probe_mean_rating"]) for p in curve]
        reached = curve_to_target(points, plan.target)
        held = curve_to_target(points, plan.target, held=True)
        at = {p["ratings"]: p["seconds"] for p in curve}
        pauses = [r["swap_pause_ms"] for r in ctx.rounds if r.get("swap_pause_ms") is not None]
        modes = Counter(r["mode"] for r in ctx.rounds if r.get("mode"))
        return {
            "seed": seed, "curve": curve, "windows": windows, "final": final,
            "rounds": ctx.rounds, "modes": dict(modes) if modes else None,
            "ratings_to_target": reached, "seconds_to_target": at.get(reached),
            "ratings_to_target_held": held, "seconds_to_target_held": at.get(held),
            "window_ratings_to_target_held": ratings_to_target(scores, plan.window,
                                                               plan.target, held=True),
            "scores": scores, "preferred": [int(p) for p in preferred],
            "pairs": dict(picks) if plan.pairs_every else None,
            "loop_seconds": loop, "probe_seconds": probe.generate_seconds,
            "measure_seconds": probe.measure_seconds,
            "round_seconds": statistics.fmean(r["wall_seconds"] for r in ctx.rounds)
            if ctx.rounds else None,
            "rounds_succeeded": sum(r["status"] == "succeeded" for r in ctx.rounds),
            "rounds_rejected": sum(r["status"] == "rejected" for r in ctx.rounds),
            "rounds_failed": sum(r["status"] == "failed" for r in ctx.rounds),
            "swap_pause_ms_median": statistics.median(pauses) if pauses else None,
            "data_dir": str(ctx.home) if plan.keep else None,
        }
    finally:
        ctx.store.close()
        if not plan.keep:
            shutil.rmtree(ctx.home, ignore_errors=True)


def give_pair(ctx: Context, rater, prompt: str, seed: int) -> tuple[int, bool, str]:
    """An interaction that gives a pair instead of a rating: the reply to ``prompt``, then
    another to the same message through regenerate's path (``ChatService.stream_again``);
    the rater scores both, the better one is picked (``ChatService.pick``: a regenerate
    pair), equal scores are stored as a tie. Returns the first reply's score and preferred
    flag (what the live windows count, as for a rating) and the outcome (a, b or tie)."""
    first = ctx.chat.send(prompt, seed=seed)
    second = ctx.chat.stream_again(first.id, seed=seed + PAIR_SEED).wait()
    score, other = rater(prompt, first.reply), rater(prompt, second.reply)
    if score == other:
        ctx.store.add_pair(prompt, "tie", source="regenerate", a_turn_id=first.id,
                           b_turn_id=second.id)
        outcome = "tie"
    else:
        ctx.chat.pick(first.id if score > other else second.id)
        outcome = "a" if score > other else "b"
    return score, rater.is_preferred(first.reply, score, prompt=prompt), outcome


def prepare_shared(ctx: Context, plan: LearnPlan, shared: dict) -> None:
    """What every method and seed measures against: held-out corpus items and their ratings,
    the probe prompts (the plan's, in their fixed order, repeated to the size needed), and
    the model's name."""
    from reinf.bench.probe import load_heldout
    from reinf.bench.prompts import repeat_to
    from reinf.bench.raters import load_rater

    heldout = load_heldout(ctx.engine.tokenizer, plan.heldout)
    judge = load_rater(plan.rater, seed=PROBE_SEED + 1)  # its own stream: held-out ratings
    shared["heldout"] = heldout
    shared["heldout_scores"] = [judge(p, r) for p, r in zip(heldout.prompts, heldout.replies)]
    shared["heldout_preferred"] = [judge.is_preferred(r, s, prompt=p) for p, r, s in
                                   zip(heldout.prompts, heldout.replies,
                                       shared["heldout_scores"])]
    shared["probe_prompts"] = repeat_to(shared["prompt_plan"].probe,
                                        max(plan.probe, plan.final_probe))
    shared["model"] = {"name": ctx.engine.model_name, "parameters":
                       sum(p.numel() for p in ctx.engine.model.parameters())}


class Probe:
    """The probe of one run: replies of the active checkpoint to the held-out probe prompts,
    rated by a judge, then KL, perplexity and predicted rewards (``reinf.bench.probe``).

    The replies are sampled in batches (``reinf.bench.probe.sample_probe``: block b of 16
    prompts with seed ``PROBE_SEED + b``, so reply j is the same for every probe size) and
    reply j is rated by the j-th call of that checkpoint's judge, so a checkpoint's replies
    are cached and extended (64 per round, 128 at the end) and its figures are computed once
    per probe size; the base's are shared by every method and seed."""

    def __init__(self, ctx: Context, plan: LearnPlan, shared: dict,
                 progress: Callable[[str], None] | None = None):
        self.ctx, self.plan, self.shared = ctx, plan, shared
        self.say = progress
        self.cache: dict[str | None, dict] = {None: shared.setdefault("base_probe", {})}
        self.generate_seconds = self.measure_seconds = 0.0

    def progress(self, done: int, total: int) -> None:
        if self.say is not None:
            self.say(f"  probe: {done}/{total} replies")

    def measure(self, n: int) -> dict:
        active = self.ctx.store.active_checkpoint()
        entry = self.cache.setdefault(active.id if active else None, {})
        if not entry:
            from reinf.bench.raters import load_rater
            entry.update(judge=load_rater(self.plan.rater, seed=PROBE_SEED), replies=[],
                         results={})
        if n not in entry["results"]:
            entry["results"][n] = self._measure(active, entry, n)
        return dict(entry["results"][n])

    def _measure(self, active, entry: dict, n: int) -> dict:
        from reinf.bench.probe import (load_policy, measure_policy, sample_probe, spearman,
                                       subset_perplexity)

        engine, replies, judge = self.ctx.engine, entry["replies"], entry["judge"]
        started = time.perf_counter()
        if len(replies) < n:
            for reply in sample_probe(engine, self.shared["probe_prompts"], len(replies), n,
                                      seed=PROBE_SEED, progress=self.progress):
                score = judge(reply.prompt, reply.text)
                replies.append((reply, score, judge.is_preferred(reply.text, score,
                                                                 prompt=reply.prompt)))
        measured = time.perf_counter()
        self.generate_seconds += measured - started
        probe = replies[:n]
        policy = load_policy(self.ctx.config, active.path if active else None,
                             cache=self.shared)
        episodes = [(r.prompt_ids, r.reply_ids, r.logprobs, r.gen_params["temperature"], 0.0,
                     1.0) for r, _, _ in probe if r.reply_ids]
        m = measure_policy(policy, episodes, self.shared["heldout"], adapter=active is not None,
                           batch_size=self.ctx.config.ppo.batch_size * 2)
        self.measure_seconds += time.perf_counter() - measured
        shared = self.shared
        return {"probe_mean_rating": statistics.fmean(s for _, s, _ in probe),
                "probe_preferred_share": statistics.fmean(g for _, _, g in probe),
                "kl": m["kl"], "perplexity": m["perplexity"], "probe": len(probe),
                "perplexity_preferred": subset_perplexity(
                    m["heldout_nll"], m["heldout_tokens"], shared["heldout_preferred"]),
                "active_checkpoint": active.id if active else None,
                "consistency_probe": spearman(m["probe_values"],
                                              [s for r, s, _ in probe if r.reply_ids]),
                "consistency_heldout": spearman(m["heldout_values"], shared["heldout_scores"])}


def summarize_round(result: dict, after: int) -> dict:
    m = result.get("metrics") or {}
    keys = ("kl", "approx_kl", "kl_coef", "reward_mean", "samples", "steps", "epochs_run", "loss",
            "explained_variance", "clipfrac", "seconds", "mode", "mode_reason",
            "rating_model_consistency", "rating_model_consistency_ceiling", "rollouts",
            "predicted_score_mean", "rollout_seconds",
            "fluency_change", "staleness", "advantage", "rating_model_pairs",
            "rating_model_pair_accuracy", "rating_model_pair_accuracy_ratings_only")
    by_model = (m.get("vs_base") or {}).get("by_rating_model") or {}
    return {"after_ratings": after, "status": result["status"],
            "checkpoint_id": result.get("checkpoint_id"), "message": result.get("message"),
            "swap_pause_ms": result.get("swap_pause_ms"),
            **{k: m[k] for k in keys if k in m},
            **({"win_rate_vs_base": by_model.get("win_rate"),
                "vs_base_seconds": by_model.get("seconds")} if by_model else {})}


# --- targets and aggregation (no model: tests/unit/test_bench_learn.py) -----------------------

def ratings_to_target(scores: list[int], window: int, target: float, *,
                      held: bool = False) -> int | None:
    """On the live ratings: the first n at which the mean of the last ``window`` ratings (all
    of them while fewer) reaches ``target``, counting from n = window (or the end, if shorter).

    ``held=True``: the first n from which that rolling mean stays at or above ``target``
    through the last rating. One lucky window of a 50/50 policy can reach a target once
    (a window of 20 binary ratings has a standard error of about 0.9 on the mean rating);
    holding it to the end of the run needs a policy that has really moved."""
    first = min(window, len(scores))
    means = [statistics.fmean(scores[max(0, n - window):n]) for n in range(first, len(scores) + 1)]
    return curve_to_target([(first + i, m) for i, m in enumerate(means)], target, held=held)


def curve_to_target(points: list[tuple[int, float]], target: float, *,
                    held: bool = False) -> int | None:
    """The ratings x of the first (x, value) point whose value reaches ``target``; with
    ``held``, the first point from which every later value stays at or above it."""
    if not held:
        return next((x for x, v in points if v >= target), None)
    reached = None
    for x, v in points:
        if v < target:
            reached = None
        elif reached is None:
            reached = x
    return reached


def aggregate(values: list[float | None]) -> dict:
    """A figure over seeds: mean, min and max of the seeds that have it (``n`` of them), and
    every seed's value."""
    got = [v for v in values if v is not None]
    return {"mean": statistics.fmean(got) if got else None, "min": min(got, default=None),
            "max": max(got, default=None), "n": len(got), "values": list(values)}


def aggregate_reach(values: list[int | None], never: int) -> dict:
    """Ratings to a target over seeds. The mean is only given when every seed reached it;
    ``bound`` counts a seed that never did as ``never`` (more than the run's ratings), so it
    is a lower bound of the true mean, and a method whose mean is below another's bound
    is faster whatever the missing seeds would have taken."""
    out = aggregate(values)
    if out["n"] < len(values):
        out["mean"] = None
    out["bound"] = statistics.fmean(never if v is None else v for v in values) if values else None
    return out


def mean_curve(curves: list[list[dict]], keys: tuple[str, ...] = POINT_KEYS) -> list[dict]:
    """Per-seed curves (points with ``ratings``) -> one curve of aggregates over seeds, and
    how many seeds ran each round in each mode."""
    out = []
    for x in sorted({p["ratings"] for c in curves for p in c}):
        points = [p for c in curves for p in c if p["ratings"] == x]
        row: dict[str, Any] = {"ratings": x, "seeds": len(points)}
        row.update({k: aggregate([p.get(k) for p in points]) for k in keys})
        modes = Counter(p["mode"] for p in points if p.get("mode"))
        row["modes"] = dict(modes) if modes else None
        out.append(row)
    return out


def value_at(curve: list[dict], n: int, key: str):
    """``key`` of the policy active after ``n`` ratings: the last point at or before n."""
    before = [p for p in curve if p["ratings"] <= n]
    return before[-1].get(key) if before else None


def ratio(new: float | None, old: float | None) -> float | None:
    return None if new is None or not old else new / old - 1


def summarize_method(runs: list[dict], plan: LearnPlan, base: dict) -> dict:
    """A method over seeds: the headline figures (mean, min, max), the probe curve and the
    windows as means over seeds, and the per-seed detail."""
    never = plan.ratings + 1

    def figure(fn: Callable[[dict], Any]) -> dict:
        return aggregate([fn(r) for r in runs])

    def mode_count(mode: str) -> Callable[[dict], Any]:
        return lambda r: None if r["modes"] is None else r["modes"].get(mode, 0)

    final = {key: figure(lambda r, key=key: r["final"][key]) for key in
             ("probe_mean_rating", "probe_preferred_share", "kl", "perplexity",
              "perplexity_preferred")}
    summary = {
        "ratings_to_target": aggregate_reach([r["ratings_to_target"] for r in runs], never),
        "ratings_to_target_held": aggregate_reach([r["ratings_to_target_held"] for r in runs],
                                                  never),
        "seconds_to_target_held": figure(lambda r: r["seconds_to_target_held"]),
        "window_ratings_to_target_held": aggregate_reach(
            [r["window_ratings_to_target_held"] for r in runs], never),
        **{f"final_{key}": value for key, value in final.items()},
        "perplexity_change": figure(lambda r: ratio(r["final"]["perplexity"],
                                                    base["perplexity"])),
        "perplexity_preferred_change": figure(lambda r: ratio(
            r["final"]["perplexity_preferred"], base.get("perplexity_preferred"))),
        "rating_model_consistency_last": figure(
            lambda r: value_at(r["curve"], plan.ratings, "rating_model_consistency")),
        "rounds_rollouts": figure(mode_count("rollouts")),
        "rounds_rated": figure(mode_count("rated")),
        "rounds_succeeded": figure(lambda r: r["rounds_succeeded"]),
        "rounds_rejected": figure(lambda r: r["rounds_rejected"]),
        "round_seconds": figure(lambda r: r["round_seconds"]),
        "swap_pause_ms_median": figure(lambda r: r["swap_pause_ms_median"]),
        "loop_seconds": figure(lambda r: r["loop_seconds"]),
        "probe_seconds": figure(lambda r: r["probe_seconds"]),
        "measure_seconds": figure(lambda r: r["measure_seconds"]),
    }
    return {"summary": summary, "curve": mean_curve([r["curve"] for r in runs]),
            "windows": mean_curve([r["windows"] for r in runs],
                                  ("mean_rating", "preferred_share", *POINT_KEYS[:5])),
            "seeds": runs}


def check_goals(report: dict) -> dict:
    """The goals for the default configuration (Reinf), on its means over seeds."""
    ppo = report["methods"].get("reinf")
    if ppo is None:
        return {}
    plan, runs, base = report["plan"], ppo["seeds"], report["base"]
    base_curve = report["base_curve"]
    enough = plan["ratings"] >= GOAL_RISE_BY
    at48 = aggregate([value_at(r["curve"], GOAL_RISE_BY, "probe_mean_rating") for r in runs]
                     if enough else [])
    rise = None if at48["mean"] is None else at48["mean"] - base_curve["probe_mean_rating"]
    enough_share = plan["ratings"] >= GOAL_SHARE_BY
    at96 = aggregate([value_at(r["curve"], GOAL_SHARE_BY, "probe_preferred_share")
                      for r in runs] if enough_share else [])
    ppl = ppo["summary"]["perplexity_preferred_change"]
    mine = ppo["summary"]["ratings_to_target_held"]
    others = {m: r["summary"]["ratings_to_target_held"] for m, r in report["methods"].items()
              if m != "reinf"}
    after48 = [next((x for x in r["rounds"] if x["after_ratings"] >= GOAL_SPEARMAN_AFTER), {})
               for r in runs]
    spearman = aggregate([x.get("rating_model_consistency") for x in after48])
    # what a perfect predictor of those ratings could score (ties: see spearman_ceiling)
    ceiling = aggregate([x.get("rating_model_consistency_ceiling") for x in after48])
    return {
        "rise_by_48": {"base_mean": base_curve["probe_mean_rating"], "mean_at_48": at48,
                       "rise": rise, "met": rise is not None and rise >= GOAL_RISE},
        "share_by_96": {"base_share": base_curve["probe_preferred_share"], "share_at_96": at96,
                        "met": at96["mean"] is not None and at96["mean"] >= GOAL_SHARE},
        "perplexity_preferred": {
            "base": base.get("perplexity_preferred"), "change": ppl,
            "overall_change": ppo["summary"]["perplexity_change"],
            "met": ppl["mean"] is not None and ppl["mean"] <= GOAL_PPL_PREFERRED},
        "fewer_ratings_than_baselines": {
            "reinf": mine["mean"], **{m: {"mean": v["mean"], "bound": v["bound"]}
                                      for m, v in others.items()},
            "met": bool(others) and mine["mean"] is not None
            and all(mine["mean"] < v["bound"] for v in others.values())},
        "rating_model_after_48": {
            "spearman": spearman, "ceiling": ceiling,
            "met": spearman["n"] == len(runs) and spearman["mean"] >= GOAL_SPEARMAN},
    }
