"""``reinf bench learn``: does rating really teach it, and how fast?

The whole loop runs with a simulated rater (``reinf.bench.raters``), through the daemon's code:
``ChatService`` + ``Engine`` generate and store each turn, ``Store.rate`` records the
rating, ``reinf.daemon.scheduler.run_job`` runs a round as soon as ``train_after`` new ratings
wait (the daemon's ratings trigger, ``min_waiting``), the round is the daemon's
(``reinf.training.child.run_once`` -> ``reinf.training.trainer.train_round``, promotion gate
included) and a promoted checkpoint is hot-swapped with ``engine.request_swap``, as
``Daemon._adopt`` does. Two differences from ``reinf serve``, both for speed and determinism:
the round runs in this process (``--child`` runs it in the daemon's child process,
``reinf.daemon.worker.ChildRunner``), and the chat waits for it (in the daemon, replies keep
coming from the old adapter meanwhile).

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

**The modules.** This one holds the plan (``LearnPlan``), the entry (``run_learn``: checks,
prompts, every method on every seed, the report) and the prompt lines of the text report;
``reinf.bench.harness`` runs one method on one seed (the loop, the probe after every round,
pairs); ``reinf.bench.aggregate`` reads targets off the runs and takes them over seeds (means,
min-max, the goals); ``reinf.bench.plot`` shows the report.
"""
from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from reinf.bench.aggregate import check_goals, summarize_method
from reinf.bench.harness import run_method
from reinf.errors import BadInput

METHODS = {"reinf": "Reinf (default config)", "rated": "PPO on rated replies only",
           "sft": "reward-weighted SFT", "kto": "KTO (TRL)"}
BASELINES = ("rated", "sft", "kto")


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
