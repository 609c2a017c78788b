"""Best-of-n at serve time (``generation.best_of``): which rating model may choose a reply.

The engine samples ``best_of`` replies in one batch and keeps the one the active
checkpoint's rating model scores highest (``Engine._sample_best_of``). Here: reading that
rating model from the checkpoint directory (outside the engine lock, as the adapter is) and
the rule for trusting it, the trainer's own (``reinf.training.plan.plan_round``: a
cross-validated Spearman that is defined and at least ``training.min_consistency``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["Rater", "best_of_state", "read_rater", "untrusted_reason"]


def untrusted_reason(consistency: float | None, min_consistency: float) -> str | None:
    """Why the trainer would not trust a rating model of this cross-validated Spearman
    (``reinf.training.plan.plan_round``'s rule: undefined, or below
    ``training.min_consistency``); None when it would."""
    if consistency is None:
        return "its ratings were all the same, so its consistency is undefined"
    if consistency < min_consistency:
        return (f"its cross-validated Spearman {consistency:.2f} is below "
                f"training.min_consistency {min_consistency}")
    return None


@dataclass(frozen=True)
class Rater:
    """The rating model of a checkpoint, as best-of-n uses it: ``model`` is None when
    there is none it may use, and ``reason`` says why."""
    checkpoint_id: str
    model: Any = None               # RatingModel | None
    reason: str | None = None


def read_rater(checkpoint_id: str, path: str | Path, min_consistency: float) -> Rater:
    """The rating model saved in a checkpoint directory, if the trainer would trust it.
    Never raises: a file that cannot be read is logged and named in ``reason``."""
    try:
        from reinf.training.checkpoints import load_rating_model
        from reinf.training.rating_model import RatingModel

        state = load_rating_model(Path(path))
        if state is None:
            return Rater(checkpoint_id, None,
                         f"checkpoint {checkpoint_id} carries no rating model")
        model = RatingModel.from_state_dict(state)
    except Exception as exc:  # noqa: BLE001 - best-of-n is an extra; chat goes on without it
        log.warning("best-of-n: the rating model of %s cannot be read", checkpoint_id,
                    exc_info=True)
        return Rater(checkpoint_id, None, f"the rating model of {checkpoint_id} cannot be read: "
                                          f"{type(exc).__name__}: {str(exc)[:120]}")
    reason = untrusted_reason(model.consistency, min_consistency)
    if reason is not None:
        return Rater(checkpoint_id, None, f"the rating model of {checkpoint_id} is not "
                                          f"trusted: {reason}")
    return Rater(checkpoint_id, model)


def best_of_state(n: int, checkpoint_id: str | None, rater: Rater | None) -> dict[str, Any]:
    """Best-of-n as it stands: ``{best_of, active, checkpoint_id, reason}``; ``active`` when
    replies are chosen by a rating model now, else ``reason`` says why not. ``rater`` is the
    active checkpoint's (None: not read)."""
    out = {"best_of": n, "active": False, "checkpoint_id": checkpoint_id, "reason": None}
    if n <= 1:
        out["reason"] = "off (generation.best_of is 1)"
    elif checkpoint_id is None:
        out["reason"] = "the base model is served: no checkpoint, so no rating model yet"
    elif rater is None or rater.model is None:
        out["reason"] = rater.reason if rater is not None else \
            f"checkpoint {checkpoint_id} was loaded without its directory; no rating model read"
    else:
        out["active"] = True
    return out
