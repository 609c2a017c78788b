"""``reinf bench speed``: how fast the loop is, as ratios measured in one run.

For each model (``demo``: the configured model; ``0.5b``: a randomly initialised model of
Qwen2.5-0.5B's shape, saved to a temporary directory so the trainer child can load it; or
any other ``model_path``: a local directory or hub id, any causal LM Reinf can serve), a
fresh process (``python -m reinf.bench.speed``, so peak memory is that model's own) measures:

1. generation: time to first token and tokens/s of the engine against a bare
   ``model.generate`` on the same prompts; the trainer's batched rollout sampler
   (``sample_rollouts``, ``training.rollout_batch_size`` replies at once) in tokens/s against
   the engine's single stream; and the adapter swap pause
   (``reinf.bench.generation.measure_generation``); then the process's peak RSS = **serving**;
2. the chat while a real training round runs: ``rated turns`` replies are generated and
   rated in a temporary data directory, then the daemon's ``ChildRunner`` trains on them
   (niced, ``train_threads``) while this process keeps generating replies; their time to
   first token and tokens/s are compared with the same replies on an idle machine. Only
   replies that ran entirely inside the round's update phase count (the phase's end is the
   run's ``finished_at``, its start ``update_seconds`` before);
3. the PPO round against bare LoRA forward+backward on the same tokens
   (``reinf.bench.training.measure_round``);
4. the daemon path, at the default settings (``measure_rating_to_answer``): in a fresh data
   directory a ``Daemon`` (scheduler, ``ChildRunner``, hot-swap) serves this process's
   engine; ``train_after_ratings`` chat replies are generated and rated one by one, as a
   person would (a rater graded by reply length, so the ratings spread); the last rating
   starts the round, and the time runs until a reply from the new checkpoint has come back.
   The child is the trainer's own ``main`` with a clock on its stages
   (``reinf.bench.roundchild``), so the round is also split into rating model, rollouts,
   scoring, PPO update, gate and checkpoint. The peak RSS of the trainer children (this
   round's and item 2's) = **training**;
5. one chat reply at ``max_new_tokens`` (``reinf.bench.llamacpp.measure_chat_reply``): the
   engine on a freshly loaded model, as a new server serves it, against llama.cpp on the same
   GGUF with the same threads when llama-cpp-python is installed (the ``llamacpp`` extra) and
   the model is a named one pulled from a GGUF; else that row says why it was skipped.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timezone
from pathlib import Path
from typing import Any

MODELS = ("demo", "0.5b")  # named models; anything else is a model_path
LARGE_PARAMETERS = 100_000_000  # a model_path this big gets turns_large rated turns
PAUSE_SECONDS = 0.1  # between replies while the round runs: a person reads; the trainer runs
DEFAULT_RATINGS = 8  # the daemon path's ratings where train_after_ratings is 0 (off)


def peak_rss(who: int = resource.RUSAGE_SELF) -> int:
    """Peak resident set size in bytes (Linux reports KiB, macOS bytes)."""
    value = resource.getrusage(who).ru_maxrss
    return value if sys.platform == "darwin" else value * 1024


def run_speed(config, models: list[str], *, turns: int = 64, turns_large: int = 8,
              quick: bool = False, threads: int | None = None) -> dict[str, Any]:
    """Measure each model in its own child process; returns the report (JSON-ready).

    ``models``: ``demo``, ``0.5b`` or model paths (see the module docstring). A model path
    gets ``turns`` rated turns, or ``turns_large`` from ``LARGE_PARAMETERS`` parameters on.
    """
    from reinf.catalog import resolve_model_path
    from reinf.errors import BadInput, ReinfError
    from reinf.model.modeling import check_model_path

    if not models:
        raise BadInput("no model to measure", fix="use --models demo,0.5b or --model PATH")
    for name in models:  # a missing directory fails here, before any child starts
        if name not in MODELS:
            check_model_path(resolve_model_path(config.replace(model_path=name)), config)
    results = []
    for name in models:
        argv = [sys.executable, "-m", "reinf.bench.speed", "--model", name, "--json",
                "--turns", str(turns_large if name == "0.5b" else turns),
                "--turns-large", str(turns_large)]
        argv += ["--quick"] * quick + (["--threads", str(threads)] if threads else [])
        argv += ["--config", config.source] if config.source else []
        env = dict(os.environ, HF_HUB_DISABLE_PROGRESS_BARS="1", REINF_HOME=str(config.data_dir))
        print(f"[speed] {name}: measuring in a child process…", file=sys.stderr, flush=True)
        proc = subprocess.run(argv, stdout=subprocess.PIPE, text=True, env=env)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            raise ReinfError(f"bench speed on {name} failed (exit code {proc.returncode})",
                             fix="run `python -m reinf.bench.speed --model " + name +
                                 "` to see the error")
        results.append(json.loads(lines[-1]))
    from reinf.bench.generation import machine
    return {"benchmark": "speed", "machine": machine(), "quick": quick, "models": results}


def measure_model(config, name: str, *, turns: int, quick: bool,
                  turns_large: int | None = None) -> dict[str, Any]:
    """Everything for one model, in this process (see the module docstring): ``demo``,
    ``0.5b`` or a model path. A model path of ``LARGE_PARAMETERS`` or more gets
    ``turns_large`` rated turns (when given) instead of ``turns``."""
    from reinf.catalog import resolve_model_path
    from reinf.model.modeling import load_model
    from reinf.bench.generation import machine, measure_generation
    from reinf.bench.training import measure_round

    say = lambda text: print(f"[speed] {name}: {text}", file=sys.stderr, flush=True)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="reinf-speed-") as tmp:
        cfg = config
        if name == "0.5b":
            say("building a random Qwen2.5-0.5B-shaped model…")
            cfg = config.replace(model_path=save_shaped_model(config, Path(tmp) / "model"))
        elif name not in MODELS:
            # Absolute, so the trainer child finds it from its own data directory's config.
            cfg = config.replace(model_path=resolve_model_path(config.replace(model_path=name)))
        loaded = load_model(cfg)
        parameters = sum(p.numel() for p in loaded.model.parameters())
        if name not in MODELS and turns_large and parameters >= LARGE_PARAMETERS:
            turns = turns_large
        say("generation, batched sampling and swap pause…")
        gen = measure_generation(loaded, config=cfg, max_new_tokens=16 if quick else 32,
                                 repeats=1 if quick else 2, swaps=2 if quick else 3,
                                 rollout_batch=cfg.training.rollout_batch_size,
                                 rollouts_per_prompt=cfg.training.rollouts_per_prompt)
        rss_serving = peak_rss()
        # Each stage's figures as soon as they exist, so a run cut short still reports them.
        say(f"engine {gen['engine']['tokens_per_s']:.1f} tokens/s (first token "
            f"{gen['engine']['ttft_ms']:.0f} ms), model.generate "
            f"{gen['generate']['tokens_per_s']:.1f} tokens/s"
            + (f"; batched sampling {gen['rollouts']['tokens_per_s']:.1f} tokens/s"
               if (gen.get("rollouts") or {}).get("tokens_per_s") is not None else ""))
        say(f"chat during a training round on {turns} rated turns…")
        chat = measure_chat_during_round(cfg, loaded, Path(tmp) / "home", turns,
                                         new_tokens=8 if quick else 16,
                                         idle=4 if quick else 8)
        ratio = chat.get("ratio_tokens_per_s")
        say(f"chat tokens/s while training / idle: {'-' if ratio is None else f'{ratio:.2f}'}; "
            f"PPO round on {turns} turns against bare LoRA forward+backward…")
        round_ = measure_round(cfg.replace(data_dir=str(Path(tmp) / "home")), n_samples=turns)
        say(f"PPO round {round_['seconds_round']:.2f} s, bare forward+backward "
            f"{round_['seconds_bare_fwd_bwd']:.2f} s")
        ratings = cfg.schedule.train_after_ratings or DEFAULT_RATINGS
        say(f"the daemon path: {ratings} ratings, a round at the default settings, an answer "
            "from the new checkpoint…")
        daemon_round = measure_rating_to_answer(
            cfg, loaded, Path(tmp) / "daemon", ratings,
            max_new_tokens=32 if quick else cfg.generation.max_new_tokens)
        rss_training = peak_rss(resource.RUSAGE_CHILDREN)  # the trainer children above
        del loaded  # the chat reply is timed on a fresh model, as a new server has it
        reply = measure_chat_reply_fresh(cfg, new_tokens=32 if quick else
                                         cfg.generation.max_new_tokens,
                                         repeats=1 if quick else 2, say=say)
    return {
        "model": name, "model_name": gen["model"], "parameters": gen["parameters"],
        "machine": machine(), "generation": {k: gen[k] for k in ("engine", "generate", "ratio",
                                                                 "new_tokens", "runs",
                                                                 "prompt_tokens")},
        "batched_sampling": gen.get("rollouts"), "swap": gen.get("swap"),
        "chat_while_training": chat, "chat_reply": reply, "daemon_round": daemon_round,
        "ppo_round": {k: round_[k] for k in (
            "samples", "prompt_tokens", "reply_tokens", "batch_size", "ppo_epochs", "epochs_run",
            "seconds_round", "seconds_bare_fwd_bwd", "ratio_round_to_bare", "threads",
            "trainable_parameters")},
        "memory": {"peak_rss_serving_bytes": rss_serving,
                   "peak_rss_training_bytes": rss_training,
                   "peak_rss_after_in_process_round_bytes": round_["peak_rss_bytes"]},
    }


def measure_chat_reply_fresh(cfg, *, new_tokens: int, repeats: int, say) -> dict[str, Any]:
    """One chat reply on a freshly loaded model (a new server's engine, no adapter), against
    llama.cpp on the same GGUF when possible (``reinf.bench.llamacpp``)."""
    from reinf.bench.generation import PROMPTS
    from reinf.bench.llamacpp import measure_chat_reply
    from reinf.catalog import resolve_model_path
    from reinf.serving.engine import Engine
    from reinf.model.modeling import load_model

    engine = Engine(load_model(cfg), cfg)
    return measure_chat_reply(engine, resolve_model_path(cfg), PROMPTS, new_tokens=new_tokens,
                              repeats=repeats, say=say)


def graded_by_length(prompt: str, reply: str) -> int:
    """A person who likes short answers, in five steps (so the ratings spread, and the
    rating model has something to learn): 5 up to 15 words, 1 beyond 90."""
    words = len(reply.split())
    return next((score for score, most in ((5, 15), (4, 30), (3, 50), (2, 90))
                 if words <= most), 1)


def measure_rating_to_answer(cfg, loaded, home: Path, ratings: int, *,
                             max_new_tokens: int, poll: float = 0.05) -> dict[str, Any]:
    """The daemon path: from the ``ratings``-th rating (``train_after_ratings``) to a reply
    from the new checkpoint. See item 4 of the module docstring.

    The engine, the store, the ``Daemon`` (its scheduler, its ``ChildRunner``, its swap) are
    the server's own; the child runs ``reinf.bench.roundchild`` (the trainer child's ``main`` with
    a stage clock). After the last rating this process does nothing but look, every ``poll``
    seconds, whether the engine serves a new checkpoint, then sends the next message."""
    from reinf.serving.chat import ChatService
    from reinf.config import load_config, render_yaml
    from reinf.daemon.background import Daemon
    from reinf.demo.corpus import sample_prompts
    from reinf.serving.engine import Engine
    from reinf.storage.store import Store
    from reinf.daemon.worker import ChildRunner, build_command

    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text(render_yaml(cfg.replace(
        data_dir=str(home), train_after_ratings=ratings)), "utf-8")
    cfg = load_config(home / "config.yaml", environ={"REINF_HOME": str(home)})

    def command(trigger: str, force: bool) -> list[str]:
        argv = build_command(trigger, force, config_file=cfg.source)
        assert argv[1:3] == ["-m", "reinf.training.child"], argv
        return [argv[0], "-m", "reinf.bench.roundchild", *argv[3:]]

    store = Store.open(cfg)
    engine = Engine(loaded, cfg)
    daemon = Daemon(cfg, store, engine, runner=ChildRunner(cfg, store, command=command))
    chat = ChatService(engine, store, cfg)
    prompts = sample_prompts(2, ratings + 1)
    scores, lengths = [], []
    daemon.start()
    try:
        before = engine.active_checkpoint_id
        for i, prompt in enumerate(prompts[:ratings]):
            turn = chat.send(prompt, seed=i, max_new_tokens=max_new_tokens)
            scores.append(graded_by_length(prompt, turn.reply))
            lengths.append(len(turn.reply_ids))
            rated_at = time.time()
            store.rate(turn.id, scores[-1])
            daemon.notify_rating()   # what the web API does after storing a rating
        deadline = rated_at + cfg.schedule.train_timeout_minutes * 60 + 60
        swapped_at = None
        while time.time() < deadline:
            if engine.active_checkpoint_id != before:
                swapped_at = time.time()
                break
            result = daemon.scheduler.last_result
            if result is not None and result.get("status") != "succeeded":
                break   # rejected, failed or skipped: no new checkpoint will answer
            time.sleep(poll)
        answer = None
        if swapped_at is not None:
            sent = time.time()
            turn = chat.send(prompts[ratings], seed=ratings, max_new_tokens=max_new_tokens)
            answer = {"sent_at": sent, "ttft_ms": turn.ttft_ms, "done_at": time.time(),
                      "checkpoint_id": turn.checkpoint_id, "tokens": len(turn.reply_ids)}
        daemon.scheduler.wait_idle(60)
        result = daemon.scheduler.last_result or {}
    finally:
        daemon.shutdown(timeout=60)
        store.close()
    metrics = result.get("metrics") or {}
    out: dict[str, Any] = {
        "ratings": ratings, "scores": scores, "rated_reply_tokens": lengths,
        "max_new_tokens": max_new_tokens, "status": result.get("status", "no round"),
        "message": result.get("message"), "checkpoint_id": result.get("checkpoint_id"),
        "mode": metrics.get("mode"), "mode_reason": metrics.get("mode_reason"),
        "child_seconds": result.get("seconds"), "swap_pause_ms": result.get("swap_pause_ms"),
        "seconds_rating_to_swap": None if swapped_at is None else swapped_at - rated_at,
        "seconds_rating_to_first_token": None, "seconds_rating_to_answer": None,
        "answer_checkpoint_id": None, "answer_tokens": None,
        "train_nice": cfg.schedule.train_nice, "train_threads": cfg.schedule.train_threads,
        "round": round_split(metrics)}
    if answer is not None:
        out.update(seconds_rating_to_first_token=answer["sent_at"] + answer["ttft_ms"] / 1000
                   - rated_at, seconds_rating_to_answer=answer["done_at"] - rated_at,
                   answer_checkpoint_id=answer["checkpoint_id"], answer_tokens=answer["tokens"])
        if answer["checkpoint_id"] != out["checkpoint_id"]:
            out["status"] = f"the answer came from {answer['checkpoint_id'] or 'the base'}, " \
                            f"not {out['checkpoint_id']}"
    return out


def round_split(metrics: dict[str, Any]) -> dict[str, Any]:
    """A round's time by stage, from its metrics and the stage clock of
    ``reinf.bench.roundchild`` (``bench_stages``). The rollouts stage holds the sampling
    (``rollout_seconds``) and the scoring (``scoring_seconds``: the rating model's features
    of each fresh reply, its prediction, the reward mapper)."""
    stages = metrics.get("bench_stages") or {}
    seconds = metrics.get("bench_round_seconds", metrics.get("seconds"))
    sampled = [metrics.get(k) for k in ("rollout_seconds", "scoring_seconds")]
    batch = (stages["rollouts"] - sum(sampled)) if "rollouts" in stages and None not in sampled \
        else None
    return {"seconds": seconds,
            # before the first stage: the run row, and the imports of torch, transformers and
            # peft (train_round imports them only once there is work)
            "start": seconds - sum(stages.values()) if stages and seconds is not None else None,
            "reading": stages.get("rewards"), "loading": stages.get("load"),
            "rating_model": stages.get("rating_model", metrics.get("rating_model_seconds")),
            "rollouts": sampled[0], "scoring": sampled[1],
            "batch": batch,  # the rest of the rollouts stage: the episodes' batch, its rewards
            "update": stages.get("update", metrics.get("update_seconds")),
            "gate": stages.get("gate"), "checkpoint": stages.get("checkpoint"),
            "rollout_replies": metrics.get("rollouts"),
            "rollout_tokens": metrics.get("rollout_tokens"),
            "samples": metrics.get("samples"), "tokens": metrics.get("tokens"),
            "epochs_run": metrics.get("epochs_run"),
            "steps": metrics.get("steps"), "fluency_replies": metrics.get("fluency_replies")}



def save_shaped_model(config, out: Path) -> str:
    from transformers import AutoTokenizer

    from reinf.catalog import demo_model_dir
    from reinf.bench.generation import build_shaped_model

    tokenizer = AutoTokenizer.from_pretrained(str(demo_model_dir(config)))
    loaded = build_shaped_model(tokenizer)
    loaded.model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    del loaded
    return str(out)


def measure_chat_during_round(cfg, loaded, home: Path, turns: int, *, new_tokens: int,
                              idle: int) -> dict[str, Any]:
    """Replies timed on an idle machine, then while the daemon's child trainer runs."""
    from reinf.serving.chat import ChatService
    from reinf.config import load_config, render_yaml
    from reinf.demo.corpus import sample_prompts
    from reinf.serving.engine import Engine
    from reinf.bench.raters import load_rater
    from reinf.storage.store import Store
    from reinf.daemon.worker import ChildRunner

    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text(render_yaml(cfg.replace(data_dir=str(home))), "utf-8")
    cfg = load_config(home / "config.yaml", environ={"REINF_HOME": str(home)})
    store = Store.open(cfg)
    engine = Engine(loaded, cfg)
    chat, rater = ChatService(engine, store, cfg), load_rater("prefers-terse")
    for i, prompt in enumerate(sample_prompts(0, turns)):
        turn = chat.send(prompt, seed=i, max_new_tokens=32)
        store.rate(turn.id, rater(prompt, turn.reply))
    prompts = sample_prompts(1, 8)
    params = engine.generation_params(max_new_tokens=new_tokens)

    def reply(i: int) -> dict[str, float]:
        ids = engine.build_prompt([], prompts[i % len(prompts)], max_new_tokens=new_tokens)
        start = time.time()
        r = engine.stream_prompt(ids, {**params, "seed": i}, ignore_eos=True).wait()
        return {"start": start, "end": time.time(), "ttft_ms": r.ttft_ms,
                "tokens_per_s": len(r.reply_ids) / (r.latency_ms / 1000)}

    reply(0)  # warm-up
    quiet = [reply(i) for i in range(idle)]
    runner = ChildRunner(cfg, store)
    outcome: list = []
    thread = threading.Thread(target=lambda: outcome.append(runner.run("bench", force=True)))
    thread.start()
    during, i = [], 0
    while thread.is_alive():
        during.append(reply(i))
        i += 1
        time.sleep(PAUSE_SECONDS)
    thread.join()
    result = outcome[0]
    run = store.get_run(result.run_id) if result.run_id else None
    store.close()
    busy = []
    if run is not None and run.finished_at is not None:
        finished = run.finished_at
        end = (finished if finished.tzinfo else finished.replace(tzinfo=timezone.utc)).timestamp()
        begin = end - float(result.metrics.get("update_seconds") or 0.0)
        busy = [r for r in during if r["start"] >= begin and r["end"] <= end]

    def summary(rows):
        return {"replies": len(rows),
                "ttft_ms": statistics.median(r["ttft_ms"] for r in rows) if rows else None,
                "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rows)
                if rows else None}
    a, b = summary(quiet), summary(busy)
    return {"idle": a, "training": b, "during_round": summary(during),
            "ratio_ttft": b["ttft_ms"] / a["ttft_ms"] if b["replies"] else None,
            "ratio_tokens_per_s": b["tokens_per_s"] / a["tokens_per_s"] if b["replies"] else None,
            "new_tokens": new_tokens, "round_status": result.status,
            "round_seconds": result.seconds, "update_seconds": result.metrics.get("update_seconds"),
            "rated_turns": turns, "train_nice": cfg.schedule.train_nice,
            "train_threads": cfg.schedule.train_threads}


def _label(r: dict) -> str:
    """``demo: /path``, or only the path where a model path was measured."""
    return r["model_name"] if r["model"] == r["model_name"] else \
        f"{r['model']}: {r['model_name']}"


def _gb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e9:.2f} GB"


def format_speed(report: dict) -> str:
    from reinf.bench.generation import format_rollouts

    wrap = "\n" + " " * 24  # continuation lines line up under the figures
    lines = [f"reinf bench speed{' (quick)' if report['quick'] else ''}",
             f"  machine: {report['machine']}"]
    for r in report["models"]:
        g, s, c, p, m = (r["generation"], r.get("swap") or {}, r["chat_while_training"],
                         r["ppo_round"], r["memory"])
        fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
        lines += [
            "", f"{_label(r)} ({r['parameters']:,} parameters)",
            f"  time to first token   engine {g['engine']['ttft_ms']:.1f} ms, model.generate "
            f"{g['generate']['ttft_ms']:.1f} ms: ratio {g['ratio']['ttft']:.2f}",
            f"  tokens/s              engine {g['engine']['tokens_per_s']:.1f}, model.generate "
            f"{g['generate']['tokens_per_s']:.1f}: ratio {g['ratio']['tokens_per_s']:.2f} "
            f"({g['new_tokens']} new tokens, {g['runs']} runs)",
            *([f"  batched sampling      {format_rollouts(r['batched_sampling'], wrap)}"]
              if r.get("batched_sampling") else []),
            f"  hot-swap pause        new adapter {fmt(s.get('pause_ms_new_adapter'), '.1f')} ms, "
            f"switch {fmt(s.get('pause_ms_switch'), '.2f')} ms, max "
            f"{fmt(s.get('pause_ms_max'), '.1f')} ms",
            f"  PPO round             {p['samples']} turns: {p['seconds_round']:.2f} s, bare LoRA "
            f"fwd+bwd {p['seconds_bare_fwd_bwd']:.2f} s: ratio {p['ratio_round_to_bare']:.2f} "
            f"({p['ppo_epochs']} epochs, batch {p['batch_size']}, {p['threads']} threads)",
            f"  peak RSS              serving {_gb(m['peak_rss_serving_bytes'])}, training "
            f"(trainer child) {_gb(m['peak_rss_training_bytes'])}",
            f"  chat while training   time to first token {fmt(c['idle']['ttft_ms'], '.1f')} ms "
            f"idle, {fmt(c['training']['ttft_ms'], '.1f')} ms training: ratio "
            f"{fmt(c['ratio_ttft'], '.2f')}; tokens/s ratio {fmt(c['ratio_tokens_per_s'], '.2f')}",
            f"                        ({c['training']['replies']} replies inside the update "
            f"phase of a {c['rated_turns']}-turn round, {c['round_status']}, "
            f"{fmt(c['round_seconds'], '.1f')} s; trainer nice {c['train_nice']}, threads "
            f"{c['train_threads'] or 'default'})"]
        if r.get("daemon_round"):
            lines += format_daemon_round(r["daemon_round"], wrap)
        if r.get("chat_reply"):
            from reinf.bench.llamacpp import format_chat_reply
            lines += format_chat_reply(r["chat_reply"], wrap,
                                       goal=_goal(r["chat_reply"]["ours"]["tokens_per_s"],
                                                  GOAL_CHAT_TOKENS_PER_S, most=False))
    return "\n".join(lines)


# The goals of issue 20 on 2 cores (a benchmark's yardstick, not a test).
GOAL_ROUND_S, GOAL_RATING_TO_ANSWER_S, GOAL_CHAT_TOKENS_PER_S = 120, 180, 15


def _goal(value: float | None, goal: float, *, most: bool = True) -> str:
    if value is None:
        return ""
    met = value <= goal if most else value >= goal
    return f" [goal {'≤' if most else '≥'} {goal}: {'met' if met else 'missed'}]"


def format_daemon_round(d: dict, wrap: str) -> list[str]:
    """The round at the default settings, split by stage, and the rating-to-answer time."""
    fmt = lambda v, f=".1f": "-" if v is None else format(v, f)  # noqa: E731
    rs = d.get("round") or {}
    parts = [("imports", rs.get("start")), ("reading ratings", rs.get("reading")),
             ("loading", rs.get("loading")), ("rating model", rs.get("rating_model")),
             ("rollouts", rs.get("rollouts")), ("scoring", rs.get("scoring")),
             ("batch", rs.get("batch")), ("PPO update", rs.get("update")),
             ("gate", rs.get("gate")), ("checkpoint", rs.get("checkpoint"))]
    split = ", ".join(f"{name} {fmt(v)}" for name, v in parts if v is not None)
    sampled = (f"{rs['rollout_replies']} fresh replies, {rs['rollout_tokens']} tokens; "
               if rs.get("rollout_replies") else "no rollouts; ")
    goal = _goal(rs.get("seconds"), GOAL_ROUND_S)
    lines = [f"  training round        {fmt(rs.get('seconds'))} s, {d.get('mode') or '-'} mode, "
             f"after {d['ratings']} ratings (train_after_ratings){goal}:"
             f"{wrap}{split or '-'} s"
             f"{wrap}({sampled}{rs.get('samples') or '-'} samples, "
             f"{rs.get('epochs_run') or '-'} epochs; trainer nice {d['train_nice']}, "
             f"threads {d['train_threads'] or 'default'}; {d['status']})"]
    if d.get("mode") == "rated" and d.get("mode_reason"):
        lines.append(f"{wrap[1:]}{d['mode_reason']}")
    answer = d.get("seconds_rating_to_answer")
    if answer is None:
        lines.append(f"  rating -> answer      no new checkpoint answered: {d['status']}"
                     + (f" ({d['message']})" if d.get("message") else ""))
        return lines
    swap, child = d.get("seconds_rating_to_swap"), d.get("child_seconds")
    rest = None if swap is None or child is None else swap - child
    overhead = None if child is None or rs.get("seconds") is None else child - rs["seconds"]
    first = d["seconds_rating_to_first_token"]
    lines.append(
        f"  rating -> answer      {d['ratings']}th rating to the new checkpoint's first token "
        f"{fmt(first)} s, whole reply {fmt(answer)} s ({d['answer_tokens']} tokens)"
        f"{_goal(first, GOAL_RATING_TO_ANSWER_S)}:"
        f"{wrap}trainer child {fmt(child)} s (the round {fmt(rs.get('seconds'))} s, process "
        f"start and exit {fmt(overhead)} s), scheduling and swap {fmt(rest, '.2f')} s "
        f"(swap pause {fmt(d.get('swap_pause_ms'), '.1f')} ms)")
    return lines


def child_config(config_path: str | None, model: str):
    """The config a child measures ``model`` with: the configured one for ``demo`` and
    ``0.5b``; for a model path or name, the same with that ``model_path`` as a flag, so a
    named model brings its own defaults (smollm2-135m's 192 tokens, reinf-demo's 128)
    under whatever the file and environment set, as ``reinf bench learn --model`` does."""
    from reinf.config import load_config

    overrides = {} if model in MODELS else {"model_path": model}
    return load_config(config_path, overrides=overrides)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reinf.bench.speed",
                                     description="One model's part of `reinf bench speed`.")
    parser.add_argument("--model", default="demo",
                        help="demo (the configured model), 0.5b, or a model_path")
    parser.add_argument("--turns", type=int, default=64)
    parser.add_argument("--turns-large", type=int, default=0,
                        help="rated turns for a model_path of 100M parameters or more")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--config")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    import torch

    config = child_config(args.config, args.model)
    threads = args.threads or config.schedule.train_threads
    if threads:
        torch.set_num_threads(threads)
    result = measure_model(config, args.model, turns=args.turns, quick=args.quick,
                           turns_large=args.turns_large or None)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
