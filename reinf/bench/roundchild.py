"""The daemon's trainer child, with the time of each stage of its round: what
``reinf bench speed`` runs (through ``ChildRunner(command=...)``) to split a real round.

``python -m reinf.bench.roundchild`` takes the arguments of ``python -m
reinf.training.child`` and runs its ``main``, so the process, its niceness, its threads, its
store and its checkpoint are the daemon's own; the only difference is that
``train_round`` is given a progress callback that notes when each stage starts (the trainer
reports its stages: rewards, load, rating_model, rollouts, update, gate, checkpoint). The
round's result line then carries ``bench_stages``: seconds per stage, from one stage's first
event to the next one's (the last, ``checkpoint``, runs to the return of ``train_round``:
writing, promoting, retention), and ``bench_round_seconds``, the whole of ``train_round``.
Nothing is written to the store that the trainer would not write.
"""
from __future__ import annotations

import logging
import os
import sys
import time

STAGES = ("rewards", "load", "rating_model", "rollouts", "update", "gate", "checkpoint")


def stage_seconds(marks: list[tuple[str, float]], end: float) -> dict[str, float]:
    """``marks``: (stage, perf_counter of its first event) in order -> seconds per stage."""
    out: dict[str, float] = {}
    for (stage, at), nxt in zip(marks, [m[1] for m in marks[1:]] + [end]):
        out[stage] = round(out.get(stage, 0.0) + nxt - at, 3)
    return out


def install() -> None:
    """Wrap ``reinf.training.trainer.train_round`` (which ``run_once`` calls) with the
    stage clock."""
    from reinf.training import trainer

    original = trainer.train_round

    def timed(config, store, *, progress=None, **kwargs):
        marks: list[tuple[str, float]] = []

        def note(event: dict) -> None:
            stage = event.get("stage")
            if stage and (not marks or marks[-1][0] != stage):
                marks.append((stage, time.perf_counter()))
            if progress is not None:
                progress(event)

        started = time.perf_counter()
        result = original(config, store, progress=note, **kwargs)
        end = time.perf_counter()
        result.metrics["bench_stages"] = stage_seconds(marks, end)
        result.metrics["bench_round_seconds"] = round(end - started, 3)
        return result

    trainer.train_round = timed


if __name__ == "__main__":
    install()
    from reinf.training.child import main

    code = main()
    # As the child's own __main__: everything is written; skip the interpreter's teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)
