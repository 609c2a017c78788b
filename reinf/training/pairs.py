"""The person's picks as rows of the rating model (stage 1 of a round, beside the ratings).

A pair (reinf.storage.schema.Pair) is two replies to one prompt and which one the person preferred:
from the compare page and `reinf compare` (text sides: the pair keeps their prompt and reply
token ids), regenerate-and-pick and /v1 ``n`` > 1 (turn sides: the turns keep them). Each side
becomes a row of the rating model's features: a rated turn's own row when the side is one,
else a row of its own (``sides``). ``outcome`` a or b is a pick (target 1 or 0 for side a);
a tie or "both bad" is a tie (target 1/2): a "both bad" says neither is better, and no
rating is made up for it (the person's scale is in their ratings).

Nothing forgotten is read: pairs go with the turns they hold (``reinf forget``); a pair whose
side or prompt turn lost its context (an earlier turn of the conversation was forgotten, so
its prompt held forgotten text) is skipped, as such turns are for ratings. The turns and
pairs a round read are returned, so that promotion refuses a checkpoint whose rating model
learnt from one forgotten while the round ran.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from reinf.errors import NotFound

TARGET = {"a": 1.0, "b": 0.0, "tie": 0.5, "both_bad": 0.5}


@dataclass
class PairRows:
    rows: list[tuple[int, int, float]] = field(default_factory=list)   # (row a, row b, target)
    sides: list[tuple[list[int], list[int]]] = field(default_factory=list)  # rows of their own
    pair_ids: set[int] = field(default_factory=set)
    turn_ids: set[int] = field(default_factory=set)
    skipped: dict[str, int] = field(default_factory=dict)


def collect_pairs(store, rated: Sequence, *, limit: int,
                  unreadable: Callable[[list[int], list[int]], str | None],
                  until=None) -> PairRows:
    """The newest ``limit`` pairs made (or picked again) by ``until`` as rating-model rows.
    ``rated``: the rated samples whose features are rows 0..len(rated)-1 (a side that is one
    of them reuses its row; the others get rows from len(rated) on, in ``sides``).
    ``unreadable(prompt_ids, reply_ids)``: why the model cannot read a side
    (reinf.training.session.unreadable), or None. ``until``: when the round read the
    ratings; its turns are checked against forgets from then on (Store.promote), so a
    later pick waits for the next round."""
    out = PairRows()
    row_of = {(tuple(s.prompt_ids), tuple(s.reply_ids)): i for i, s in enumerate(rated)}
    turns: dict[int, object] = {}

    def turn(turn_id: int):
        if turn_id not in turns:
            try:
                turns[turn_id] = store.get_turn(turn_id)
            except NotFound:  # forgotten since the pair was read: so is the pair
                turns[turn_id] = None
        return turns[turn_id]

    def skip(reason: str) -> None:
        out.skipped[reason] = out.skipped.get(reason, 0) + 1

    for pair in store.list_pairs(limit=limit):
        if until is not None and pair.created_at > until:
            continue
        held = [t for t in (pair.a_turn_id, pair.b_turn_id, pair.prompt_turn_id)
                if t is not None]
        records = [turn(t) for t in held]
        if any(r is None or r.context_forgotten for r in records):
            skip("forgotten_context")
            continue
        sides = []
        for side in ("a", "b"):
            turn_id = getattr(pair, f"{side}_turn_id")
            if turn_id is not None:
                sides.append((list(turns[turn_id].prompt_ids), list(turns[turn_id].reply_ids)))
            else:
                sides.append((list(pair.prompt_ids), list(getattr(pair, f"{side}_reply_ids"))))
        if any(not reply for _, reply in sides):
            skip("empty_reply")
            continue
        if sides[0] == sides[1]:
            skip("same_reply")
            continue
        why = next((w for w in (unreadable(p, r) for p, r in sides) if w), None)
        if why:
            skip(why)
            continue
        index = []
        for key in ((tuple(p), tuple(r)) for p, r in sides):
            if key not in row_of:
                row_of[key] = len(rated) + len(out.sides)
                out.sides.append((list(key[0]), list(key[1])))
            index.append(row_of[key])
        out.rows.append((index[0], index[1], TARGET[pair.outcome]))
        out.pair_ids.add(pair.id)
        out.turn_ids.update(held)
    return out


def pairs_waiting(store) -> bool:
    """Is there a pick or a rewrite (made or changed) since the last finished round started,
    and a rating for the round it needs? A round with no new rating still has that to learn."""
    if not store.counts()["ratings"]:
        return False
    finished = [r.started_at for r in store.list_runs(limit=50)
                if r.status in ("succeeded", "rejected")]
    since = max(finished) if finished else None
    return bool(store.list_pairs(limit=1, since=since)) or store.rewrites_since(since) > 0
