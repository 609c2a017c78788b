"""The benchmark plans in docs/benchmarks/plans are read on a GPU lease of a few minutes,
where a typo costs the whole lease: every line must parse as run_many.py reads it, name a
rater and options `reinf bench learn` accepts, and set only REINF_ variables that are
settings, with values the settings accept."""
import importlib.util
import sys
from pathlib import Path

import pytest

from reinf.cli.bench import learn
from reinf.config import load_config, setting_variables

ROOT = Path(__file__).resolve().parents[2]
PLANS = sorted((ROOT / "docs" / "benchmarks" / "plans").glob("*.txt"))


def run_many():
    spec = importlib.util.spec_from_file_location(
        "run_many", ROOT / "docs" / "benchmarks" / "run_many.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["run_many"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_there_are_plans():
    assert len(PLANS) >= 3


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: p.name)
def test_every_run_of_a_plan_is_one_reinf_bench_learn_accepts(plan, tmp_path):
    from reinf.bench.raters import load_rater

    variables = set(setting_variables()) | {"REINF_HOME"}
    runs = run_many().read_plan(plan)
    for run in runs:
        ctx = learn.make_context("learn", list(run.args))  # unknown options raise here
        assert ctx.params["rater"], run.name
        load_rater(ctx.params["rater"])
        unknown = set(run.env) - variables
        assert not unknown, f"{run.name}: {sorted(unknown)} are not settings"
        load_config(environ={**run.env, "REINF_HOME": str(tmp_path)})  # bad values raise
    assert len({run.name for run in runs}) == len(runs)
