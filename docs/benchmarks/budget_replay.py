"""The drift budget's search replayed on the rounds a run scaled (docs/benchmarks.md, "The
drift budget").

A checkpoint a round scaled holds its adapter times ``drift_scale`` (metrics.json). Dividing
its up-projections by that factor gives back the round's adapter as PPO left it, and
``hold_to_budget`` runs the search on it again, so a change to the search is compared on
the very adapters the runs met. Data directories are those a run kept (checkpoints/ and
anchor/):

    REINF_MODEL_PATH=smollm2-135m python docs/benchmarks/budget_replay.py BUDGET DATA_DIR ...

Two threads; about 10 s a scaled round for smollm2-135m on 2 CPU cores.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def main(budget: float, data_dirs: list[str]) -> None:
    from reinf.bench.probe import load_policy
    from reinf.config import load_config
    from reinf.training.anchor import read_episodes
    from reinf.training.budget import DRIFT_TEXTS, hold_to_budget, scale_adapter
    from reinf.training.ppo import build_rollout

    torch.set_num_threads(2)
    config = load_config()
    cache: dict = {}
    for data_dir in map(Path, data_dirs):
        anchor_file = min((data_dir / "anchor").glob("*.json"))
        passages = build_rollout(read_episodes(anchor_file)[:DRIFT_TEXTS])
        for checkpoint in sorted((data_dir / "checkpoints").iterdir()):
            m = json.loads((checkpoint / "metrics.json").read_text(encoding="utf-8"))
            if not m.get("drift_scale") or m["drift_scale"] >= 1.0:
                continue
            policy = load_policy(config, checkpoint, cache=cache)
            scale_adapter(policy.model, 1 / m["drift_scale"])
            r = hold_to_budget(policy, passages, budget, 8)
            print(f"{data_dir.name} round {m['round']}: logged drift {m['drift']:.3f}, scale "
                  f"{m['drift_scale']:.3f}, after {m['drift_after']:.3f}, {m['drift_tries']} "
                  f"tries | now scale {r['drift_scale']:.3f}, after {r['drift_after']:.3f}, "
                  f"{r['drift_tries']} tries, {r['drift_seconds']:.0f} s", flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(float(sys.argv[1]), sys.argv[2:])
