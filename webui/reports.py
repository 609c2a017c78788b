"""Read-only views the pages need: turns with the reward the current mapper gives them,
and ratings grouped by the checkpoint that produced each reply.

A custom reward hook runs in a child process (reinf.rewards.hooks), so the rewards it gives are
cached per rated turn: the history page runs the hook only for turns it has not mapped
yet. An entry is keyed by the mapper's version (a hash of the hook file's bytes and the
rewards settings, and the database) and the rating (turn id, updated_at); editing the hook,
changing a setting or re-rating a turn maps again. Entries also expire after
REWARD_CACHE_SECONDS, because a rating's weight (and whatever a hook makes of
``age_days``) changes with time.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, defaultdict
from typing import Any, Callable, Hashable, Sequence

from reinf.errors import ReinfError
from reinf.records import Sample, TurnRecord
from reinf.rewards.mapper import compute_rewards, mapper_fingerprint

log = logging.getLogger("reinf.webui")

REWARD_CACHE_SIZE = 5000         # rated turns (and failed batches) remembered
REWARD_CACHE_SECONDS = 600.0     # then mapped again: weights decay with a rating's age


class RewardCache:
    """A bounded, thread-safe LRU whose entries expire ``max_age`` seconds after they
    were stored."""

    def __init__(self, size: int = REWARD_CACHE_SIZE, max_age: float = REWARD_CACHE_SECONDS,
                 clock: Callable[[], float] = time.monotonic):
        self.size = size
        self.max_age = max_age
        self.clock = clock
        self._entries: OrderedDict[Hashable, tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if self.clock() - entry[0] > self.max_age:
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
            return entry[1]

    def put(self, key: Hashable, value: Any) -> None:
        with self._lock:
            self._entries[key] = (self.clock(), value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


reward_cache = RewardCache()


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


def mapper_version(config) -> tuple | None:
    """What the mapped rewards depend on besides the rating: the database and the mapper's
    version (``reinf.rewards.mapper.mapper_fingerprint``: the hook file's bytes and the rewards
    settings). None when the hook cannot be read (compute_rewards then reports why,
    quickly and without a child process)."""
    fingerprint = mapper_fingerprint(config)
    return None if fingerprint is None else (config.db_url, fingerprint)


def map_rewards(config, turns: Sequence[TurnRecord]) -> tuple[dict[int, dict], str | None]:
    """{turn_id: {reward, weight, kept, human_reward}} for the rated turns, and the
    hook's error if the mapper is broken (then no rewards, never an exception). Only turns
    missing from ``reward_cache`` reach the mapper, all in one call."""
    rated = [t for t in turns if t.rating is not None]
    if not rated:
        return {}, None
    version = mapper_version(config)
    if version is None:
        return run_mapper(config, rated)
    keys = {t.id: (version, t.id, t.rating.updated_at) for t in rated}
    out: dict[int, dict] = {}
    missing = []
    for turn in rated:
        hit = reward_cache.get(keys[turn.id])
        if hit is None:
            missing.append(turn)
        else:
            out[turn.id] = hit
    if not missing:
        return out, None
    failed_key = ("failed", *(keys[t.id] for t in missing))
    error = reward_cache.get(failed_key)
    if error is not None:
        return {}, error
    mapped, error = run_mapper(config, missing, failed_key=failed_key)
    if error is not None:
        return {}, error
    for turn_id, row in mapped.items():
        reward_cache.put(keys[turn_id], row)
    return {**out, **mapped}, None


def run_mapper(config, rated: Sequence[TurnRecord], *,
               failed_key: Hashable | None = None) -> tuple[dict[int, dict], str | None]:
    """map_rewards without the cache. The error of a broken hook (a ReinfError) is
    remembered under ``failed_key``, so the same turns do not run it again; an unexpected
    exception is logged and not remembered."""
    try:
        rows = compute_rewards(config, [build_sample(t) for t in rated])
    except ReinfError as exc:
        if failed_key is not None:
            reward_cache.put(failed_key, str(exc))
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
