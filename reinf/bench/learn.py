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

**Best-of-n and the KTO sweep.** ``bestofn`` trains nothing: after each of Reinf's rounds on
a seed, the base model's best of ``best_of`` replies per probe prompt by the rating model
Reinf then serves (``reinf.bench.harness.run_bestofn``), so it runs after Reinf on each seed
and shares its points on the curve. ``kto`` runs once per learning rate of ``kto_lrs`` (one
method per rate in the report, ``kto@<rate>``, unless there is only one), and the goals take
the best of them (``reinf.bench.aggregate.best_kto``).

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

from reinf.bench.aggregate import (check_goals, is_kto, kto_key, kto_rate, lr_text,
                                   summarize_method)
from reinf.bench.harness import run_bestofn, run_method
from reinf.errors import BadInput

METHODS = {"reinf": "Reinf (default config)", "rated": "PPO on rated replies only",
           "sft": "reward-weighted SFT", "kto": "KTO (TRL)",
           "bestofn": "best-of-n at serve time (no training)"}
BASELINES = ("rated", "sft", "kto", "bestofn")
KTO_SWEEP = (5e-6, 1e-4, 1e-3)  # --kto-lr: TRL's recommended top, between, and PPO's 1e-3
BEST_OF = 4                     # --best-of: base-model replies per probe prompt


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
    methods: tuple[str, ...] = ("reinf", "rated", "sft", "kto", "bestofn")
    best_of: int = BEST_OF        # best-of-n: candidates per probe prompt
    kto_lrs: tuple[float, ...] = KTO_SWEEP  # KTO: one run per learning rate
    child: bool = False
    keep: bool = False
    prompts: str | None = None        # training prompts (.txt or .jsonl); None: built in
    probe_prompts: str | None = None  # probe prompts; None: the other side of the split
    pairs_every: int = 0          # every Nth interaction is a pair, not a rating; 0: never
    rewrite_every: int = 0        # every Nth reply rated 2 or below is rewritten; 0: never


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
                       fix="--baselines takes a comma list of rated, sft, kto and bestofn, "
                           "or none")
    if not plan.methods:
        raise BadInput("there is no method to run: Reinf is skipped and no baseline is named",
                       fix="name baselines with --baselines rated,sft,kto, or leave out "
                           "--skip-reinf")
    if "bestofn" in plan.methods and "reinf" not in plan.methods:
        raise BadInput("best-of-n reranks with Reinf's rating models, so Reinf must run too",
                       fix="leave bestofn out of --baselines, or leave out --skip-reinf")
    if plan.best_of < 2:
        raise BadInput(f"--best-of must be at least 2, got {plan.best_of} (best of 1 is the "
                       "base model)", fix="pass --best-of 4")
    if not plan.kto_lrs or any(not 0 < lr < 1 for lr in plan.kto_lrs) \
            or len({lr_text(lr) for lr in plan.kto_lrs}) < len(plan.kto_lrs):
        raise BadInput("--kto-lr takes distinct learning rates between 0 and 1, e.g. "
                       "5e-6,1e-4,1e-3", fix="pass --kto-lr 5e-6,1e-4,1e-3")
    if "kto" in plan.methods:
        from reinf.bench.baselines import check_trl
        check_trl()
    rater = load_rater(plan.rater, seed=plan.seed)
    if plan.rewrite_every < 0:
        raise BadInput("--rewrite-every must be 0 (no rewrites) or at least 1",
                       fix="pass --rewrite-every 2")
    if plan.rewrite_every and rater.rewrite is None:
        from reinf.bench.text_raters import REWRITERS
        raise BadInput(f"rater {rater.name} cannot rewrite a reply (an edit of the reply "
                       "cannot meet its rule), so --rewrite-every would do nothing",
                       fix="use a rater that can: " + ", ".join([*REWRITERS, "noisy-graded"]))
    if plan.rewrite_every and plan.methods != ("reinf",):
        raise BadInput("--rewrite-every measures Reinf alone: the baselines do not read "
                       "rewrites, so they would not be on the same footing",
                       fix="pass --baselines none")
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
    keys = run_keys(plan)
    runs: dict[str, list[dict]] = {m: [] for m in keys}
    for seed in seeds:
        for method in keys:
            if method == "bestofn":
                progress(f"[bestofn seed {seed}] {label_of(method, config, plan)}: after each "
                         "of Reinf's rounds, reranked by its rating model")
                runs[method].append(run_bestofn(config, plan, k, seed, shared, progress))
                continue
            progress(f"[{method} seed {seed}] {label_of(method, config, plan)}: {plan.ratings} "
                     + (f"interactions (a pair every {plan.pairs_every})"
                        if plan.pairs_every else "ratings") + f", a round every {k}"
                     + (f"; every {plan.rewrite_every} reply rated 2 or below rewritten"
                        if plan.rewrite_every else ""))
            runs[method].append(run_method(method, config, plan, k, seed, shared, progress))
    from reinf.bench.generation import machine
    methods = {m: {"label": label_of(m, config, plan), "settings": settings_of(m, config, plan),
                   **summarize_method(runs[m], plan, shared["base"])} for m in keys}
    if "bestofn" in methods:
        methods["bestofn"]["cost"] = shared["bestofn_candidates"].cost()
    report = {
        "benchmark": "learn", "rater": rater_record(rater, plan),
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


def rater_record(rater, plan: LearnPlan) -> dict:
    """The report's rater: unseen only if never used to choose a default, nor, in a run with
    rewrites, how rewrites are imitated (raters.REWRITE_TUNED_ON)."""
    from reinf.bench.raters import is_unseen

    rewrites = bool(plan.rewrite_every)
    return {"name": rater.name, "description": rater.description, "rewrites": rewrites,
            "unseen": rater.unseen and (not rewrites or is_unseen(rater.name, rewrites=True))}


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
    from reinf.bench.raters import is_unseen

    if rater.get("unseen"):
        why = "unseen (never used to choose a default)"
    elif rater.get("rewrites") and is_unseen(rater["name"]):
        why = ("its runs with rewrites were used to choose how rewrites are imitated "
               "(raters.REWRITE_TUNED_ON), so not an unseen rater with rewrites")
    else:
        why = "used to choose the defaults (raters.TUNED_ON), so not an unseen rater"
    lines.append(f"rater {rater['name']}: {why}")
    return "\n".join(lines)


def run_keys(plan: LearnPlan) -> list[str]:
    """The report's methods, in the order they run on each seed: ``kto`` becomes one run per
    learning rate (``kto@<rate>`` when there are several), and best-of-n comes after Reinf,
    whose rating models it reranks with."""
    keys = []
    for m in plan.methods:
        if m == "kto":
            keys += [kto_key(lr, len(plan.kto_lrs) > 1) for lr in plan.kto_lrs]
        elif m != "bestofn":
            keys.append(m)
    return keys + (["bestofn"] if "bestofn" in plan.methods else [])


def label_of(method: str, config, plan: LearnPlan | None = None) -> str:
    plan = plan or LearnPlan()
    if method == "reinf":
        return f"Reinf ({config.training.method})"
    if is_kto(method):
        return f"KTO (TRL), lr {lr_text(kto_rate(method, plan.kto_lrs))}"
    if method == "bestofn":
        return f"best-of-{plan.best_of}, no training"
    return METHODS[method]


def settings_of(method: str, config, plan: LearnPlan | None = None) -> dict:
    """What the method trains with, for the report (KTO's own settings: baselines.py);
    best-of-n: what it samples and scores with."""
    plan = plan or LearnPlan()
    if is_kto(method):
        from reinf.bench.baselines import kto_settings
        return kto_settings(config, kto_rate(method, plan.kto_lrs))
    if method == "bestofn":
        g, t = config.generation, config.training
        return {"n": plan.best_of, "model": "the base (no adapter)",
                "score": f"mean - {t.pessimism} x std (training.pessimism)",
                "trusted_from_spearman": t.min_consistency, "temperature": g.temperature,
                "top_p": g.top_p, "max_new_tokens": g.max_new_tokens}
    p = config.ppo
    out = {"learning_rate": p.learning_rate, "batch_size": p.batch_size, "epochs": p.ppo_epochs}
    if method in ("reinf", "rated"):
        out["training_method"] = "rated" if method == "rated" else config.training.method
        out["kl_loss_coef"] = 0.0 if method == "rated" else p.kl_loss_coef
        out["advantage"] = "gae" if method == "rated" else p.advantage
    return out


# --- one comparison from several runs (--merge) --------------------------------------------

# What must match for runs to be one comparison: the same rater, schedule and probe (so the
# same streams and probe replies), the same model and Reinf configuration.
MERGE_SAME = ("ratings", "train_after", "window", "target", "probe", "final_probe", "heldout",
              "pairs_every", "rewrite_every", "prompts", "probe_prompts")


def merge_reports(reports: list[tuple[str, dict]]) -> dict:
    """One report from the ``--json`` reports of runs that split one comparison over
    processes or machines (``--seed S --seeds 1``, ``--skip-reinf --baselines ...``,
    ``--kto-lr LR``): every method's seeds pooled, its figures and the goals taken again.
    ``reports`` are (name, report) pairs, the name for errors. Refuses runs that are not one
    comparison (another rater, schedule, probe, model, base or Reinf configuration) and a
    method's seed given twice."""
    if not reports:
        raise BadInput("--merge needs at least one report", fix="pass --merge FILE.json")
    for name, r in reports:
        if not isinstance(r, dict) or r.get("benchmark") != "learn" or "methods" not in r:
            raise BadInput(f"{name} is not a report of `reinf bench learn --json`",
                           fix="pass the JSON that `reinf bench learn --json` printed")
    first_name, first = reports[0]

    def differ(what: str, get: Callable[[dict], Any]) -> None:
        for name, r in reports[1:]:
            if get(r) != get(first):
                raise BadInput(f"{name} and {first_name} are not one comparison: their {what} "
                               f"differ ({get(r)!r} against {get(first)!r})",
                               fix="merge only runs of the same command but for --seed, "
                                   "--seeds, --baselines, --kto-lr and --skip-reinf")

    differ("raters", lambda r: r["rater"]["name"])
    for key in MERGE_SAME:
        differ(f"--{key.replace('_', '-')}", lambda r, key=key: r["plan"].get(key))
    differ("models' sizes", lambda r: r["model"].get("parameters"))
    differ("configurations", lambda r: r["config"])
    differ("base models' probe means",
           lambda r: (round(r["base"]["probe_mean_rating"], 6),
                      round(r["base_curve"]["probe_mean_rating"], 6)))
    # KTO alone in a report is "kto"; beside other rates it is "kto@<rate>"
    rates = sorted({kto_rate(m, r["plan"]["kto_lrs"]) for _, r in reports
                    for m in r["methods"] if is_kto(m)})
    runs: dict[str, list[dict]] = {}
    about: dict[str, dict] = {}
    sources: dict[tuple[str, int], str] = {}
    for name, r in reports:
        for m, entry in r["methods"].items():
            key = kto_key(kto_rate(m, r["plan"]["kto_lrs"]), len(rates) > 1) if is_kto(m) else m
            about.setdefault(key, {k: v for k, v in entry.items()
                                   if k in ("label", "settings", "cost")})
            for run in entry["seeds"]:
                if (key, run["seed"]) in sources:
                    raise BadInput(f"seed {run['seed']} of {key} is in both "
                                   f"{sources[key, run['seed']]} and {name}",
                                   fix="merge each method's seed once")
                sources[key, run["seed"]] = name
                runs.setdefault(key, []).append(run)
    order = ["reinf", "rated", "sft", *(kto_key(lr, len(rates) > 1) for lr in rates), "bestofn"]
    keys = [k for k in order if k in runs] + [k for k in runs if k not in order]
    seeds = sorted({run["seed"] for rs in runs.values() for run in rs})
    plan_dict = {**first["plan"], "seed": seeds[0], "seeds": len(seeds), "kto_lrs": rates
                 or first["plan"]["kto_lrs"], "methods": [m for m in keys if not is_kto(m)]
                 + (["kto"] if rates else [])}
    plan = LearnPlan(**{k: v for k, v in plan_dict.items()
                        if k in LearnPlan.__dataclass_fields__ and k not in ("methods",
                                                                             "kto_lrs")})
    methods = {m: {**about[m], **summarize_method(sorted(runs[m], key=lambda x: x["seed"]),
                                                   plan, first["base"])} for m in keys}
    machines = list(dict.fromkeys(r["machine"] for _, r in reports))
    report = {**first, "plan": plan_dict, "seeds": seeds, "machine": "; ".join(machines),
              "methods": methods, "seconds": sum(r["seconds"] for _, r in reports),
              "merged_from": [name for name, _ in reports]}
    report.pop("plot", None)
    report["goals"] = check_goals(report)
    return report
