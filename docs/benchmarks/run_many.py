"""Run many `reinf bench learn` processes at once on one machine, then merge each group's
reports into one comparison (`reinf bench learn --merge`).

A learning run on the real model keeps one core and a sliver of a GPU busy, so a machine with
16 cores and one GPU runs a dozen or more side by side (on a GPU, through NVIDIA's MPS, so
their kernels share the device instead of taking turns). The figures in docs/benchmarks.md
that say "N processes at once" were made this way.

A plan is a text file, one run a line (blank lines and `#` comments are skipped):

    GROUP  [VAR=VALUE ...]  --  ARGS FOR `reinf bench learn`

    it2  REINF_TRAINING_ROLLOUT_ITERATIONS=2 -- --model smollm2-135m --rater formal --seed 0 ...

Runs of one GROUP must split one comparison (the same settings, different `--seed`,
`--baselines` or `--kto-lr`), which is what `--merge` pools. Each run writes
OUT/runs/GROUP-K.json (its `--json` report; `--json` and `--plot` are added) and
OUT/runs/GROUP-K.err (its progress); each group with at least one finished run gets
OUT/GROUP.json, OUT/GROUP.txt and OUT/GROUP.png.

    python docs/benchmarks/run_many.py PLAN OUT [--jobs N] [--deadline SECONDS] [--mps]

`--deadline`: runs still going then are stopped (their .err keeps how far they got) and the
finished ones are merged, so a lease that ends never loses the whole batch. `--mps` starts
the MPS control daemon first where `nvidia-cuda-mps-control` exists (and stops it at the end).
`reinf` is the one on PATH, else `python -m reinf` of this interpreter.

To compare two versions of the code, give each run `PYTHONPATH=SNAPSHOT` (a `git archive`
of that commit) and start this script from a directory with no `reinf/` in it. Without
`reinf` on PATH it runs `python -m`, which puts the working directory ahead of PYTHONPATH,
so from a checkout every run would import the checkout's code.
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Run:
    group: str
    name: str
    env: dict[str, str]
    args: list[str]
    proc: subprocess.Popen | None = None
    started: float = 0.0
    outcome: str = "waiting"
    files: list = field(default_factory=list)


def read_plan(path: Path) -> list[Run]:
    runs: list[Run] = []
    counts: dict[str, int] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        words = shlex.split(line)
        if "--" not in words or words.index("--") == 0:
            sys.exit(f"{path}:{number}: expected `GROUP [VAR=VALUE ...] -- ARGS`, got: {line}")
        cut = words.index("--")
        group, assignments, args = words[0], words[1:cut], words[cut + 1:]
        env = {}
        for item in assignments:
            key, sep, value = item.partition("=")
            if not sep or not key:
                sys.exit(f"{path}:{number}: `{item}` is not VAR=VALUE")
            env[key] = value
        counts[group] = counts.get(group, 0) + 1
        runs.append(Run(group, f"{group}-{counts[group]}", env, args))
    if not runs:
        sys.exit(f"{path}: no runs in the plan")
    return runs


def reinf_command() -> list[str]:
    found = shutil.which("reinf")
    return [found] if found else [sys.executable, "-m", "reinf"]


def start_mps(out: Path) -> bool:
    control = shutil.which("nvidia-cuda-mps-control")
    if not control:
        print("no nvidia-cuda-mps-control here: the runs share the GPU without MPS", flush=True)
        return False
    for var, sub in (("CUDA_MPS_PIPE_DIRECTORY", "mps-pipe"), ("CUDA_MPS_LOG_DIRECTORY", "mps-log")):
        path = out / sub
        path.mkdir(parents=True, exist_ok=True)
        os.environ[var] = str(path)
    subprocess.run([control, "-d"], check=True)
    print("MPS control daemon started", flush=True)
    return True


def stop_mps() -> None:
    subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("plan", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--deadline", type=float, default=None, help="seconds from the start")
    parser.add_argument("--mps", action="store_true")
    opts = parser.parse_args()

    runs = read_plan(opts.plan)
    (opts.out / "runs").mkdir(parents=True, exist_ok=True)
    mps = start_mps(opts.out) if opts.mps else False
    reinf = reinf_command()
    began = time.monotonic()
    waiting = list(runs)
    running: list[Run] = []
    try:
        while waiting or running:
            while waiting and len(running) < opts.jobs:
                run = waiting.pop(0)
                stdout = open(opts.out / "runs" / f"{run.name}.json", "w")
                stderr = open(opts.out / "runs" / f"{run.name}.err", "w")
                run.files = [stdout, stderr]
                run.proc = subprocess.Popen(
                    reinf + ["bench", "learn", *run.args, "--json",
                             "--plot", str(opts.out / "runs" / f"{run.name}.png")],
                    stdout=stdout, stderr=stderr,
                    env={**os.environ, **run.env}, start_new_session=True)
                run.started = time.monotonic()
                running.append(run)
                print(f"started {run.name}: {' '.join(run.args)}", flush=True)
            time.sleep(2)
            for run in list(running):
                code = run.proc.poll()
                if code is None:
                    continue
                run.outcome = "finished" if code == 0 else f"failed (exit {code})"
                print(f"{run.name}: {run.outcome} in {time.monotonic() - run.started:.0f} s",
                      flush=True)
                running.remove(run)
            if opts.deadline is not None and time.monotonic() - began > opts.deadline:
                for run in running:
                    os.killpg(run.proc.pid, signal.SIGTERM)
                    try:
                        run.proc.wait(timeout=20)
                    except subprocess.TimeoutExpired:
                        os.killpg(run.proc.pid, signal.SIGKILL)
                        run.proc.wait()
                    run.outcome = "stopped at the deadline"
                    print(f"{run.name}: stopped at the deadline after "
                          f"{time.monotonic() - run.started:.0f} s", flush=True)
                for run in waiting:
                    run.outcome = "never started (deadline)"
                running, waiting = [], []
    finally:
        # Ctrl-C or an error here: the runs are in their own sessions, so stop them too.
        for run in running:
            if run.proc.poll() is None:
                os.killpg(run.proc.pid, signal.SIGTERM)
        for run in runs:
            for handle in run.files:
                handle.close()
        if mps:
            stop_mps()

    for group in dict.fromkeys(run.group for run in runs):
        done = [run for run in runs if run.group == group and run.outcome == "finished"]
        if not done:
            print(f"{group}: no finished run, nothing to merge", flush=True)
            continue
        merge = [arg for run in done for arg in ("--merge", str(opts.out / "runs" / f"{run.name}.json"))]
        for suffix, extra in ((".json", ["--json"]), (".txt", [])):
            with open(opts.out / f"{group}{suffix}", "w") as handle:
                subprocess.run(reinf + ["bench", "learn", *merge, *extra,
                                        "--plot", str(opts.out / f"{group}.png")], stdout=handle,
                               stderr=subprocess.STDOUT, check=False)
        print(f"{group}: merged {len(done)} of "
              f"{sum(run.group == group for run in runs)} runs -> {group}.json, {group}.txt", flush=True)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit("interrupted: the runs were stopped; OUT/runs keeps what they wrote")
