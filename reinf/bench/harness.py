"""``reinf bench learn``'s harness: one method on one seed's stream, through the daemon's code.

``run_method`` is the loop of one run (``reinf.bench.learn.run_learn`` runs it for every method
and seed): in a temporary data directory of its own (``build_context``), ``ChatService`` and
``Engine`` generate and store each turn (the messages before the next round in one batch,
``ChatService.send_many``, sized by ``before_round``: the model can't change in between), the
simulated rater's score is stored with
``Store.rate``, ``reinf.daemon.scheduler.run_job`` trains as soon as ``train_after`` new
ratings wait, through ``InlineRunner`` (``run_once`` in this process) or the daemon's
``ChildRunner`` (``--child``) or a baseline's runner (``reinf.bench.baselines``), and
``adopt`` hot-swaps a promoted checkpoint in, as ``Daemon._adopt`` does. After every round
the ``Probe`` measures the active checkpoint. What it returns is the per-seed detail of the
report; ``reinf.bench.aggregate`` takes it over seeds.

**The probe curve.** After every round, the active checkpoint answers the first ``probe`` of
the probe prompts in their fixed order (repeated in order when there are fewer; sampled in
blocks of 16, 64 on a GPU, block b with seed ``PROBE_SEED + b``: the same for every round, method and
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
**Rewrites** (``rewrite_every`` N, ``--rewrite-every``): of the replies the simulated person
rates 2 or below, every Nth is also rewritten (``give_rewrite``): the rater's ``rewrite``, an
edit of the model's reply toward its rule (reinf.bench.text_raters.REWRITERS), stored with
``Store.rewrite`` as a person's would be. The x axis still counts ratings; the report says
how many rewrites were written.
**Best-of-n** (``run_bestofn``) trains nothing: it reads Reinf's run on the same seed. After
each of Reinf's rounds, ``run_method`` keeps the rating model of the checkpoint Reinf then
serves (``served_rating_model``); best-of-n's point after that round is the base model's
best of ``best_of`` replies to each probe prompt by that rating model
(``reinf.bench.baselines.choose_best``), rated by a judge seeded as the probe's.
"""
from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from reinf.bench.aggregate import curve_to_target, is_kto, kto_rate, ratings_to_target, value_at

if TYPE_CHECKING:  # for the annotations only: reinf.bench.learn imports this module
    from reinf.bench.learn import LearnPlan

PROBE_SEED = 1_000_003      # probe prompts, sampling seeds, judge: fixed across rounds and runs
PAIR_SEED = 50_000          # a pair's second reply: its sampling seed is the first's + this
REWRITE_AT_MOST = 2         # --rewrite-every counts the replies rated this or below


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


def bench_home(config, name: str, **overrides) -> tuple[Path, Any]:
    """A temporary data directory of a run's own and its config: ``config`` with
    ``overrides``, no timer rounds, the named model linked in. The config is written to
    the directory's config.yaml, so a child trainer (--child) sees these settings, and read
    back from it."""
    from reinf.config import load_config, render_yaml

    home = Path(tempfile.mkdtemp(prefix=f"reinf-bench-{name}-"))
    link_pulled_model(config, home)
    cfg = config.replace(data_dir=str(home), db_url=None, train_interval_minutes=0.0,
                         **overrides)
    (home / "config.yaml").write_text(render_yaml(cfg), encoding="utf-8")
    return home, load_config(home / "config.yaml", environ={"REINF_HOME": str(home)})


def build_context(method: str, config, plan: LearnPlan, k: int) -> Context:
    from reinf.catalog import NO_STYLE_LEARNING
    from reinf.serving.chat import ChatService
    from reinf.serving.engine import Engine
    from reinf.storage.store import Store

    # the first version's method: rated replies only, GAE with the value head, the KL
    # penalty in the return only, every reply served as asked (no style learning)
    extra = {"training_method": "rated", "kl_loss_coef": 0.0, "advantage": "gae",
             **NO_STYLE_LEARNING} if method == "rated" else {}
    home, cfg = bench_home(config, method, train_after_ratings=k, **extra)
    store = Store.open(cfg)
    engine = Engine.load(cfg)
    if method == "bestofn":
        runner = None                  # best-of-n trains nothing
    elif method not in ("reinf", "rated"):
        from reinf.bench.baselines import BaselineRunner
        runner = BaselineRunner("kto" if is_kto(method) else method, cfg, store,
                                learning_rate=kto_rate(method, plan.kto_lrs)
                                if is_kto(method) else None)
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
    """ChildRunner's interface in this process: ``reinf.training.child.run_once`` under the train
    lock, its JSON result read back by the daemon's own ``reinf.daemon.worker.interpret``."""

    def __init__(self, config, store):
        self.config, self.store, self.pid = config, store, None

    def run(self, trigger: str, *, force: bool = False):
        from reinf.daemon.lock import acquire_train_lock
        from reinf.training.child import run_once
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


def explored_styles(asked: list[str | None], scores: list[float]) -> dict[str, Any]:
    """The rated replies served in a style (generation.explore_styles): how many, their mean
    rating against the plain replies', and by style ``[count, mean rating]``, most asked
    first. ``asked`` and ``scores`` run in step (a pair's entry is None: no style)."""
    by_style: dict[str, list[float]] = {}
    plain = []
    for style, score in zip(asked, scores):
        (by_style.setdefault(style, []) if style else plain).append(score)
    styled = [score for scores_of in by_style.values() for score in scores_of]
    return {"styled": len(styled), "styled_mean": statistics.fmean(styled),
            "plain_mean": statistics.fmean(plain) if plain else None,
            "by_style": {style: [len(v), round(statistics.fmean(v), 2)] for style, v in
                         sorted(by_style.items(), key=lambda kv: (-len(kv[1]), kv[0]))}}


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
            shared["base"] = probe.measure(max(plan.probe, plan.final_probe), general=True)
            # the same passages on the same model: the base's general text is measured once
            shared["base_curve"] = {**probe.measure(plan.probe), "perplexity_general":
                                    shared["base"].get("perplexity_general")}
            progress(f"base model: probe mean {shared['base_curve']['probe_mean_rating']:.2f}, "
                     f"preferred {shared['base_curve']['probe_preferred_share']:.0%} "
                     f"({plan.probe} replies)")
        curve = [{"ratings": 0, "seconds": 0.0, **shared["base_curve"]}]
        windows = [{"ratings": 0, **shared["base_curve"]}]

        def round_fn(trigger: str, force: bool) -> dict:
            return adopt(ctx, ctx.runner.run(trigger, force=force))

        # what best-of-n reranks with: the rating model Reinf serves after each round
        served = [{"ratings": 0, "checkpoint_id": None, "state": None}]
        keep_served = method == "reinf" and "bestofn" in plan.methods
        scores, preferred, loop = [], [], 0.0
        disliked = wrote = 0  # replies rated REWRITE_AT_MOST or below; rewrites written
        picks: Counter = Counter()
        asked: list[str | None] = []  # each rated reply's style (explore_styles), or None
        last_round = 0
        stream = shared["prompt_plan"].streams[seed]
        ready: list = []  # turns sampled ahead, up to the next round (see before_round)
        for i, prompt in enumerate(stream):
            n = i + 1
            t0 = time.perf_counter()
            if plan.pairs_every and n % plan.pairs_every == 0:
                score, good, outcome = give_pair(ctx, rater, prompt, seed * 100_003 + i)
                picks[outcome] += 1
                asked.append(None)
            else:
                if not ready:  # the model can't change before the next round: one batch
                    size = before_round(ctx, plan, k, n, last_round)
                    ready = ctx.chat.send_many(list(stream[i:i + size]),
                                               seed=seed * 100_003 + i)
                turn = ready.pop(0)
                asked.append(turn.style)
                score = rater(prompt, turn.reply)
                ctx.store.rate(turn.id, score)
                good = rater.is_preferred(turn.reply, score, prompt=prompt)
                if plan.rewrite_every and score <= REWRITE_AT_MOST:
                    disliked += 1
                    if disliked % plan.rewrite_every == 0:
                        wrote += give_rewrite(ctx, rater, prompt, turn)
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
                point = probe.measure(plan.probe, general=True)
                if keep_served:
                    served.append(served_rating_model(ctx, n, served[-1]))
                curve.append({"ratings": n, "seconds": loop, "status": rnd["status"],
                              "mode": rnd.get("mode"), "rating_model_consistency":
                                  rnd.get("rating_model_consistency"), **point})
                progress(f"{tag} round after {n}: {rnd['status']}"
                         f"{' (' + rnd['mode'] + ')' if rnd.get('mode') else ''} in "
                         f"{rnd['wall_seconds']:.1f} s; probe mean {point['probe_mean_rating']:.2f}"
                         f", preferred {point['probe_preferred_share']:.0%}, KL {point['kl']:.4f}"
                         + general_change(point, shared["base"]))
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
        final = probe.measure(max(plan.probe, plan.final_probe), general=True)
        progress(f"{tag} final: probe mean {final['probe_mean_rating']:.2f} (base "
                 f"{shared['base']['probe_mean_rating']:.2f}, {final['probe']} replies)"
                 + general_change(final, shared["base"], label="; general-text perplexity"))
        if keep_served:
            shared.setdefault("served_rating_models", {})[seed] = served
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
            "rewrites": wrote if plan.rewrite_every else None,
            "explored": explored_styles(asked, scores) if any(asked) else None,
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


def served_rating_model(ctx: Context, n: int, last: dict) -> dict:
    """The rating model of the checkpoint Reinf serves after ``n`` ratings (what compare's
    predicted scores read): ``rating_model.safetensors`` of the active checkpoint, None when
    it has none (the base, a round with no rating model). A rejected round leaves the
    previous checkpoint, and its rating model, in place."""
    from reinf.training.checkpoints import load_rating_model

    active = ctx.store.active_checkpoint()
    cid = active.id if active else None
    if cid == last["checkpoint_id"]:
        return {**last, "ratings": n}
    return {"ratings": n, "checkpoint_id": cid,
            "state": load_rating_model(Path(active.path)) if active else None}


def base_perplexities(base: dict) -> dict:
    """Best-of-n's perplexities: the base model's, since it serves the base."""
    return {key: base.get(key) for key in
            ("perplexity", "perplexity_preferred", "perplexity_general")}


def run_bestofn(config, plan: LearnPlan, k: int, seed: int, shared: dict,
                progress: Callable[[str], None]) -> dict:
    """Best-of-n at serve time on one seed: at each point of Reinf's probe curve on this
    seed, the base model's best of ``plan.best_of`` replies to each probe prompt by the
    rating model Reinf serves there (``run_method`` kept them), rated by the probe's judge.
    Returns the per-seed detail in ``run_method``'s shape; no training, so no rounds, KL,
    live ratings or loop time (the model is the base: its perplexity is the base's)."""
    import shutil

    from reinf.bench.baselines import choose_best, sample_candidates
    from reinf.bench.raters import load_rater

    served = (shared.get("served_rating_models") or {}).get(seed)
    if served is None:
        raise RuntimeError("best-of-n reranks with Reinf's rating models: Reinf must run on "
                           f"seed {seed} first")
    count = max(plan.probe, plan.final_probe)
    tag = f"[bestofn seed {seed}]"
    if "bestofn_candidates" not in shared:
        # The base model and the probe's seeds are fixed: the candidates are the same for
        # every seed and round, so they are sampled (and their cost paid) once per run.
        ctx = build_context("bestofn", config, plan, k)
        try:
            shared["bestofn_candidates"] = sample_candidates(
                ctx.engine, shared["probe_prompts"], plan.best_of, count, seed=PROBE_SEED,
                progress=progress)
        finally:
            ctx.store.close()
            if not plan.keep:
                shutil.rmtree(ctx.home, ignore_errors=True)
    candidates = shared["bestofn_candidates"]
    base = shared["base"]
    t = config.training
    curve = [{"ratings": 0, "seconds": None, **shared["base_curve"]}]
    rounds, finals = [], None
    for entry in served[1:]:
        started = time.perf_counter()
        choice = choose_best(entry["state"], candidates, pessimism=t.pessimism,
                             min_consistency=t.min_consistency)
        judge = load_rater(plan.rater, seed=PROBE_SEED)   # reply j: the judge's j-th call
        rated = []
        for j, c in enumerate(choice.chosen):
            reply = candidates.replies[j][c]
            score = judge(reply.prompt, reply.text)
            rated.append((score, judge.is_preferred(reply.text, score, prompt=reply.prompt)))
        finals = (rated, choice)
        probe = rated[:plan.probe]
        mode = "reranked" if choice.reranked else "first sample"
        predicted = choice.predicted[:plan.probe] if choice.predicted else None
        point = {
            "ratings": entry["ratings"], "seconds": None, "status": "succeeded", "mode": mode,
            "rating_model_consistency": choice.consistency,
            "probe_mean_rating": statistics.fmean(s for s, _ in probe),
            "probe_preferred_share": statistics.fmean(g for _, g in probe),
            "kl": None, **base_perplexities(base), "probe": len(probe),
            "active_checkpoint": None, "rating_model_checkpoint": entry["checkpoint_id"],
            "chosen": choice.chosen[:plan.probe],
            "candidates_predicted": [[None if v is None else round(v, 4) for v in row]
                                     for row in predicted] if predicted else None,
            "chosen_not_first_share": statistics.fmean(c != 0 for c in choice.chosen[:plan.probe])}
        if predicted:
            point["predicted_chosen_mean"] = statistics.fmean(
                row[c] for row, c in zip(predicted, point["chosen"]) if row[c] is not None)
            point["predicted_first_mean"] = statistics.fmean(
                row[0] for row in predicted if row[0] is not None)
        curve.append(point)
        rounds.append({"after_ratings": entry["ratings"], "status": "succeeded", "mode": mode,
                       "rating_model_checkpoint": entry["checkpoint_id"],
                       "rating_model_consistency": choice.consistency,
                       "wall_seconds": time.perf_counter() - started})
        progress(f"{tag} after {entry['ratings']}: {mode}"
                 + (f" by {entry['checkpoint_id']}'s rating model (Spearman "
                    f"{choice.consistency:.2f}), {point['chosen_not_first_share']:.0%} not the "
                    "first sample" if choice.reranked else "") +
                 f"; probe mean {point['probe_mean_rating']:.2f}, preferred "
                 f"{point['probe_preferred_share']:.0%}")
    if finals is None:  # no round: the first sample of every probe prompt, i.e. the base
        final = dict(base)
    else:
        rated, choice = finals
        final = {"probe_mean_rating": statistics.fmean(s for s, _ in rated),
                 "probe_preferred_share": statistics.fmean(g for _, g in rated),
                 "kl": None, **base_perplexities(base), "probe": len(rated),
                 "active_checkpoint": None, "reranked": choice.reranked}
    ends = sorted({n for n in range(1, plan.ratings + 1)
                   if n % plan.window == 0 or n == plan.ratings})
    windows = [{"ratings": 0, **shared["base_curve"]}] + [
        {"ratings": n, "mean_rating": None, "preferred_share": None, "kl": None,
         **base_perplexities(base),
         **{key: value_at(curve, n, key) for key in ("probe_mean_rating",
                                                     "probe_preferred_share")}}
        for n in ends]
    points = [(p["ratings"], p["probe_mean_rating"]) for p in curve]
    modes = Counter(r["mode"] for r in rounds)
    return {
        "seed": seed, "curve": curve, "windows": windows, "final": final, "rounds": rounds,
        "modes": None, "bestofn": {"n": plan.best_of, "points": dict(modes)},
        "ratings_to_target": curve_to_target(points, plan.target), "seconds_to_target": None,
        "ratings_to_target_held": curve_to_target(points, plan.target, held=True),
        "seconds_to_target_held": None, "window_ratings_to_target_held": None,
        "scores": [], "preferred": [], "pairs": None, "loop_seconds": None,
        "probe_seconds": None, "measure_seconds": None, "round_seconds": None,
        "rounds_succeeded": None, "rounds_rejected": None, "rounds_failed": None,
        "swap_pause_ms_median": None, "data_dir": None,
    }


def before_round(ctx: Context, plan: LearnPlan, k: int, n: int, last_round: int) -> int:
    """How many interactions from the nth on are ratings that come before the next round (at
    least 1): a round runs once ``k`` ratings wait, or, with pairs, after every ``k``
    interactions; a pair (every ``pairs_every``th interaction) ends the stretch too. Their
    replies can be sampled in one batch: they are the replies one-at-a-time sending would
    draw from the same checkpoint (from another random stream)."""
    if not plan.pairs_every:
        return max(1, k - ctx.store.ratings_waiting())
    next_pair = (n // plan.pairs_every + 1) * plan.pairs_every
    return max(1, min(next_pair - n, last_round + k - n + 1))


def give_rewrite(ctx: Context, rater, prompt: str, turn) -> int:
    """The simulated person writes the reply it wanted (``rater.rewrite``: an edit of the
    model's reply toward its rule) and stores it as a rewrite; 1 when it did, 0 when the
    edit cannot meet its rule or changes nothing."""
    text = rater.rewrite(prompt, turn.reply)
    if not text or not text.strip() or text == turn.reply:
        return 0
    ctx.store.rewrite(turn.id, text)
    return 1


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
    the general-text passages, the probe prompts (the plan's, in their fixed order, repeated
    to the size needed), and the model's name."""
    from reinf.bench.probe import load_general_text, load_heldout
    from reinf.bench.prompts import repeat_to
    from reinf.bench.raters import load_rater

    heldout = load_heldout(ctx.engine.tokenizer, plan.heldout)
    shared["general"] = load_general_text(ctx.engine.tokenizer)
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
    prompts, 64 on a GPU, with seed ``PROBE_SEED + b``, so reply j is the same for every
    probe size) and
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

    def measure(self, n: int, *, general: bool = False) -> dict:
        """The figures of the active checkpoint on the first ``n`` probe prompts; with
        ``general`` (the base, each round and the final measure), its general-text
        perplexity too (a measure with it answers one without)."""
        active = self.ctx.store.active_checkpoint()
        entry = self.cache.setdefault(active.id if active else None, {})
        if not entry:
            from reinf.bench.raters import load_rater
            entry.update(judge=load_rater(self.plan.rater, seed=PROBE_SEED), replies=[],
                         results={})
        if not general and (n, True) in entry["results"]:
            return dict(entry["results"][n, True])
        if (n, general) not in entry["results"]:
            entry["results"][n, general] = self._measure(active, entry, n, general)
        return dict(entry["results"][n, general])

    def _measure(self, active, entry: dict, n: int, general: bool) -> dict:
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
                           batch_size=self.ctx.config.ppo.batch_size * 2,
                           general=self.shared["general"] if general else None)
        self.measure_seconds += time.perf_counter() - measured
        shared = self.shared
        return {"probe_mean_rating": statistics.fmean(s for _, s, _ in probe),
                "probe_preferred_share": statistics.fmean(g for _, _, g in probe),
                # the highest mean any model could get on these prompts (the rater's best)
                "probe_best": statistics.fmean(judge.best_score(r.prompt) for r, _, _ in probe),
                "kl": m["kl"], "perplexity": m["perplexity"], "probe": len(probe),
                "perplexity_general": m.get("perplexity_general"),
                "perplexity_preferred": subset_perplexity(
                    m["heldout_nll"], m["heldout_tokens"], shared["heldout_preferred"]),
                "active_checkpoint": active.id if active else None,
                "consistency_probe": spearman(m["probe_values"],
                                              [s for r, s, _ in probe if r.reply_ids]),
                "consistency_heldout": spearman(m["heldout_values"], shared["heldout_scores"])}


def general_change(point: dict, base: dict, label: str = ", general text") -> str:
    """``point``'s general-text perplexity against the base's, for a progress line ("" if
    either was not measured)."""
    general, before = point.get("perplexity_general"), base.get("perplexity_general")
    if not (general and before):
        return ""
    return f"{label} {general:.2f} ({general / before - 1:+.1%})"


def summarize_round(result: dict, after: int) -> dict:
    m = result.get("metrics") or {}
    keys = ("kl", "approx_kl", "kl_coef", "reward_mean", "samples", "steps", "epochs_run", "loss",
            "explained_variance", "clipfrac", "seconds", "mode", "mode_reason",
            "rating_model_consistency", "rating_model_consistency_ceiling", "rollouts",
            "predicted_score_mean", "rollout_seconds",
            "fluency_change", "staleness", "advantage", "rating_model_pairs",
            "rating_model_pair_accuracy", "rating_model_pair_accuracy_ratings_only",
            "rewrites", "rewrites_imitated", "rated_imitated", "explored_imitated",
            "imitation_loss", "anchor_kl", "anchor_cosine", "reply_grad_norm",
            "anchor_grad_norm", "clipped", "grad_norm", "drift", "drift_scale", "drift_after",
            "drift_tries", "drift_seconds",
            "imitation_target", "imitation_active", "rating_model_rewrites",
            "styled_rollouts", "styled_score_gain", "style_counts", "styled_imitated",
            "style_lifts", "styled_style", "imitated_joined")
    by_model = (m.get("vs_base") or {}).get("by_rating_model") or {}
    return {"after_ratings": after, "status": result["status"],
            "checkpoint_id": result.get("checkpoint_id"), "message": result.get("message"),
            "swap_pause_ms": result.get("swap_pause_ms"),
            **{k: m[k] for k in keys if k in m},
            **({"win_rate_vs_base": by_model.get("win_rate"),
                "vs_base_seconds": by_model.get("seconds")} if by_model else {})}
