"""What the person's picks say about checkpoints (pairs between replies of two checkpoints,
reinf.storage.schema.Pair): a Bradley-Terry score per checkpoint (GET /api/leaderboard), a
checkpoint's record against the bare base (``reinf status``, each round's metrics), and
whether their blind picks put a checkpoint behind its parent (the picks rule of the
promotion gate, docs/training.md).

A pair counts for the checkpoints of its two sides (``None``, the bare base, is ``"base"``);
a pair of two replies of one checkpoint (most regenerate pairs) says nothing about
checkpoints and is left out. A pick is a win for the winner's side and a loss for the other;
a tie or "both bad" (neither is better) is a tie, half a win each in the scores.

**Scores.** Bradley-Terry: P(i beats j) = sigmoid(s_i - s_j), s in log-odds, the base fixed
at 0 (so s = 1 means 73% against the base), fitted by maximum likelihood with Hunter's MM
iterations (ties as half wins). Each checkpoint also gets ``VIRTUAL_TIES`` tie(s) with the
base, a prior that keeps the score of a checkpoint that won every pick finite and pulls one
with few picks towards the base; it also gives every checkpoint a score where its picks
never reach the base. With the prior, a checkpoint that beat the base 3 times in 4 scores
ln(3.5 / 1.5) = 0.85.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from reinf.errors import NotFound

BASE = "base"
VIRTUAL_TIES = 1.0     # ties with the base every checkpoint starts with (the prior)
MIN_PICKS = 3          # blind pairs against its parent before the picks rule reads them
POINTS = {"a": 1.0, "b": 0.0, "tie": 0.5, "both_bad": 0.5}   # side a's share of a pair


@dataclass
class Record:
    """A checkpoint's picks against others: wins, losses and ties (both bad included)."""
    wins: int = 0
    losses: int = 0
    ties: int = 0

    @property
    def pairs(self) -> int:
        return self.wins + self.losses + self.ties

    @property
    def win_rate(self) -> float | None:
        """Wins plus half the ties, over the pairs; None without any."""
        return (self.wins + self.ties / 2) / self.pairs if self.pairs else None

    def add(self, points: float) -> None:
        if points == 1.0:
            self.wins += 1
        elif points == 0.0:
            self.losses += 1
        else:
            self.ties += 1

    def to_dict(self) -> dict[str, Any]:
        return {"win_rate": self.win_rate, "wins": self.wins, "losses": self.losses,
                "ties": self.ties, "pairs": self.pairs}


def games(pairs: Iterable, *, blind: bool | None = None) -> list[tuple[str, str, float]]:
    """(side a's checkpoint, side b's, a's points) of each pair between two checkpoints;
    ``blind``: only blind (True) or only seen (False) picks."""
    out = []
    for p in pairs:
        a, b = p.a_checkpoint_id or BASE, p.b_checkpoint_id or BASE
        if a != b and (blind is None or p.blind == blind):
            out.append((a, b, POINTS[p.outcome]))
    return out


def tally(played: Sequence[tuple[str, str, float]], mine: set[str],
          theirs: set[str]) -> Record:
    """The record of the checkpoints ``mine`` against ``theirs``, from mine's side."""
    record = Record()
    for a, b, points in played:
        if a in mine and b in theirs:
            record.add(points)
        elif b in mine and a in theirs:
            record.add(1.0 - points)
    return record


def fit_scores(played: Sequence[tuple[str, str, float]], *, tolerance: float = 1e-10,
               max_iterations: int = 10_000) -> dict[str, float]:
    """Bradley-Terry log-odds of every checkpoint in ``played``, the base fixed at 0, with
    VIRTUAL_TIES ties with the base each (the prior; module docstring). Hunter's MM update
    p_i <- W_i / sum over i's games of 1 / (p_i + p_opponent), W_i its wins (ties half)."""
    players = sorted({c for a, b, _ in played for c in (a, b)} - {BASE})
    # (a, b, a's points, weight): the picks, and the prior's ties with the base
    everyone = [(a, b, points, 1.0) for a, b, points in played]
    everyone += [(c, BASE, 0.5, VIRTUAL_TIES) for c in players]
    wins = {c: 0.0 for c in players}
    for a, b, points, weight in everyone:
        if a in wins:
            wins[a] += weight * points
        if b in wins:
            wins[b] += weight * (1.0 - points)
    strength = {c: 1.0 for c in [*players, BASE]}
    for _ in range(max_iterations):
        sums = {c: 0.0 for c in players}
        for a, b, _, weight in everyone:
            share = weight / (strength[a] + strength[b])
            if a in sums:
                sums[a] += share
            if b in sums:
                sums[b] += share
        moved = 0.0
        for c in players:
            new = wins[c] / sums[c]
            moved = max(moved, abs(math.log(new / strength[c])))
            strength[c] = new
        if moved < tolerance:
            break
    return {BASE: 0.0, **{c: math.log(strength[c]) for c in players}}


def build_leaderboard(store, *, blind: bool | None = None) -> dict[str, Any]:
    """GET /api/leaderboard: every checkpoint that has picks against another, oldest first
    (the base first), with its Bradley-Terry score and its record."""
    played = games(store.list_pairs(limit=None), blind=blind)
    scores = fit_scores(played)
    known = {c.id: c for c in store.list_checkpoints()}
    rows = []
    for checkpoint_id, score in scores.items():
        if checkpoint_id == BASE and not played:
            continue
        record = tally(played, {checkpoint_id}, set(scores) - {checkpoint_id})
        ckpt = known.get(checkpoint_id)
        rows.append({"checkpoint_id": checkpoint_id, "score": score, **record.to_dict(),
                     "created_at": ckpt.created_at.isoformat(timespec="seconds")
                     if ckpt else None,
                     "parent_id": (ckpt.parent_id or BASE) if ckpt else None,
                     "status": ckpt.status if ckpt else None,
                     "active": bool(ckpt and ckpt.active)})
    rows.sort(key=lambda r: (r["checkpoint_id"] != BASE, r["created_at"] or "",
                             r["checkpoint_id"]))
    return {"leaderboard": rows, "pairs": len(played), "blind": blind}


def lineage(store, checkpoint_id: str | None) -> list[str]:
    """``checkpoint_id`` and its ancestors, nearest first, the base left out."""
    out: list[str] = []
    while checkpoint_id is not None and checkpoint_id not in out:
        out.append(checkpoint_id)
        try:
            checkpoint_id = store.get_checkpoint(checkpoint_id).parent_id
        except NotFound:
            break
    return out


def picks_vs_base(store, checkpoint_id: str | None, *, pairs=None) -> dict[str, Any] | None:
    """The person's picks between ``checkpoint_id`` or its ancestors and the base: its
    record (``win_rate``, ``wins``, ``losses``, ``ties``, ``pairs``) and ``checkpoints``,
    those of the lineage that have picks against the base; None when there are none."""
    if checkpoint_id is None:
        return None
    played = games(store.list_pairs(limit=None) if pairs is None else pairs)
    mine = lineage(store, checkpoint_id)
    record = tally(played, set(mine), {BASE})
    if not record.pairs:
        return None
    return {**record.to_dict(), "checkpoints": [
        c for c in mine if tally(played, {c}, {BASE}).pairs]}


def behind_parent(store, checkpoint_id: str, played) -> dict[str, Any] | None:
    """The person's blind picks put ``checkpoint_id`` behind its parent: it lost more than
    half of at least MIN_PICKS blind pairs against it. Returns that record, else None."""
    parent = store.get_checkpoint(checkpoint_id).parent_id
    record = tally(played, {checkpoint_id}, {parent or BASE})
    if record.pairs >= MIN_PICKS and record.losses > record.pairs / 2:
        return {"checkpoint_id": checkpoint_id, "parent_id": parent or BASE,
                **record.to_dict()}
    return None


def choose_start(store) -> tuple[str | None, list[dict[str, Any]]]:
    """The checkpoint a round continues from: the active one, unless the person's blind
    picks put it behind its parent; then that parent, and so on up while each is behind
    its own (never to one whose files retention removed). Returns (its id, None for the
    base; the evidence, one record per checkpoint passed over)."""
    active = store.active_checkpoint()
    current = active.id if active else None
    played = games(store.list_pairs(limit=None), blind=True)
    passed: list[dict[str, Any]] = []
    while current is not None and played:
        behind = behind_parent(store, current, played)
        if behind is None:
            break
        parent = store.get_checkpoint(current).parent_id
        if parent is not None and store.get_checkpoint(parent).status != "promoted":
            break
        passed.append(behind)
        current = parent
    return current, passed
