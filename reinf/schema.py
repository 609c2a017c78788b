"""The database tables (SQLAlchemy 2.x declarative models).

Alembic migrations in ``migrations/versions`` create and change these tables;
the models here must match the newest revision (a test compares them).
Token ids and log-probs are stored compactly as little-endian int32 / float32
blobs: a 200-token reply costs 800 bytes per array instead of kilobytes of JSON.
"""
from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
from sqlalchemy import (JSON, Boolean, CheckConstraint, DateTime, Float, ForeignKey, Integer,
                        LargeBinary, String, Text, UniqueConstraint)
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
    __tablename__ = "turns"
    __table_args__ = (UniqueConstraint("conversation_id", "index", name="uq_turn_position"),)
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
    conversation: Mapped[Conversation] = relationship(back_populates="turns")
    rating: Mapped["Rating | None"] = relationship(back_populates="turn", uselist=False,
                                                   cascade="all, delete-orphan",
                                                   passive_deletes=True)


class Rating(Base):
    __tablename__ = "ratings"
    __table_args__ = (CheckConstraint("score BETWEEN 1 AND 5", name="ck_rating_score"),)
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
