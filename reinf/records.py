"""Plain records the store hands out, and their stable JSON form.

The store never leaks ORM objects: callers get these frozen dataclasses, which
stay valid after the session closes. ``to_dict()`` is the documented JSON shape
of ``--json`` output and of the HTTP API; add fields, never rename them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


def iso(ts: datetime | None) -> str | None:
    return ts.isoformat(timespec="seconds") if ts else None


@dataclass(frozen=True)
class RatingRecord:
    turn_id: int
    score: int
    tags: list[str]
    comment: str
    critical: bool
    created_at: datetime
    updated_at: datetime

    def to_dict(self) -> dict[str, Any]:
        return {"turn_id": self.turn_id, "score": self.score, "tags": list(self.tags),
                "comment": self.comment, "critical": self.critical,
                "created_at": iso(self.created_at), "updated_at": iso(self.updated_at)}


@dataclass(frozen=True)
class RewriteRecord:
    """The reply the person wrote for a turn: the one they would have wanted."""
    turn_id: int
    text: str
    created_at: datetime
    updated_at: datetime

    def to_dict(self) -> dict[str, Any]:
        return {"turn_id": self.turn_id, "text": self.text, "created_at": iso(self.created_at),
                "updated_at": iso(self.updated_at)}


@dataclass(frozen=True)
class TurnRecord:
    id: int
    conversation_id: int
    index: int
    user_message: str
    reply: str
    checkpoint_id: str | None
    model: str
    gen_params: dict[str, Any]
    created_at: datetime
    ttft_ms: float | None
    latency_ms: float | None
    interrupted: bool
    context_forgotten: bool
    prompt_ids: list[int] = field(repr=False)
    reply_ids: list[int] = field(repr=False)
    logprobs: list[float] = field(repr=False)
    rating: RatingRecord | None = None
    user_id: str = "local"
    system_prompt: str | None = None   # the conversation's, which the prompt starts with
    # Alternatives: the turns of one conversation with the same index answer the same
    # message; the picked one is on the conversation's path. ``alternatives``: how many
    # turns the slot holds (1: this one alone).
    picked: bool = True
    alternatives: int = 1
    rewrite: RewriteRecord | None = None   # the reply the person wrote for it, if any

    @property
    def style(self) -> str | None:
        """The instruction the reply was asked for in (generation.explore_styles), or None."""
        return self.gen_params.get("style")

    def to_dict(self, tokens: bool = False) -> dict[str, Any]:
        out = {"turn_id": self.id, "conversation_id": self.conversation_id, "index": self.index,
               "created_at": iso(self.created_at), "user_message": self.user_message,
               "reply": self.reply, "checkpoint_id": self.checkpoint_id or "base",
               "model": self.model, "reply_tokens": len(self.reply_ids),
               "ttft_ms": self.ttft_ms, "latency_ms": self.latency_ms,
               "interrupted": self.interrupted,
               "rating": self.rating.to_dict() if self.rating else None,
               "system_prompt": self.system_prompt, "picked": self.picked,
               "alternatives": self.alternatives,
               "rewrite": self.rewrite.to_dict() if self.rewrite else None,
               "style": self.style}
        if tokens:
            out.update(prompt_ids=self.prompt_ids, reply_ids=self.reply_ids,
                       logprobs=self.logprobs, gen_params=self.gen_params)
        return out


@dataclass(frozen=True)
class ConversationRecord:
    id: int
    title: str
    user_id: str
    created_at: datetime
    updated_at: datetime
    turns: int
    system_prompt: str | None = None   # None: the conversation has none

    def to_dict(self) -> dict[str, Any]:
        return {"conversation_id": self.id, "title": self.title, "user_id": self.user_id,
                "created_at": iso(self.created_at), "updated_at": iso(self.updated_at),
                "turns": self.turns, "system_prompt": self.system_prompt}


@dataclass(frozen=True)
class PairRecord:
    """A pairwise preference (reinf.storage.schema.Pair). A side is a stored turn (``a_turn_id``) or
    text only (``a_text``); ``a_text`` is filled from the turn when it is one."""
    id: int
    created_at: datetime
    source: str                     # compare | regenerate
    outcome: str                    # a | b | tie | both_bad
    blind: bool
    prompt: str
    conversation_id: int | None
    prompt_turn_id: int | None
    a_turn_id: int | None
    b_turn_id: int | None
    a_text: str
    b_text: str
    a_checkpoint_id: str | None     # None: the bare base model
    b_checkpoint_id: str | None
    details: dict[str, Any] = field(default_factory=dict)
    prompt_ids: list[int] = field(default_factory=list, repr=False)
    a_reply_ids: list[int] = field(default_factory=list, repr=False)
    b_reply_ids: list[int] = field(default_factory=list, repr=False)

    @property
    def winner(self) -> str | None:
        """"a" or "b"; None for a tie or both bad."""
        return self.outcome if self.outcome in ("a", "b") else None

    def to_dict(self) -> dict[str, Any]:
        def side(turn_id, text, checkpoint_id) -> dict[str, Any]:
            return {"turn_id": turn_id, "text": text, "checkpoint_id": checkpoint_id or "base"}
        return {"pair_id": self.id, "created_at": iso(self.created_at), "source": self.source,
                "outcome": self.outcome, "blind": self.blind, "prompt": self.prompt,
                "conversation_id": self.conversation_id,
                "prompt_turn_id": self.prompt_turn_id,
                "a": side(self.a_turn_id, self.a_text, self.a_checkpoint_id),
                "b": side(self.b_turn_id, self.b_text, self.b_checkpoint_id),
                "details": dict(self.details)}


@dataclass(frozen=True)
class Sample:
    """One rated turn, as the trainer and the reward mapper see it."""
    turn_id: int
    conversation_id: int
    turn_index: int
    user_id: str
    prompt: str
    response: str
    prompt_ids: list[int] = field(repr=False)
    reply_ids: list[int] = field(repr=False)
    logprobs: list[float] = field(repr=False)
    checkpoint_id: str | None
    score: int
    tags: list[str]
    comment: str
    critical: bool
    rated_at: datetime
    created_at: datetime
    temperature: float
    # True for a fresh reply a round sampled and the rating model scored: ``score`` is then
    # its predicted rating (a float in 1..5), and no turn stores it.
    predicted: bool = False
    # True for the reply the person wrote for the turn (reinf.training.rewrites): ``response``
    # and ``reply_ids`` are the rewrite's, ``score`` the rating it stands for.
    rewrite: bool = False
    # True for a reply served in a style (generation.explore_styles): sampled from the prompt
    # with an instruction, so ``logprobs`` are not the plain prompt's and PPO takes the
    # round-start pass as its behaviour policy, as for a styled rollout.
    styled: bool = False


@dataclass(frozen=True)
class StyleRatings:
    """The person's recent ratings as ``generation.explore_pick: ratings`` reads them: the
    score of every rated reply (``scores``) and, by instruction, those of the replies that
    were asked for in a style (``by_style``; reinf.training.styles.pick_style)."""
    scores: tuple[int, ...] = ()
    by_style: dict[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class RewriteSample:
    """A rewrite as a round reads it: the turn's prompt and reply, and the person's text.
    The text has no token ids: the round encodes it with the model it trains."""
    turn_id: int
    conversation_id: int
    turn_index: int
    user_id: str
    prompt: str
    text: str
    prompt_ids: list[int] = field(repr=False)
    reply: str
    reply_ids: list[int] = field(repr=False)
    written_at: datetime
    temperature: float


@dataclass(frozen=True)
class RunRecord:
    id: int
    started_at: datetime
    finished_at: datetime | None
    status: str
    trigger: str
    error: str | None
    metrics: dict[str, Any]
    samples: int
    checkpoint_id: str | None
    pid: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.id, "started_at": iso(self.started_at),
                "finished_at": iso(self.finished_at), "status": self.status,
                "trigger": self.trigger, "error": self.error, "metrics": dict(self.metrics),
                "samples": self.samples, "checkpoint_id": self.checkpoint_id}


@dataclass(frozen=True)
class CheckpointRecord:
    id: str
    path: str
    parent_id: str | None
    run_id: int | None
    created_at: datetime
    metrics: dict[str, Any]
    active: bool
    status: str

    def to_dict(self) -> dict[str, Any]:
        return {"checkpoint_id": self.id, "path": self.path, "parent_id": self.parent_id,
                "run_id": self.run_id, "created_at": iso(self.created_at),
                "metrics": dict(self.metrics), "active": self.active, "status": self.status}
