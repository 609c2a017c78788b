"""RoundOutcome: the one table of exit code <-> status <-> error kind that the trainer
child, `reinf train` and the daemon's worker share (docs/training.md, "Exit codes")."""
from __future__ import annotations

import pytest

from reinf.errors import Conflict, HookError, ModelError, ReinfError, TrainingError
from reinf.training.outcome import NothingToTrain, RoundOutcome

# docs/design.md §6 and docs/training.md: the numbers people's scripts depend on
DOCUMENTED = [(RoundOutcome.SUCCEEDED, 0, "succeeded", None),
              (RoundOutcome.REJECTED, 3, "rejected", None),
              (RoundOutcome.NOTHING_NEW, 4, "skipped", "nothing_to_train"),
              (RoundOutcome.HOOK_BROKEN, 5, "failed", "hook"),
              (RoundOutcome.MODEL_MISSING, 6, "failed", "model"),
              (RoundOutcome.FAILED, 1, "failed", "error")]


@pytest.mark.parametrize("outcome, code, status, error", DOCUMENTED)
def test_each_outcome_has_its_documented_code_status_and_error(outcome, code, status, error):
    assert (outcome.exit_code, outcome.status, outcome.error) == (code, status, error)
    assert RoundOutcome.of_exit_code(code) is outcome
    assert RoundOutcome.of(status, error) is outcome  # a JSON result reads back the same
    payload = outcome.payload("why", run_id=7)
    assert payload == {"run_id": 7, "status": status, "checkpoint_id": None, "metrics": {},
                       "message": "why", "error": error}
    assert outcome.ok == (code in (0, 3))


def test_results_and_errors_map_to_one_outcome():
    assert len({o.exit_code for o in RoundOutcome}) == len(RoundOutcome) == len(DOCUMENTED)
    assert RoundOutcome.of_exit_code(2) is None
    # a result that names no known error kind is a failure, exit code 1
    assert RoundOutcome.of("failed", None) is RoundOutcome.FAILED
    assert RoundOutcome.of("failed", "something new") is RoundOutcome.FAILED
    assert RoundOutcome.of(None) is RoundOutcome.FAILED
    # skipped without a kind: not started, another round held the train lock
    assert RoundOutcome.of("skipped", None) is RoundOutcome.FAILED
    assert RoundOutcome.of("skipped", "nothing_to_train") is RoundOutcome.NOTHING_NEW
    # the status wins over a stray error kind on a round that worked
    assert RoundOutcome.of("succeeded", "hook") is RoundOutcome.SUCCEEDED
    cases = [(NothingToTrain("nothing new"), RoundOutcome.NOTHING_NEW),
             (HookError("broken"), RoundOutcome.HOOK_BROKEN),
             (ModelError("model missing"), RoundOutcome.MODEL_MISSING),
             (TrainingError("training failed"), RoundOutcome.FAILED),
             (Conflict("busy"), RoundOutcome.FAILED), (ReinfError("x"), RoundOutcome.FAILED),
             (ValueError("x"), RoundOutcome.FAILED)]
    for exc, outcome in cases:
        assert RoundOutcome.of_exception(exc) is outcome, exc


def test_the_trainer_and_the_cli_share_it():
    from reinf.cli import train as cli_train
    from reinf.training import trainer

    assert trainer.NothingToTrain is NothingToTrain
    daemon = {"pid": 1, "url": "http://127.0.0.1:8765/"}
    # what a running server sends back, read by `reinf train`
    busy = cli_train.build_payload({"status": "skipped", "message": "busy"}, daemon)
    assert busy["error"] == "error" and busy["status"] == "skipped"
    hook = cli_train.build_payload(RoundOutcome.HOOK_BROKEN.payload("reward hook broken: x"),
                                   daemon)
    assert hook["error"] == "hook" and hook["daemon"]["pid"] == 1
    assert cli_train.build_payload({"status": "succeeded"}, daemon)["error"] is None
