"""A training round as a process: ``python -m reinf.training.child``, and what ``reinf train``
shares with it.

The daemon runs every round in a child process (``reinf.daemon.worker.ChildRunner``), so a
crash, an out-of-memory kill or a hung reward hook never takes the chat down; ``reinf
train`` runs the same round in the foreground. The round itself is
``reinf.training.trainer.train_round``; what both need around it lives here:

- ``run_once``: one round -> its exit code (``reinf.training.outcome.RoundOutcome``), its
  JSON payload and the error for the person, whichever way the round ended;
- ``apply_process_settings``: ``schedule.train_threads``, and ``train_nice`` for the child,
  before torch starts its threads;
- ``ProgressBar``: a line per stage and tqdm bars on stderr;
- ``main``: the child's arguments (``--json``: the result is the last line of stdout); the
  process exits with the round's code, skipping the interpreter's teardown.
"""
from __future__ import annotations

import logging
import os
import sys
from typing import Any, Callable

from reinf.errors import ReinfError
from reinf.training import trainer
from reinf.training.outcome import RoundOutcome


def run_once(config, store, *, trigger: str = "manual", force: bool = False,
             progress: Callable | None = None) -> tuple[int, dict, ReinfError | None]:
    """One round -> (exit code, JSON payload, the error for the person or None)."""
    try:
        # through the module: reinf.bench.roundchild wraps trainer.train_round with its clock
        result = trainer.train_round(config, store, trigger=trigger, progress=progress,
                                     force=force)
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
    epochs x minibatches with live KL and loss; a round of several passes
    (``training.rollout_iterations``) starts both again for each, numbered."""
    STAGES = {"rewards": "reading rated turns and computing rewards…",
              "load": "loading the model…",
              "rating_model": "fitting the rating model on your ratings…",
              "rollouts": "sampling fresh replies for the rating model to score…",
              "anchor": "sampling the base model's own text for the anchor (once a model)…",
              "drift": "measuring the adapter's drift on the base model's own text "
                       "(training.drift_budget)…",
              "gate": "checking KL and fluency…",
              "vs_base": "comparing the new adapter with the base on your prompts…"}
    BARS = {"rollouts": ("rollouts", "reply"), "update": ("PPO", "minibatch"),
            "anchor": ("anchor text", "passage")}

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
        desc, unit = self.BARS[stage]
        if "iteration" in event:  # a round of several passes: one bar a stage, pass by pass
            desc = f"{desc} {event['iteration']}/{event['iterations']}"
        if bar is None:
            bar = self.bars[stage] = tqdm(total=event["total"], desc=desc, unit=unit,
                                          file=sys.stderr, dynamic_ncols=True)
        elif bar.desc != desc:
            bar.reset(total=event["total"])
            bar.set_description_str(desc)
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
    """``python -m reinf.training.child``: one round in a child process; the JSON result is the
    last line of stdout with --json. Exit codes: see RoundOutcome (reinf.training.outcome)."""
    import argparse
    import json

    from reinf.config import load_config
    from reinf.storage.store import Store

    parser = argparse.ArgumentParser(prog="python -m reinf.training.child",
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
