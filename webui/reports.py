"""Read-only views the pages need: turns with the reward the current mapper gives them,
and ratings grouped by the checkpoint that produced each reply."""
from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any, Sequence

from reinf.errors import ReinfError
from reinf.records import Sample, TurnRecord

log = logging.getLogger("reinf.webui")


def build_sample(turn: TurnRecord) -> Sample:
    """A rated turn as the reward mapper sees it (the same fields store.training_samples
    fills)."""
    rating = turn.rating
    return Sample(
        turn_id=turn.id, conversation_id=turn.conversation_id, turn_index=turn.index,
        user_id=turn.user_id, prompt=turn.user_message, response=turn.reply,
        prompt_ids=turn.prompt_ids, reply_ids=turn.reply_ids, logprobs=turn.logprobs,
        checkpoint_id=turn.checkpoint_id, score=rating.score, tags=list(rating.tags),
        comment=rating.comment, critical=rating.critical, rated_at=rating.updated_at,
        created_at=turn.created_at,
        temperature=float((turn.gen_params or {}).get("temperature", 1.0)))


def _field(row: Any, name: str) -> Any:
    return row.get(name) if isinstance(row, dict) else getattr(row, name, None)


def map_rewards(config, turns: Sequence[TurnRecord]) -> tuple[dict[int, dict], str | None]:
    """{turn_id: {reward, weight, kept, human_reward}} for the rated turns, and the
    hook's error if the mapper is broken (then no rewards, never an exception)."""
    rated = [t for t in turns if t.rating is not None]
    if not rated:
        return {}, None
    try:
        from reinf.rewards import compute_rewards
    except ImportError as exc:
        if exc.name != "reinf.rewards":
            log.exception("reward mapper import failed")
        return {}, None if exc.name == "reinf.rewards" else f"reward mapper unavailable: {exc}"
    try:
        rows = compute_rewards(config, [build_sample(t) for t in rated])
    except ReinfError as exc:
        return {}, str(exc)
    except Exception as exc:  # noqa: BLE001 - history must show even with a broken hook
        log.exception("reward mapper failed")
        return {}, f"reward mapper failed: {type(exc).__name__}: {exc}"
    out = {}
    for row in rows:
        out[_field(row, "turn_id")] = {
            "reward": _field(row, "reward"), "weight": _field(row, "weight"),
            "kept": _field(row, "kept"), "human_reward": _field(row, "human_reward")}
    return out, None


def history_rows(config, turns: Sequence[TurnRecord]) -> dict[str, Any]:
    rewards, hook_error = map_rewards(config, turns)
    rows = []
    for turn in turns:
        row = turn.to_dict()
        mapped = rewards.get(turn.id)
        row["reward"] = mapped["reward"] if mapped else None
        row["reward_detail"] = mapped
        rows.append(row)
    return {"turns": rows, "hook_error": hook_error}


def checkpoint_scores(store) -> list[dict[str, Any]]:
    """Mean rating of the replies each checkpoint produced, oldest checkpoint first."""
    groups: dict[str, list[int]] = defaultdict(list)
    first_seen: dict[str, str] = {}
    for turn in store.history(limit=None, rated=True, oldest_first=True):
        key = turn.checkpoint_id or "base"
        groups[key].append(turn.rating.score)
        first_seen.setdefault(key, turn.created_at.isoformat(timespec="seconds"))
    return [{"checkpoint_id": key, "ratings": len(scores),
             "mean_rating": round(sum(scores) / len(scores), 3), "first_reply_at": first_seen[key]}
            for key, scores in groups.items()]
