"""How a training round ended, in one place: exit code <-> status <-> error kind.

``python -m reinf.training.child`` and ``reinf train`` exit with a round's code; the
daemon (reinf.daemon.worker) reads the child's code and JSON back; ``reinf train`` turns the
result a running server sends into the same code. All three go through ``RoundOutcome``
(docs/training.md, "Exit codes"):

| outcome         | exit code | status    | error            |
| --------------- | --------- | --------- | ---------------- |
| SUCCEEDED       | 0         | succeeded | null             |
| REJECTED        | 3         | rejected  | null             |
| NOTHING_NEW     | 4         | skipped   | nothing_to_train |
| HOOK_BROKEN     | 5         | failed    | hook             |
| MODEL_MISSING   | 6         | failed    | model            |
| FAILED          | 1         | failed    | error            |

FAILED also stands for a round that did not start because another one held the train
lock: exit code 1 and error ``error``, whatever status the result says.
"""
from __future__ import annotations

import enum
from typing import Any

from reinf.errors import HookError, ModelError, TrainingError


class NothingToTrain(TrainingError):
    """No rating arrived since the last finished round."""


class RoundOutcome(enum.Enum):
    """One way a round can end; ``.exit_code``, ``.status``, ``.error`` and ``.meaning``."""
    SUCCEEDED = (0, "succeeded", None, "succeeded: a new checkpoint is active")
    REJECTED = (3, "rejected", None, "rejected by the promotion gate")
    NOTHING_NEW = (4, "skipped", "nothing_to_train", "nothing new to train on")
    HOOK_BROKEN = (5, "failed", "hook", "reward hook broken")
    MODEL_MISSING = (6, "failed", "model", "model missing or cannot be loaded")
    FAILED = (1, "failed", "error", "failed")

    def __init__(self, exit_code: int, status: str, error: str | None, meaning: str):
        self.exit_code = exit_code
        self.status = status        # the runs row's and the JSON result's status
        self.error = error          # the JSON result's error kind (null when it worked)
        self.meaning = meaning      # a few words for the person

    @property
    def ok(self) -> bool:
        """The round did its job (a checkpoint, or a rejection the gate decided)."""
        return self in (RoundOutcome.SUCCEEDED, RoundOutcome.REJECTED)

    @classmethod
    def of(cls, status: str | None, error: str | None = None) -> "RoundOutcome":
        """The outcome a round's JSON result names by its status and error kind. A result
        that is neither succeeded, rejected nor a known error kind is FAILED."""
        if status == "succeeded":
            return cls.SUCCEEDED
        if status == "rejected":
            return cls.REJECTED
        return next((o for o in cls if o.error is not None and o.error == error), cls.FAILED)

    @classmethod
    def of_exit_code(cls, code: int) -> "RoundOutcome | None":
        """The outcome an exit code stands for; None for a code no round exits with."""
        return next((o for o in cls if o.exit_code == code), None)

    @classmethod
    def of_exception(cls, exc: BaseException) -> "RoundOutcome":
        """The outcome of a round that raised ``exc``."""
        for kind, outcome in ((NothingToTrain, cls.NOTHING_NEW), (HookError, cls.HOOK_BROKEN),
                              (ModelError, cls.MODEL_MISSING)):
            if isinstance(exc, kind):
                return outcome
        return cls.FAILED

    def payload(self, message: str, *, run_id: int | None = None) -> dict[str, Any]:
        """The JSON result of a round that ended this way without a checkpoint."""
        return {"run_id": run_id, "status": self.status, "checkpoint_id": None,
                "metrics": {}, "message": message, "error": self.error}
