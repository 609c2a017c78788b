"""The database tables (SQLAlchemy 2.x declarative models).

Alembic migrations in ``migrations/versions`` create and change these tables;
the models here must match the newest revision (a test compares them).
Token ids and log-probs are stored compactly as little-endian int32 / float32
blobs: a 200-token reply costs 800 bytes per array instead of kilobytes of JSON.
"""
from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
from sqlalchemy import (JSON, Boolean, CheckConstraint, DateTime, Float, ForeignKey, Index,
                        Integer, LargeBinary, String, Text, text)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UTCDateTime(TypeDecorator):
    """Timestamps stored naive-UTC (SQLite has no zones) and returned timezone-aware."""
    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is not None and value.tzinfo is not None:
            value = value.astimezone(timezone.utc).replace(tzinfo=None)
        return value

    def process_result_value(self, value, dialect):
        return value.replace(tzinfo=timezone.utc) if value is not None else None


def pack_ids(ids) -> bytes:
    return np.asarray(ids, dtype="<i4").tobytes()


def unpack_ids(blob: bytes | None) -> list[int]:
    return np.frombuffer(blob, dtype="<i4").tolist() if blob else []


def pack_floats(values) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


def unpack_floats(blob: bytes | None) -> list[float]:
    return np.frombuffer(blob, dtype="<f4").tolist() if blob else []


class Base(DeclarativeBase):
    pass


class Conversation(Base):
    __tablename__ = "conversations"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, nullable=False)
    title: Mapped[str] = mapped_column(String(200), default="", nullable=False)
    user_id: Mapped[str] = mapped_column(String(100), default="local", nullable=False)
    # The system message every turn's prompt starts with; None = none. Fixed once the
    # conversation has a turn, since the turns' prompt tokens hold it.
    system_prompt: Mapped[str | None] = mapped_column(Text)
    turns: Mapped[list["Turn"]] = relationship(back_populates="conversation",
                                               cascade="all, delete-orphan",
                                               passive_deletes=True, order_by="Turn.index")


class Turn(Base):
    """One reply to one message. Turns that share a conversation and an ``index`` are
    alternatives of one slot (the same message, replies sampled again); exactly one of them,
    the ``picked`` one, is on the conversation's path: later prompts hold its reply."""
    __tablename__ = "turns"
    __table_args__ = (
        Index("uq_turn_position", "conversation_id", "index", unique=True,
              sqlite_where=text("picked"), postgresql_where=text("picked")),
        # Ids are never given twice, even after the newest turn is forgotten: a client's
        # chatcmpl-<id>, or a round's list of turns, must never name another turn.
        {"sqlite_autoincrement": True})
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    conversation_id: Mapped[int] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"), index=True, nullable=False)
    index: Mapped[int] = mapped_column(Integer, nullable=False)
    user_message: Mapped[str] = mapped_column(Text, nullable=False)
    reply: Mapped[str] = mapped_column(Text, nullable=False)
    prompt_ids: Mapped[bytes | None] = mapped_column(LargeBinary)   # int32 LE
    reply_ids: Mapped[bytes | None] = mapped_column(LargeBinary)    # int32 LE
    logprobs: Mapped[bytes | None] = mapped_column(LargeBinary)     # float32 LE, one per reply id
    checkpoint_id: Mapped[str | None] = mapped_column(String(64))   # None: the bare base model
    model: Mapped[str] = mapped_column(String(500), default="", nullable=False)
    gen_params: Mapped[dict] = mapped_column(JSON, default=dict, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, nullable=False)
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    latency_ms: Mapped[float | None] = mapped_column(Float)
    interrupted: Mapped[bool] = mapped_column(Boolean, default=False, nullable=False)
    # Set when an earlier turn of the conversation was forgotten: this turn's prompt
    # tokens held that text, so they were erased and the turn is never trained on.
    context_forgotten: Mapped[bool] = mapped_column(Boolean, default=False, nullable=False)
    # On the conversation's path (the alternative its later turns continue from).
    picked: Mapped[bool] = mapped_column(Boolean, default=True, nullable=False)
    conversation: Mapped[Conversation] = relationship(back_populates="turns")
    rating: Mapped["Rating | None"] = relationship(back_populates="turn", uselist=False,
                                                   cascade="all, delete-orphan",
                                                   passive_deletes=True)
    rewrite: Mapped["Rewrite | None"] = relationship(back_populates="turn", uselist=False,
                                                     cascade="all, delete-orphan",
                                                     passive_deletes=True)


class Rating(Base):
    __tablename__ = "ratings"
    __table_args__ = (CheckConstraint("score BETWEEN 1 AND 5", name="ck_rating_score"),
                      {"sqlite_autoincrement": True})
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    turn_id: Mapped[int] = mapped_column(ForeignKey("turns.id", ondelete="CASCADE"),
                                         unique=True, nullable=False)
    score: Mapped[int] = mapped_column(Integer, nullable=False)
    tags: Mapped[list] = mapped_column(JSON, default=list, nullable=False)
    comment: Mapped[str] = mapped_column(Text, default="", nullable=False)
    critical: Mapped[bool] = mapped_column(Boolean, default=False, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, nullable=False,
                                                 index=True)
    turn: Mapped[Turn] = relationship(back_populates="rating")


class Rewrite(Base):
    """The reply the person wrote for a turn: the one they would have wanted. One per turn;
    writing again replaces it. The trainer reads it as a pick over the turn's reply and as a
    demonstration (reinf.training.rewrites)."""
    __tablename__ = "rewrites"
    __table_args__ = ({"sqlite_autoincrement": True},)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    turn_id: Mapped[int] = mapped_column(ForeignKey("turns.id", ondelete="CASCADE"),
                                         unique=True, nullable=False)
    text: Mapped[str] = mapped_column(Text, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, nullable=False)
    turn: Mapped[Turn] = relationship(back_populates="rewrite")


PAIR_OUTCOMES = ("a", "b", "tie", "both_bad")
PAIR_SOURCES = ("compare", "regenerate")


class Pair(Base):
    """A pairwise preference: two replies to one prompt, and which one the person preferred.

    A side is a stored turn (``a_turn_id``: an alternative from regenerate) or, for replies
    that were never turns (``reinf compare``), its text and token ids in this row. Rows go
    with the turns and conversation they name (ON DELETE CASCADE); forget removes the
    text-only ones whose prompt was the forgotten message too (reinf.storage.store)."""
    __tablename__ = "pairs"
    __table_args__ = (
        CheckConstraint("outcome IN ('a', 'b', 'tie', 'both_bad')", name="ck_pair_outcome"),
        CheckConstraint("source IN ('compare', 'regenerate')", name="ck_pair_source"),
        CheckConstraint("a_turn_id IS NOT NULL OR a_text IS NOT NULL", name="ck_pair_a"),
        CheckConstraint("b_turn_id IS NOT NULL OR b_text IS NOT NULL", name="ck_pair_b"),
        {"sqlite_autoincrement": True})
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, nullable=False)
    source: Mapped[str] = mapped_column(String(20), nullable=False)      # compare | regenerate
    outcome: Mapped[str] = mapped_column(String(10), nullable=False)     # a | b | tie | both_bad
    blind: Mapped[bool] = mapped_column(Boolean, default=False, nullable=False)
    prompt: Mapped[str] = mapped_column(Text, nullable=False)            # the user message
    conversation_id: Mapped[int | None] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"), index=True)
    # The turn whose prompt (message and context) both replies answer, when there is one.
    prompt_turn_id: Mapped[int | None] = mapped_column(
        ForeignKey("turns.id", ondelete="CASCADE"), index=True)
    a_turn_id: Mapped[int | None] = mapped_column(ForeignKey("turns.id", ondelete="CASCADE"),
                                                  index=True)
    b_turn_id: Mapped[int | None] = mapped_column(ForeignKey("turns.id", ondelete="CASCADE"),
                                                  index=True)
    a_text: Mapped[str | None] = mapped_column(Text)
    b_text: Mapped[str | None] = mapped_column(Text)
    a_checkpoint_id: Mapped[str | None] = mapped_column(String(64))   # None: the bare base
    b_checkpoint_id: Mapped[str | None] = mapped_column(String(64))
    prompt_ids: Mapped[bytes | None] = mapped_column(LargeBinary)     # int32 LE, text sides
    a_reply_ids: Mapped[bytes | None] = mapped_column(LargeBinary)
    b_reply_ids: Mapped[bytes | None] = mapped_column(LargeBinary)
    # Anything else worth keeping: predicted scores, generation settings, the compare id.
    details: Mapped[dict] = mapped_column(JSON, default=dict, nullable=False)


class TrainingRun(Base):
    __tablename__ = "training_runs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, nullable=False)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # running | succeeded | failed | rejected
    status: Mapped[str] = mapped_column(String(20), default="running", nullable=False, index=True)
    trigger: Mapped[str] = mapped_column(String(20), default="manual", nullable=False)
    error: Mapped[str | None] = mapped_column(Text)
    metrics: Mapped[dict] = mapped_column(JSON, default=dict, nullable=False)
    samples: Mapped[int] = mapped_column(Integer, default=0, nullable=False)
    checkpoint_id: Mapped[str | None] = mapped_column(String(64))
    pid: Mapped[int | None] = mapped_column(Integer)
    # Ratings updated at or before this instant were visible to the run.
    ratings_until: Mapped[datetime | None] = mapped_column(UTCDateTime)


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    path: Mapped[str] = mapped_column(Text, nullable=False)
    parent_id: Mapped[str | None] = mapped_column(String(64))
    run_id: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, nullable=False)
    metrics: Mapped[dict] = mapped_column(JSON, default=dict, nullable=False)
    active: Mapped[bool] = mapped_column(Boolean, default=False, nullable=False)
    # promoted | rejected | deleted (files removed by retention; the row stays for lineage)
    status: Mapped[str] = mapped_column(String(20), default="promoted", nullable=False)
