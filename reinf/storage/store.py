"""The store: every read and write of conversations, turns, ratings, runs and checkpoints.

All later parts (engine, trainer, web UI, CLI) go through this API; nothing else
touches the tables. Methods return plain records (reinf.records), never ORM
objects. Writes run in ``BEGIN IMMEDIATE`` transactions (see reinf.storage.db).
"""
from __future__ import annotations

import json
import logging
import math
import re
import time
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Callable, Iterator, Sequence

from sqlalchemy import Text, and_, cast, delete, exists, func, not_, or_, select, text, update
from sqlalchemy.exc import DataError, OperationalError
from sqlalchemy.orm import Session, aliased, selectinload

from reinf.errors import BadInput, Conflict, NotFound, StoreError
from reinf.records import (CheckpointRecord, ConversationRecord, PairRecord, RatingRecord,
                           RewriteRecord, RewriteSample, RunRecord, Sample, StyleRatings,
                           TurnRecord, iso)
from reinf.rewards.hooks import FORGOTTEN, MIN_REDACTED
from reinf.storage import db
from reinf.storage.permissions import secure_data_dir
from reinf.storage.schema import (PAIR_OUTCOMES, PAIR_SOURCES, Checkpoint, Conversation, Pair,
                                  Rating, Rewrite, TrainingRun, Turn, pack_floats, pack_ids,
                                  unpack_floats, unpack_ids, utcnow)

MAX_TAGS = 20
MAX_TAG_CHARS = 64
MAX_COMMENT_CHARS = 4000
MAX_REWRITE_CHARS = 20_000
RUN_STATUSES = ("running", "succeeded", "failed", "rejected")
# OpenAI completion ids (webui/openai_api.py): a finished reply's is chatcmpl-<turn id>; the
# early chunks of a streamed one carry chatcmpl-stream-<uuid4 hex>, kept in its turn's
# gen_params["stream_id"], since the turn id is not known yet when they are sent.
COMPLETION_PREFIX = "chatcmpl-"
STREAM_PREFIX = "chatcmpl-stream-"
STREAM_ID = re.compile(r"[0-9a-f]{32}")
TURN_FORMS = "`last`, a turn number, or an OpenAI completion id `chatcmpl-…`"
AMBIGUOUS_SHOWN = 10  # candidates an ambiguous checkpoint prefix lists
# Forget empties the WAL; while another program holds a read transaction it cannot. It
# tries this often, waiting this long each time, rather than the whole busy timeout.
SCRUB_TRIES = 3
SCRUB_WAIT_MS = 200
WAL_BUSY = ("another program is reading the database, so the forgotten text stays in the "
            "write-ahead log (the database's -wal file) until it finishes; Reinf empties it then (at the "
            "next forget, while the server runs, or when it stops)")
log = logging.getLogger("reinf.storage.store")


def check_score(score: Any) -> int:
    """A rating score must be a whole number 1-5 (``"4"`` is accepted, ``4.5`` and ``True`` not)."""
    if isinstance(score, bool):
        raise BadInput(f"score must be a whole number from 1 to 5, got {score!r}")
    if isinstance(score, str) and score.strip().lstrip("-").isdigit():
        score = int(score.strip())
    if isinstance(score, float) and score.is_integer():
        score = int(score)
    if not isinstance(score, int) or not 1 <= score <= 5:
        raise BadInput(f"score must be a whole number from 1 to 5, got {score!r}",
                       fix="rate with 1 (bad) … 5 (great)")
    return score


def check_text(value: str, name: str) -> str:
    """Text the DB can hold: UTF-8 encodable. A lone surrogate ("\\ud800", which JSON and
    surrogate-escaped argv can carry) would fail or, inside a JSON column, be stored and
    break every later read."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadInput(f"{name} holds a character that is not valid Unicode text (a lone "
                       f"surrogate, {value[exc.start]!r}, at position {exc.start})",
                       fix="send UTF-8 text; remove or replace that character") from None
    return value


def check_system_prompt(value: Any) -> str | None:
    """A system prompt as stored: the text without surrounding whitespace; None (or blank)
    means none."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadInput(f"the system prompt must be text, got {type(value).__name__}",
                       key="system_prompt")
    return check_text(value.strip(), "the system prompt") or None


def title_of(message: str) -> str:
    """A conversation's title, derived from its first message."""
    return " ".join(message.split())[:60]


def check_tags(tags: Any) -> list[str]:
    if tags is None:
        return []
    if isinstance(tags, str):
        tags = tags.split(",")
    if not isinstance(tags, (list, tuple)) or not all(isinstance(t, str) for t in tags):
        raise BadInput("tags must be a list of strings", fix='e.g. ["too long", "wrong"]')
    out: list[str] = []
    for tag in (t.strip() for t in tags):
        if tag and tag not in out:
            check_text(tag, "a tag")
            if len(tag) > MAX_TAG_CHARS:
                raise BadInput(f"tag {tag[:20]!r}… is longer than {MAX_TAG_CHARS} characters")
            out.append(tag)
    if len(out) > MAX_TAGS:
        raise BadInput(f"at most {MAX_TAGS} tags per rating, got {len(out)}")
    return out


class Store:
    def __init__(self, url: str, *, busy_timeout_ms: int = 15_000, migrate: bool = True,
                 check: bool = True):
        self.url = url
        self.wal_pending = False  # a forget could not empty the WAL (a reader held it)
        self.data_dir = None  # where reward_hook_error.json is (set by open)
        self.engine = db.create_db_engine(url, busy_timeout_ms)
        self._write_engine = self.engine.execution_options(sqlite_begin="IMMEDIATE")
        try:
            if check:  # damaged, locked by another program: one clear error, before migrating
                db.check_database(self.engine)
            if migrate:
                db.upgrade(self.engine)
        except BaseException:
            self.engine.dispose()  # a failed start-up leaves no connection open
            raise

    @classmethod
    def open(cls, config, *, migrate: bool = True) -> "Store":
        """The store for a config: creates the data dir (700; one made 755 by an older Reinf
        is tightened, see reinf.storage.permissions), checks the database (SQLite: ``PRAGMA
        quick_check``) and brings the schema up to date."""
        db.check_directory(config.data_dir)
        secure_data_dir(config)
        store = cls(config.db_url, busy_timeout_ms=config.storage.busy_timeout_ms,
                    migrate=migrate)
        store.data_dir = config.data_dir
        return store

    @classmethod
    def open_existing(cls, config) -> "Store":
        """The store for a command that only reads (``reinf status``): it never creates a
        database nor migrates one. A ``db_url`` that points somewhere unexpected (another
        application's database) is reported, not filled with Reinf's tables."""
        from reinf.storage.permissions import sqlite_file

        path = sqlite_file(config.db_url)
        if path is not None and not path.exists():
            raise StoreError(f"there is no Reinf database at {path} yet",
                             fix="run `reinf init` to create it (`reinf serve` does too), or "
                                 "set REINF_HOME or REINF_DB_URL to where it is")
        store = cls.open(config, migrate=False)
        try:
            db.require_schema(store.engine)
        except BaseException:
            store.close()
            raise
        return store

    def close(self) -> None:
        try:
            self.retry_scrub()  # a reader kept a forget from emptying the WAL: try once more
        except Exception:  # noqa: BLE001 - closing must not fail
            log.debug("WAL checkpoint at close failed", exc_info=True)
        self.engine.dispose()

    @contextmanager
    def _session(self, write: bool) -> Iterator[Session]:
        try:
            with Session(self._write_engine if write else self.engine,
                         expire_on_commit=False) as session, session.begin():
                yield session
        except OperationalError as exc:
            raise StoreError(f"database error: {exc.orig}",
                             fix="check the disk and that no other program holds the DB") from exc
        except DataError as exc:  # PostgreSQL: a NUL in text, an over-long VARCHAR
            raise BadInput(f"the database cannot store that value: "
                           f"{str(exc.orig).splitlines()[0]}",
                           fix="remove NUL (\\u0000) characters and shorten the value") from None

    # --- conversations ----------------------------------------------------------------

    def create_conversation(self, title: str = "", user_id: str = "local", *,
                            system_prompt: str | None = None) -> ConversationRecord:
        """A new conversation; ``system_prompt`` is stored as given (None: it has none)."""
        check_text(title, "the title")
        check_text(user_id or "", "the user id")
        system_prompt = check_system_prompt(system_prompt)
        with self._session(write=True) as s:
            conv = Conversation(title=title[:200], user_id=user_id or "local",
                                system_prompt=system_prompt)
            s.add(conv)
            s.flush()
            return _conversation(conv, 0)

    def update_conversation(self, conversation_id: int, *,
                            system_prompt: str | None) -> ConversationRecord:
        """Set a conversation's system prompt (None or blank: none), only while it has no
        turns: their prompt tokens hold the one they were generated with (Conflict after)."""
        system_prompt = check_system_prompt(system_prompt)
        with self._session(write=True) as s:
            conv = s.get(Conversation, conversation_id, with_for_update=True)
            if conv is None:
                raise NotFound(f"no conversation {conversation_id}",
                               fix="list them with `reinf history`")
            n = s.scalar(select(func.count()).where(Turn.conversation_id == conversation_id))
            if n:
                raise Conflict(f"conversation {conversation_id} already has {n} "
                               f"turn{'s' if n != 1 else ''}; its system prompt is fixed",
                               fix="start a new conversation with the system prompt you want",
                               key="system_prompt")
            conv.system_prompt = system_prompt
            return _conversation(conv, 0)

    def get_conversation(self, conversation_id: int) -> ConversationRecord:
        with self._session(write=False) as s:
            conv = s.get(Conversation, conversation_id)
            if conv is None:
                raise NotFound(f"no conversation {conversation_id}",
                               fix="list them with `reinf history`")
            n = s.scalar(select(func.count()).where(Turn.conversation_id == conversation_id))
            return _conversation(conv, n or 0)

    def list_conversations(self, limit: int = 50, offset: int = 0) -> list[ConversationRecord]:
        with self._session(write=False) as s:
            counts = (select(Turn.conversation_id, func.count().label("n"))
                      .group_by(Turn.conversation_id).subquery())
            rows = s.execute(select(Conversation, func.coalesce(counts.c.n, 0))
                             .outerjoin(counts, counts.c.conversation_id == Conversation.id)
                             .order_by(Conversation.updated_at.desc(), Conversation.id.desc())
                             .limit(limit).offset(offset)).all()
            return [_conversation(c, n) for c, n in rows]

    def conversation_turns(self, conversation_id: int, *,
                           alternatives: bool = False) -> list[TurnRecord]:
        """The conversation's turns, oldest first: its path, the picked turn of each slot (the
        engine builds its context from these); with ``alternatives``, every turn."""
        self.get_conversation(conversation_id)
        return self.history(conversation_id=conversation_id, limit=None, oldest_first=True,
                            picked=None if alternatives else True)

    # --- turns ------------------------------------------------------------------------

    def append_turn(self, conversation_id: int, user_message: str, reply: str, *,
                    prompt_ids: Sequence[int] = (), reply_ids: Sequence[int] = (),
                    logprobs: Sequence[float] = (), checkpoint_id: str | None = None,
                    model: str = "", gen_params: dict | None = None,
                    ttft_ms: float | None = None, latency_ms: float | None = None,
                    interrupted: bool = False,
                    context_turn_ids: Sequence[int] | None = None,
                    slot: int | None = None, picked: bool = True) -> TurnRecord:
        """Store a turn. ``context_turn_ids``: the earlier turns whose text went into its
        prompt. One forgotten while the reply was generated (it is gone now) makes the new
        turn ``context_forgotten``, as forget does for the turns after the one it deletes:
        its prompt tokens are not kept and it is never trained on.

        ``slot``: the index of the conversation's last turn, for another reply to its message
        (an alternative; Conflict if the conversation went on meanwhile). ``picked``: the new
        turn becomes the slot's picked one, the one later turns continue from; a new slot's
        first turn is always picked."""
        if len(logprobs) != len(reply_ids):
            raise BadInput(f"{len(logprobs)} log-probs for {len(reply_ids)} reply tokens")
        if not all(math.isfinite(x) for x in logprobs):
            raise BadInput("behaviour log-probs must be finite")
        check_text(user_message, "the message")
        check_text(reply, "the reply")
        with self._session(write=True) as s:
            # FOR UPDATE: on PostgreSQL two appends would both read the same max(index)
            # (SQLite's BEGIN IMMEDIATE already queues them; it ignores FOR UPDATE).
            conv = s.get(Conversation, conversation_id, with_for_update=True)
            if conv is None:
                raise NotFound(f"no conversation {conversation_id}")
            last = s.scalar(select(func.max(Turn.index))
                            .where(Turn.conversation_id == conversation_id)) or 0
            index, first = last + 1, True
            if slot is not None:
                if slot < last:
                    raise Conflict(f"conversation {conversation_id} went on after that reply; "
                                   "only the last reply of a conversation can have "
                                   "alternatives", fix="regenerate the last reply")
                index, first = slot, slot > last
                if picked or first:  # one picked turn per slot
                    s.execute(update(Turn).where(Turn.conversation_id == conversation_id,
                                                 Turn.index == index).values(picked=False))
            forgotten = False
            if context_turn_ids:  # in this transaction: a forget commits before or after it
                wanted = set(context_turn_ids)
                left = s.scalar(select(func.count()).select_from(Turn).where(
                    Turn.conversation_id == conversation_id, Turn.id.in_(wanted)))
                forgotten = (left or 0) < len(wanted)
            turn = Turn(conversation_id=conversation_id, index=index,
                        user_message=user_message, reply=reply,
                        prompt_ids=None if forgotten else pack_ids(prompt_ids),
                        reply_ids=pack_ids(reply_ids), context_forgotten=forgotten,
                        logprobs=pack_floats(logprobs), checkpoint_id=checkpoint_id,
                        model=model, gen_params=gen_params or {}, ttft_ms=ttft_ms,
                        latency_ms=latency_ms, interrupted=interrupted,
                        picked=picked or first)
            s.add(turn)
            conv.updated_at = utcnow()
            if not conv.title:
                conv.title = title_of(user_message)
            s.flush()
            n = 1 if first else s.scalar(select(func.count()).where(
                Turn.conversation_id == conversation_id, Turn.index == index))
            return _turn(turn, conv.user_id, alternatives=n)

    def cut_reply(self, turn_id: int, reply: str, reply_ids: Sequence[int],
                  logprobs: Sequence[float]) -> TurnRecord:
        """Shorten a stored reply to its first tokens (``reply`` is their text), marked
        interrupted: a terminal cut a reply the engine had already finished and stored,
        and only what the person saw is kept (reinf.serving.chat.ChatStream)."""
        if len(logprobs) != len(reply_ids):
            raise BadInput(f"{len(logprobs)} log-probs for {len(reply_ids)} reply tokens")
        with self._session(write=True) as s:
            turn = s.get(Turn, turn_id)
            if turn is None:
                raise NotFound(f"no turn {turn_id}")
            if unpack_ids(turn.reply_ids)[:len(reply_ids)] != list(reply_ids):
                raise BadInput(f"turn {turn_id}: the tokens to keep are not its first ones")
            turn.reply, turn.interrupted = reply, True
            turn.reply_ids, turn.logprobs = pack_ids(reply_ids), pack_floats(logprobs)
        return self.get_turn(turn_id)

    def get_turn(self, turn_id: int) -> TurnRecord:
        with self._session(write=False) as s:
            turn = s.get(Turn, turn_id, options=[selectinload(Turn.rating),
                                                 selectinload(Turn.rewrite),
                                                 selectinload(Turn.conversation)])
            if turn is None:
                raise NotFound(f"no turn {turn_id}", fix="see `reinf history` for turn ids")
            return _turn(turn, alternatives=_slot_sizes(s, [turn])[turn.conversation_id,
                                                                   turn.index])

    def last_turn(self) -> TurnRecord | None:
        with self._session(write=False) as s:
            turn_id = s.scalar(select(Turn.id).order_by(Turn.id.desc()).limit(1))
        return self.get_turn(turn_id) if turn_id is not None else None

    def resolve_turn(self, ref: str) -> int:
        """The id of the turn ``ref`` names, as a person or an OpenAI client gives it:
        ``last``, a turn number, or a completion id (``chatcmpl-<turn id>``, or
        ``chatcmpl-stream-<hex>`` from a streamed reply's early chunks, which is what the
        ``llm`` CLI logs). A number is not looked up: the caller's own lookup says 404."""
        ref = ref.strip()
        if ref == "last":
            last = self.last_turn()
            if last is None:
                raise NotFound("there are no turns yet", fix="chat first: `reinf chat`")
            return last.id
        if ref.startswith(STREAM_PREFIX) and STREAM_ID.fullmatch(ref[len(STREAM_PREFIX):]):
            return self.turn_of_stream(ref[len(STREAM_PREFIX):])
        digits = ref.removeprefix(COMPLETION_PREFIX)
        if not (digits.isascii() and digits.isdigit()) or len(digits) > 18 or int(digits) < 1:
            raise BadInput(f"not a turn: {_clip(ref)!r}", fix=f"give {TURN_FORMS}")
        return int(digits)

    def turn_of_stream(self, stream_id: str) -> int:
        """The turn a streamed completion stored, by the hex id of its early chunks."""
        # A LIKE on the JSON text (as _tag_may_match) runs on SQLite and PostgreSQL alike and
        # reads no row's JSON but the few it keeps; the exact test is in Python.
        query = (select(Turn.id, Turn.gen_params)
                 .where(cast(Turn.gen_params, Text).contains(stream_id, autoescape=True)))
        with self._session(write=False) as s:
            rows = s.execute(query).all()
        for turn_id, params in rows:
            if isinstance(params, dict) and params.get("stream_id") == stream_id:
                return turn_id
        raise NotFound(f"no turn for the completion {STREAM_PREFIX}{stream_id}",
                       fix="it was forgotten, or streamed before Reinf kept these ids; "
                           "`reinf history` lists the turns")

    # --- ratings ----------------------------------------------------------------------

    def rate(self, turn_id: int, score: Any, *, tags: Any = None, comment: str | None = "",
             critical: bool = False) -> RatingRecord:
        """Rate a turn, or replace its rating (one rating per turn)."""
        score = check_score(score)
        tags = check_tags(tags)
        comment = comment or ""
        if not isinstance(comment, str) or len(comment) > MAX_COMMENT_CHARS:
            raise BadInput(f"comment must be text of at most {MAX_COMMENT_CHARS} characters")
        check_text(comment, "the comment")
        if not isinstance(critical, bool):
            raise BadInput(f"critical must be true or false, got {critical!r}")
        with self._session(write=True) as s:
            _require_turn(s, turn_id, lock=True)  # one rating per turn
            rating = s.scalar(select(Rating).where(Rating.turn_id == turn_id))
            now = utcnow()
            if rating is None:
                rating = Rating(turn_id=turn_id, created_at=now)
                s.add(rating)
            rating.score, rating.tags, rating.comment = score, tags, comment
            rating.critical, rating.updated_at = critical, now
            s.flush()
            return _rating(rating)

    def undo_rating(self, turn_id: int | None = None) -> RatingRecord | None:
        """Delete the rating of ``turn_id``, or the most recently made one. Returns what went
        (None: there was no rating). A turn that does not exist is NotFound, as for rate()."""
        with self._session(write=True) as s:
            if turn_id is not None:
                _require_turn(s, turn_id)
            query = select(Rating)
            query = (query.where(Rating.turn_id == turn_id) if turn_id is not None
                     else query.order_by(Rating.updated_at.desc(), Rating.id.desc()).limit(1))
            rating = s.scalar(query)
            if rating is None:
                return None
            record = _rating(rating)
            s.delete(rating)
            return record

    # --- rewrites ---------------------------------------------------------------------

    def rewrite(self, turn_id: int, text: Any) -> RewriteRecord:
        """Store the reply the person wrote for a turn (the one they would have wanted), or
        replace it (one rewrite per turn). The next round reads it as a pick over the turn's
        reply and as a demonstration (reinf.training.rewrites)."""
        if not isinstance(text, str) or not text.strip():
            raise BadInput("a rewrite must be the reply you wanted, as text; got "
                           + ("an empty one" if isinstance(text, str) else type(text).__name__),
                           fix="write the reply you would have wanted; to take a rewrite "
                               "back, remove it", key="text")
        if len(text) > MAX_REWRITE_CHARS:
            raise BadInput(f"a rewrite holds at most {MAX_REWRITE_CHARS:,} characters, got "
                           f"{len(text):,}", fix="shorten it", key="text")
        check_text(text, "the rewrite")
        with self._session(write=True) as s:
            _require_turn(s, turn_id, lock=True)  # one rewrite per turn
            row = s.scalar(select(Rewrite).where(Rewrite.turn_id == turn_id))
            now = utcnow()
            if row is None:
                row = Rewrite(turn_id=turn_id, created_at=now)
                s.add(row)
            row.text, row.updated_at = text, now
            s.flush()
            return _rewrite(row)

    def get_rewrite(self, turn_id: int) -> RewriteRecord | None:
        """The turn's rewrite, None when it has none (NotFound: no such turn)."""
        with self._session(write=False) as s:
            _require_turn(s, turn_id)
            row = s.scalar(select(Rewrite).where(Rewrite.turn_id == turn_id))
            return _rewrite(row) if row else None

    def delete_rewrite(self, turn_id: int) -> RewriteRecord | None:
        """Remove the turn's rewrite; returns what went (None: it had none)."""
        with self._session(write=True) as s:
            _require_turn(s, turn_id)
            row = s.scalar(select(Rewrite).where(Rewrite.turn_id == turn_id))
            if row is None:
                return None
            record = _rewrite(row)
            s.delete(row)
            return record

    def training_rewrites(self, limit: int, *,
                          until: datetime | None = None) -> list[RewriteSample]:
        """The newest ``limit`` rewrites written by ``until`` (None: any time) of turns that
        can still be trained on (a turn whose context was forgotten cannot), with the turn's
        prompt and reply: what a round reads (reinf.training.rewrites)."""
        query = (select(Rewrite, Turn, Conversation.user_id).select_from(Rewrite)
                 .join(Turn, Rewrite.turn_id == Turn.id)
                 .join(Conversation, Turn.conversation_id == Conversation.id)
                 .where(Turn.context_forgotten.is_(False))
                 .order_by(Rewrite.updated_at.desc(), Rewrite.id.desc()).limit(limit))
        if until is not None:
            query = query.where(Rewrite.updated_at <= until)
        with self._session(write=False) as s:
            rows = s.execute(query).all()
            return [RewriteSample(
                turn_id=turn.id, conversation_id=turn.conversation_id, turn_index=turn.index,
                user_id=user_id, prompt=turn.user_message, text=rewrite.text,
                prompt_ids=unpack_ids(turn.prompt_ids), reply=turn.reply,
                reply_ids=unpack_ids(turn.reply_ids), written_at=rewrite.updated_at,
                temperature=float((turn.gen_params or {}).get("temperature", 1.0)))
                for rewrite, turn, user_id in rows]

    def rewrites_since(self, since: datetime | None) -> int:
        """How many rewrites were written (or written again) after ``since`` (None: ever)."""
        with self._session(write=False) as s:
            query = select(func.count()).select_from(Rewrite)
            if since is not None:
                query = query.where(Rewrite.updated_at > since)
            return s.scalar(query) or 0

    # --- alternatives and pairs -------------------------------------------------------

    def alternatives(self, turn_id: int) -> list[TurnRecord]:
        """Every turn of ``turn_id``'s slot (its conversation and index), oldest first: the
        replies to the same message; one of them is ``picked``."""
        turn = self.get_turn(turn_id)
        return [t for t in self.history(conversation_id=turn.conversation_id, limit=None,
                                        oldest_first=True) if t.index == turn.index]

    def pick_alternative(self, turn_id: int, *,
                         record: bool = True) -> tuple[TurnRecord, list[PairRecord]]:
        """Make ``turn_id`` the picked turn of its slot, the one the conversation continues
        from, and (``record``) the person's preference: a ``regenerate`` pair of it against
        each other alternative (picking again replaces the outcome of a pair already there).
        Only the last slot of a conversation can change its pick (Conflict otherwise: later
        turns were generated after the picked one); re-picking the picked turn of an earlier
        slot records the pairs and changes nothing else."""
        with self._session(write=True) as s:
            turn = s.get(Turn, turn_id, with_for_update=True)
            if turn is None:
                raise NotFound(f"no turn {turn_id}", fix="see `reinf history` for turn ids")
            last = s.scalar(select(func.max(Turn.index))
                            .where(Turn.conversation_id == turn.conversation_id))
            if not turn.picked and turn.index < last:
                raise Conflict(f"turn {turn_id} is an alternative of an earlier reply; the "
                               "conversation went on from another one, so it cannot be picked "
                               "now", fix="pick among the alternatives of the last reply")
            others = s.scalars(select(Turn).where(
                Turn.conversation_id == turn.conversation_id, Turn.index == turn.index,
                Turn.id != turn.id).order_by(Turn.id)).all()
            if not turn.picked:
                s.execute(update(Turn).where(Turn.conversation_id == turn.conversation_id,
                                             Turn.index == turn.index).values(picked=False))
                s.flush()
                turn.picked = True
            pairs = []
            for other in others if record else ():
                pair = s.scalar(select(Pair).where(
                    Pair.source == "regenerate",
                    or_(and_(Pair.a_turn_id == turn.id, Pair.b_turn_id == other.id),
                        and_(Pair.a_turn_id == other.id, Pair.b_turn_id == turn.id))))
                if pair is None:
                    pair = Pair(source="regenerate", blind=False, prompt=turn.user_message,
                                conversation_id=turn.conversation_id, a_turn_id=turn.id,
                                b_turn_id=other.id, a_checkpoint_id=turn.checkpoint_id,
                                b_checkpoint_id=other.checkpoint_id, details={})
                    s.add(pair)
                pair.outcome = "a" if pair.a_turn_id == turn.id else "b"
                pair.created_at = utcnow()
                pairs.append(pair)
            conv = s.get(Conversation, turn.conversation_id)
            conv.updated_at = utcnow()
            s.flush()
            texts = {turn.id: turn.reply, **{o.id: o.reply for o in others}}
            records = [_pair(p, texts) for p in pairs]
        return self.get_turn(turn_id), records

    def add_pair(self, prompt: str, outcome: str, **fields: Any) -> PairRecord:
        """Store a pairwise preference (see ``add_pairs``)."""
        return self.add_pairs([dict(fields, prompt=prompt, outcome=outcome)])[0]

    def add_pairs(self, rows: Sequence[dict[str, Any]]) -> list[PairRecord]:
        """Store pairwise preferences, all or none. Each row: ``prompt``, ``outcome`` (a, b,
        tie, both_bad), ``source`` (compare, regenerate; default compare), ``blind``, and a
        side each: ``a_turn_id`` (a stored turn; its checkpoint is the turn's) or ``a_text``
        with ``a_checkpoint_id`` (None: base) and ``a_reply_ids``; the same for ``b``.
        ``prompt_turn_id``: the turn whose prompt both replies answer, ``prompt_ids`` its ids;
        the pair goes when that turn is forgotten, and one already gone is NotFound here, so
        no forgotten text comes back. ``details``: a JSON object kept with it."""
        checked = [_check_pair(dict(row)) for row in rows]
        with self._session(write=True) as s:
            out = []
            for row in checked:
                turns = {}
                for turn_id in {row["a_turn_id"], row["b_turn_id"], row["prompt_turn_id"]} - {None}:
                    turn = s.get(Turn, turn_id)
                    if turn is None:
                        raise NotFound(f"no turn {turn_id} (forgotten?)",
                                       fix="see `reinf history` for turn ids")
                    turns[turn_id] = turn
                for side in ("a", "b"):
                    if row[f"{side}_turn_id"] is not None:
                        row[f"{side}_checkpoint_id"] = turns[row[f"{side}_turn_id"]].checkpoint_id
                conversation_id = next((turns[t].conversation_id for t in (
                    row["prompt_turn_id"], row["a_turn_id"], row["b_turn_id"]) if t in turns),
                    None)
                pair = Pair(conversation_id=conversation_id, **{
                    k: (pack_ids(v) if v else None) if k in PAIR_ID_FIELDS else v
                    for k, v in row.items()})
                s.add(pair)
                s.flush()
                out.append(_pair(pair, {t.id: t.reply for t in turns.values()}))
            return out

    def list_pairs(self, *, limit: int | None = 50, source: str | None = None,
                   outcome: str | None = None, conversation_id: int | None = None,
                   turn_id: int | None = None, checkpoint_id: str | None = ...,
                   since: datetime | None = None) -> list[PairRecord]:
        """Pairs, newest first. Filters: ``source``, ``outcome``, ``conversation_id``,
        ``turn_id`` (either side, or the prompt's turn), ``checkpoint_id`` (either side;
        None: the base), ``since``."""
        if source is not None and source not in PAIR_SOURCES:
            raise BadInput(f"source must be one of {', '.join(PAIR_SOURCES)}", key="source")
        if outcome is not None and outcome not in PAIR_OUTCOMES:
            raise BadInput(f"outcome must be one of {', '.join(PAIR_OUTCOMES)}", key="outcome")
        query = select(Pair).order_by(Pair.id.desc()).limit(limit)
        if source is not None:
            query = query.where(Pair.source == source)
        if outcome is not None:
            query = query.where(Pair.outcome == outcome)
        if conversation_id is not None:
            query = query.where(Pair.conversation_id == conversation_id)
        if turn_id is not None:
            query = query.where(or_(Pair.a_turn_id == turn_id, Pair.b_turn_id == turn_id,
                                    Pair.prompt_turn_id == turn_id))
        if checkpoint_id is not ...:
            query = query.where(or_(Pair.a_checkpoint_id == checkpoint_id,
                                    Pair.b_checkpoint_id == checkpoint_id)
                                if checkpoint_id is not None else
                                or_(Pair.a_checkpoint_id.is_(None),
                                    Pair.b_checkpoint_id.is_(None)))
        if since is not None:
            query = query.where(Pair.created_at >= since)
        with self._session(write=False) as s:
            pairs = s.scalars(query).all()
            ids = {i for p in pairs for i in (p.a_turn_id, p.b_turn_id) if i is not None}
            texts = dict(s.execute(select(Turn.id, Turn.reply).where(Turn.id.in_(ids))).all()) \
                if ids else {}
            return [_pair(p, texts) for p in pairs]

    def recent_prompts(self, limit: int = 20) -> list[dict[str, Any]]:
        """The person's recent distinct messages, newest first, each with the newest turn
        that holds it: ``{"prompt", "turn_id", "conversation_id", "created_at"}`` (for the
        compare page's picker)."""
        newest = (select(func.max(Turn.id).label("id")).group_by(Turn.user_message)
                  .subquery())
        query = (select(Turn.id, Turn.user_message, Turn.conversation_id, Turn.created_at)
                 .join(newest, newest.c.id == Turn.id).order_by(Turn.id.desc()).limit(limit))
        with self._session(write=False) as s:
            return [{"prompt": message, "turn_id": turn_id, "conversation_id": cid,
                     "created_at": iso(created)}
                    for turn_id, message, cid, created in s.execute(query).all()]

    # --- queries ----------------------------------------------------------------------

    def history(self, *, limit: int | None = 20, conversation_id: int | None = None,
                rated: bool | None = None, min_score: int | None = None,
                max_score: int | None = None, tag: str | None = None,
                since: datetime | None = None, until: datetime | None = None,
                oldest_first: bool = False, picked: bool | None = None) -> list[TurnRecord]:
        """Turns with their ratings, newest first unless ``oldest_first``; at most ``limit``
        rows are read (None: all). ``picked``: only the turns on (True) or off (False) their
        conversation's path; None: every alternative too."""
        if limit is not None and limit <= 0:
            return []
        query = select(Turn).options(selectinload(Turn.rating), selectinload(Turn.rewrite),
                                     selectinload(Turn.conversation))
        if conversation_id is not None:
            query = query.where(Turn.conversation_id == conversation_id)
        if picked is not None:
            query = query.where(Turn.picked.is_(picked))
        if rated is not None or min_score is not None or max_score is not None or tag:
            query = query.join(Rating, isouter=rated is False)
            query = query.where(Rating.id.is_(None)) if rated is False else query
        if min_score is not None:
            query = query.where(Rating.score >= min_score)
        if max_score is not None:
            query = query.where(Rating.score <= max_score)
        if since is not None:
            query = query.where(Turn.created_at >= since)
        if until is not None:
            query = query.where(Turn.created_at <= until)
        if tag:
            query = query.where(_tag_may_match(tag))
        query = query.order_by(Turn.id.asc() if oldest_first else Turn.id.desc())
        records: list[TurnRecord] = []
        with self._session(write=False) as s:
            while True:  # one page, unless the tag pre-filter let rows through that miss it
                want = None if limit is None else limit - len(records)
                page = s.scalars(query.limit(want)).all()
                kept = [t for t in page if not tag or (t.rating and tag in (t.rating.tags or []))]
                sizes = _slot_sizes(s, kept)
                records += [_turn(t, alternatives=sizes[t.conversation_id, t.index])
                            for t in kept]
                if want is None or len(page) < want or len(records) >= limit:
                    return records
                last = page[-1].id  # keyset paging: go on after the last row read
                query = query.where(Turn.id > last if oldest_first else Turn.id < last)

    def training_samples(self, limit: int) -> list[Sample]:
        """Rated turns usable for training, most recently rated first, at most ``limit``."""
        query = (select(Turn, Rating, Conversation.user_id).join(Rating).join(Conversation)
                 .where(Turn.context_forgotten.is_(False))
                 .order_by(Rating.updated_at.desc(), Rating.id.desc()).limit(limit))
        with self._session(write=False) as s:
            rows = s.execute(query).all()
        samples = []
        for turn, rating, user_id in rows:
            reply_ids = unpack_ids(turn.reply_ids)
            if not reply_ids:  # e.g. a reply stopped before its first token
                continue
            samples.append(Sample(
                turn_id=turn.id, conversation_id=turn.conversation_id, turn_index=turn.index,
                user_id=user_id, prompt=turn.user_message, response=turn.reply,
                prompt_ids=unpack_ids(turn.prompt_ids), reply_ids=reply_ids,
                logprobs=unpack_floats(turn.logprobs), checkpoint_id=turn.checkpoint_id,
                score=rating.score, tags=list(rating.tags), comment=rating.comment,
                critical=rating.critical, rated_at=rating.updated_at,
                created_at=turn.created_at,
                temperature=float((turn.gen_params or {}).get("temperature", 1.0)),
                styled=bool((turn.gen_params or {}).get("style"))))
        return samples

    def style_ratings(self, limit: int = 1000) -> StyleRatings:
        """The scores of the ``limit`` most recently rated replies, and by style those of
        the ones served in a style (``gen_params["style"]``, generation.explore_styles)."""
        query = (select(Rating.score, Turn.gen_params).join(Turn, Rating.turn_id == Turn.id)
                 .order_by(Rating.updated_at.desc(), Rating.id.desc()).limit(limit))
        with self._session(write=False) as s:
            rows = s.execute(query).all()
        by_style: dict[str, list[int]] = {}
        for score, params in rows:
            style = (params or {}).get("style")
            if isinstance(style, str) and style:
                by_style.setdefault(style, []).append(score)
        return StyleRatings(scores=tuple(score for score, _ in rows),
                            by_style={k: tuple(v) for k, v in by_style.items()})

    def ratings_waiting(self) -> int:
        """Ratings made or changed since the last finished (succeeded or rejected) round."""
        with self._session(write=False) as s:
            until = s.scalar(select(func.max(TrainingRun.ratings_until))
                             .where(TrainingRun.status.in_(("succeeded", "rejected"))))
            query = select(func.count()).select_from(Rating)
            if until is not None:
                query = query.where(Rating.updated_at > until)
            return s.scalar(query) or 0

    def counts(self) -> dict[str, int]:
        with self._session(write=False) as s:
            return {name: s.scalar(select(func.count()).select_from(model)) or 0
                    for name, model in (("conversations", Conversation), ("turns", Turn),
                                        ("ratings", Rating), ("training_runs", TrainingRun),
                                        ("checkpoints", Checkpoint), ("pairs", Pair))}

    # --- forget -----------------------------------------------------------------------

    def forget_turn(self, turn_id: int) -> dict[str, int]:
        """Delete a turn, its rating and the pairs that hold it. Later turns of its
        conversation carried its text in their prompt tokens (if it was the picked one of its
        slot), so those tokens are erased and the turns never trained on; another
        alternative of its slot, the newest, becomes the picked one. A title taken from its
        message is taken again from the first turn left, or blanked."""
        with self._session(write=True) as s:
            turn = s.get(Turn, turn_id)
            if turn is None:
                raise NotFound(f"no turn {turn_id}")
            siblings = s.scalars(select(Turn).where(
                Turn.conversation_id == turn.conversation_id, Turn.index == turn.index,
                Turn.id != turn.id).order_by(Turn.id)).all()
            later = 0
            if turn.picked:  # later prompts held its reply; an alternative's they never did
                later_turns = (Turn.conversation_id == turn.conversation_id) \
                    & (Turn.index > turn.index)
                later = s.execute(update(Turn).where(later_turns)
                                  .values(context_forgotten=True, prompt_ids=None)).rowcount
                # a compare pair on a later turn kept that turn's prompt ids too
                s.execute(update(Pair).where(Pair.prompt_turn_id.in_(
                    select(Turn.id).where(later_turns))).values(prompt_ids=None))
            ratings = 1 if turn.rating else 0
            rewrites = 1 if turn.rewrite else 0
            texts = _rating_texts([turn.rating] if turn.rating else [])
            self._scrub_records(s, texts)
            pairs = self._forget_pairs(s, lambda t: t.id == turn_id)
            conv = s.get(Conversation, turn.conversation_id)
            titled_by_it = conv.title == title_of(turn.user_message)
            s.delete(turn)
            s.flush()
            if turn.picked and siblings:
                siblings[-1].picked = True
            if titled_by_it:
                first = s.scalar(select(Turn.user_message).order_by(Turn.index).limit(1)
                                 .where(Turn.conversation_id == conv.id))
                conv.title = title_of(first) if first is not None else ""
        result = {"turns": 1, "ratings": ratings, "later_turns_untrainable": later}
        if pairs:
            result["pairs"] = pairs
        if rewrites:
            result["rewrites"] = rewrites
        if siblings:  # they answer the same message, so it is still stored with them
            result["alternatives_kept"] = len(siblings)
        return self._forgot(result, texts)

    def forget_conversation(self, conversation_id: int) -> dict[str, int]:
        with self._session(write=True) as s:
            if s.get(Conversation, conversation_id) is None:
                raise NotFound(f"no conversation {conversation_id}")
            turns = s.scalar(select(func.count()).where(Turn.conversation_id == conversation_id))
            rated = s.scalars(select(Rating).join(Turn)
                              .where(Turn.conversation_id == conversation_id)).all()
            ratings, texts = len(rated), _rating_texts(rated)
            rewrites = s.scalar(select(func.count()).select_from(Rewrite).join(Turn)
                                .where(Turn.conversation_id == conversation_id)) or 0
            self._scrub_records(s, texts)
            pairs = self._forget_pairs(s, lambda t: t.conversation_id == conversation_id)
            s.execute(delete(Conversation).where(Conversation.id == conversation_id))
        result = {"conversations": 1, "turns": turns or 0, "ratings": ratings}
        if pairs:
            result["pairs"] = pairs
        if rewrites:
            result["rewrites"] = rewrites
        return self._forgot(result, texts)

    def forget_all(self) -> dict[str, int]:
        before = self.counts()
        with self._session(write=True) as s:
            rewrites = s.scalar(select(func.count()).select_from(Rewrite)) or 0
            texts = _rating_texts(s.scalars(select(Rating)).all())
            self._scrub_records(s, texts)
            s.execute(delete(Pair))
            s.execute(delete(Rewrite))
            s.execute(delete(Rating))
            s.execute(delete(Turn))
            s.execute(delete(Conversation))
        result = {k: before[k] for k in ("conversations", "turns", "ratings")}
        if before["pairs"]:
            result["pairs"] = before["pairs"]
        if rewrites:
            result["rewrites"] = rewrites
        return self._forgot(result, texts)

    @staticmethod
    def _forget_pairs(s: Session, forgotten: Callable[[Any], Any]) -> int:
        """In a forget's transaction, before the turns go: delete the pairs that hold them
        (the foreign keys would cascade; deleting here counts them and does not rely on a
        server's cascade), and the text-only pairs (``reinf compare`` on a typed prompt)
        whose prompt is a forgotten turn's message that no other turn still holds.
        ``forgotten(T)``: the SQL condition on turns table ``T`` that names the turns."""
        ids = select(Turn.id).where(forgotten(Turn))
        other = aliased(Turn)
        typed = and_(Pair.prompt_turn_id.is_(None), Pair.a_turn_id.is_(None),
                     Pair.b_turn_id.is_(None),
                     Pair.prompt.in_(select(Turn.user_message).where(forgotten(Turn))),
                     ~exists().where(other.user_message == Pair.prompt,
                                     not_(forgotten(other))))
        return s.execute(delete(Pair).where(or_(
            Pair.a_turn_id.in_(ids), Pair.b_turn_id.in_(ids), Pair.prompt_turn_id.in_(ids),
            typed))).rowcount or 0

    @staticmethod
    def _scrub_records(s: Session, texts: Sequence[str]) -> None:
        """In the forget's transaction: the forgotten ratings' comments and tags, where a
        broken hook's error quoted them in a run's row, become "[forgotten]"."""
        for text in texts:
            for form in {text, repr(text)[1:-1]}:
                s.execute(update(TrainingRun)
                          .where(TrainingRun.error.contains(form, autoescape=True))
                          .values(error=func.replace(TrainingRun.error, form, FORGOTTEN)))

    def _forgot(self, result: dict[str, Any], texts: Sequence[str] = ()) -> dict[str, Any]:
        """A forget's result, after taking the forgotten comments and tags out of the last
        hook failure (``reward_hook_error.json``) and pushing the deleted pages out of the
        WAL; says so when another program's read transaction kept it from being emptied."""
        if texts and self.data_dir is not None:
            from reinf.rewards.mapper import scrub_failure

            scrub_failure(self.data_dir, texts)
        if not self._scrub():
            result["warning"] = WAL_BUSY
        return result

    def _scrub(self) -> bool:
        """Push deleted pages out of the WAL so forgotten text does not linger on disk:
        ``wal_checkpoint(TRUNCATE)``, a few short tries. False when a reader (another
        program holding a read transaction) still needs the WAL: then it is tried again at
        the next forget, by ``retry_scrub`` (the server's reconcile tick) and at ``close``."""
        if self.engine.dialect.name != "sqlite":
            return True
        busy = True
        with self.engine.connect() as conn:
            timeout = conn.exec_driver_sql("PRAGMA busy_timeout").scalar()
            conn.exec_driver_sql(f"PRAGMA busy_timeout={SCRUB_WAIT_MS}")
            try:
                for attempt in range(SCRUB_TRIES):
                    if attempt:
                        time.sleep(SCRUB_WAIT_MS / 1000)
                    row = conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)").first()
                    busy = row is not None and row[0] != 0
                    if not busy:
                        break
            finally:
                conn.exec_driver_sql(f"PRAGMA busy_timeout={int(timeout or 0)}")
        if busy and not self.wal_pending:
            log.warning("forgotten text is still in %s-wal: %s", self._db_file(), WAL_BUSY)
        self.wal_pending = busy
        return not busy

    def retry_scrub(self) -> bool:
        """Empty the WAL if a forget could not (True when it is empty now)."""
        if not self.wal_pending:
            return True
        if self._scrub():
            log.info("forgotten text is gone from %s-wal now", self._db_file())
            return True
        return False

    def _db_file(self) -> str:
        return self.engine.url.database or "the database"

    # --- training runs ----------------------------------------------------------------

    def start_run(self, trigger: str = "manual", pid: int | None = None) -> RunRecord:
        with self._session(write=True) as s:
            run = TrainingRun(trigger=trigger, pid=pid, metrics={}, ratings_until=utcnow())
            s.add(run)
            s.flush()
            return _run(run)

    def finish_run(self, run_id: int, status: str, *, metrics: dict | None = None,
                   error: str | None = None, samples: int | None = None,
                   checkpoint_id: str | None = None) -> RunRecord:
        if status not in RUN_STATUSES[1:]:
            raise ValueError(f"bad final run status {status!r}")
        with self._session(write=True) as s:
            run = s.get(TrainingRun, run_id)
            if run is None:
                raise NotFound(f"no training run {run_id}")
            run.status, run.error, run.finished_at = status, error, utcnow()
            run.metrics = dict(metrics or run.metrics or {})
            run.samples = samples if samples is not None else run.samples
            run.checkpoint_id = checkpoint_id or run.checkpoint_id
            return _run(run)

    def mark_interrupted_runs(self, reason: str = "interrupted") -> int:
        """Runs left 'running' by a crashed process become failed (called at start-up)."""
        with self._session(write=True) as s:
            return s.execute(update(TrainingRun).where(TrainingRun.status == "running")
                             .values(status="failed", error=reason,
                                     finished_at=utcnow())).rowcount

    def list_runs(self, limit: int = 50) -> list[RunRecord]:
        with self._session(write=False) as s:
            runs = s.scalars(select(TrainingRun).order_by(TrainingRun.id.desc()).limit(limit))
            return [_run(r) for r in runs]

    def get_run(self, run_id: int) -> RunRecord:
        with self._session(write=False) as s:
            run = s.get(TrainingRun, run_id)
            if run is None:
                raise NotFound(f"no training run {run_id}")
            return _run(run)

    # --- checkpoints ------------------------------------------------------------------

    def add_checkpoint(self, checkpoint_id: str, path: str, *, parent_id: str | None = None,
                       run_id: int | None = None, metrics: dict | None = None,
                       status: str = "promoted") -> CheckpointRecord:
        with self._session(write=True) as s:
            ckpt = Checkpoint(id=checkpoint_id, path=str(path), parent_id=parent_id,
                              run_id=run_id, metrics=metrics or {}, status=status)
            s.add(ckpt)
            s.flush()
            return _checkpoint(ckpt)

    def promote(self, run_id: int, checkpoint_id: str, path: str, *, parent_id: str | None,
                metrics: dict, samples: int, turn_ids: Sequence[int] = (),
                read_at: datetime | None = None) -> CheckpointRecord:
        """A round's end, in one transaction: record its checkpoint, make it the active one
        and finish the run as succeeded. A kill part-way leaves none of it (the run stays
        ``running`` and is marked interrupted at the next start), never an active
        checkpoint whose run is not finished.

        ``turn_ids``: the rated turns the round trained on, read from the store by
        ``read_at`` (default: the run's start). If any was forgotten while it ran
        (or the context of one was), nothing is promoted: the checkpoint is recorded
        ``rejected`` and the run finishes rejected, saying so; the record returned then has
        status ``rejected``. A forget waits for this transaction or comes before it."""
        with self._session(write=True) as s:
            run = s.get(TrainingRun, run_id)
            if run is None:
                raise NotFound(f"no training run {run_id}")
            forgotten = self._forgotten_since(s, turn_ids,
                                              read_at or run.ratings_until or run.started_at)
            if forgotten:
                reason = (f"{forgotten} of the turns this round trained on "
                          f"{'was' if forgotten == 1 else 'were'} forgotten while it ran; "
                          "nothing was promoted")
                ckpt = Checkpoint(id=checkpoint_id, path=str(path), parent_id=parent_id,
                                  run_id=run_id, status="rejected",
                                  metrics={**(metrics or {}), "rejected_reason": reason})
                s.add(ckpt)
                run.status, run.error, run.finished_at = "rejected", reason, utcnow()
                run.metrics = {**(metrics or {}), "rejected_reason": reason,
                               "forgotten_during_round": forgotten}
                run.samples, run.checkpoint_id = samples, checkpoint_id
                s.flush()
                return _checkpoint(ckpt)
            ckpt = Checkpoint(id=checkpoint_id, path=str(path), parent_id=parent_id,
                              run_id=run_id, metrics=metrics or {}, status="promoted")
            s.add(ckpt)
            s.execute(update(Checkpoint).where(Checkpoint.active.is_(True))
                      .values(active=False))
            ckpt.active = True
            run.status, run.error, run.finished_at = "succeeded", None, utcnow()
            run.metrics, run.samples, run.checkpoint_id = dict(metrics or {}), samples, \
                checkpoint_id
            s.flush()
            return _checkpoint(ckpt)

    @staticmethod
    def _forgotten_since(s: Session, turn_ids: Sequence[int], read_at: datetime) -> int:
        """How many of ``turn_ids``, read for training at ``read_at``, are gone or have lost
        their context since. A turn created after ``read_at`` under one of those ids is
        another turn (SQLite gives a deleted highest id again)."""
        wanted = set(turn_ids)
        if not wanted:
            return 0
        left = 0
        ids = sorted(wanted)
        for i in range(0, len(ids), 500):  # SQL parameter limits
            left += s.scalar(select(func.count()).select_from(Turn).where(
                Turn.id.in_(ids[i:i + 500]), Turn.context_forgotten.is_(False),
                Turn.created_at <= read_at)) or 0
        return len(wanted) - left

    def activate_checkpoint(self, checkpoint_id: str | None) -> CheckpointRecord | None:
        """Make ``checkpoint_id`` the active adapter; None means the bare base model."""
        with self._session(write=True) as s:
            target = None
            if checkpoint_id is not None:
                target = s.get(Checkpoint, checkpoint_id)
                if target is None:
                    raise NotFound(f"no checkpoint {checkpoint_id}",
                                   fix="list them with `reinf checkpoints`")
                if target.status != "promoted":
                    raise BadInput(f"checkpoint {checkpoint_id} is {target.status} and cannot "
                                   "be made active")
            s.execute(update(Checkpoint).where(Checkpoint.active.is_(True))
                      .values(active=False))
            if target is not None:
                target.active = True
                return _checkpoint(target)
            return None

    def active_checkpoint(self) -> CheckpointRecord | None:
        with self._session(write=False) as s:
            ckpt = s.scalar(select(Checkpoint).where(Checkpoint.active.is_(True)))
            return _checkpoint(ckpt) if ckpt else None

    def resolve_checkpoint(self, ref: str) -> str | None:
        """The id of the checkpoint ``ref`` names: the id or a unique prefix of it, as git
        takes commits (``r0005`` for ``r0005-20261125-030648-8ce1``); ``base`` names the
        bare model (None). An exact id wins over a longer one it is a prefix of."""
        ref = ref.strip()
        if ref == "base":
            return None
        if not ref:
            raise BadInput("no checkpoint id given",
                           fix="give one from `reinf checkpoints`, or `base`")
        query = (select(Checkpoint.id).where(Checkpoint.id.startswith(ref, autoescape=True))
                 .order_by(Checkpoint.id))
        with self._session(write=False) as s:
            # SQLite's LIKE ignores ASCII case: the exact prefix test is in Python
            ids = [i for i in s.scalars(query) if i.startswith(ref)]
        if ref in ids:
            return ref
        if len(ids) == 1:
            return ids[0]
        if not ids:
            raise NotFound(f"no checkpoint {_clip(ref)}", fix="list them with `reinf checkpoints`")
        shown = ", ".join(ids[:AMBIGUOUS_SHOWN])
        more = len(ids) - AMBIGUOUS_SHOWN
        raise BadInput(f"checkpoint id {ref!r} is ambiguous: {len(ids)} checkpoints start with "
                       f"it ({shown}{f' and {more} more' if more > 0 else ''})",
                       fix="type more of the id")

    def get_checkpoint(self, checkpoint_id: str) -> CheckpointRecord:
        with self._session(write=False) as s:
            ckpt = s.get(Checkpoint, checkpoint_id)
            if ckpt is None:
                raise NotFound(f"no checkpoint {checkpoint_id}",
                               fix="list them with `reinf checkpoints`")
            return _checkpoint(ckpt)

    def list_checkpoints(self) -> list[CheckpointRecord]:
        with self._session(write=False) as s:
            rows = s.scalars(select(Checkpoint).order_by(Checkpoint.created_at.desc(),
                                                         Checkpoint.id.desc()))
            return [_checkpoint(c) for c in rows]

    def set_checkpoint_status(self, checkpoint_id: str, status: str) -> None:
        with self._session(write=True) as s:
            s.execute(update(Checkpoint).where(Checkpoint.id == checkpoint_id)
                      .values(status=status))

    def integrity_check(self) -> str:
        """SQLite's ``PRAGMA integrity_check`` ("ok" when sound). Other servers check their
        own pages; there it is "ok" once a query answers."""
        with self.engine.connect() as conn:
            if self.engine.dialect.name != "sqlite":
                return "ok" if conn.execute(text("SELECT 1")).scalar() == 1 else "no answer"
            return conn.execute(text("PRAGMA integrity_check")).scalar()


PAIR_FIELDS = {"prompt": None, "outcome": None, "source": "compare", "blind": False,
               "a_turn_id": None, "b_turn_id": None, "a_text": None, "b_text": None,
               "a_checkpoint_id": None, "b_checkpoint_id": None, "prompt_turn_id": None,
               "prompt_ids": (), "a_reply_ids": (), "b_reply_ids": (), "details": None}
PAIR_ID_FIELDS = ("prompt_ids", "a_reply_ids", "b_reply_ids")


def _check_pair(row: dict[str, Any]) -> dict[str, Any]:
    """A pair's fields (see Store.add_pairs), checked, with the defaults filled in."""
    unknown = set(row) - set(PAIR_FIELDS)
    if unknown:
        raise TypeError(f"unknown pair field {sorted(unknown)[0]!r}")
    row = {**PAIR_FIELDS, **row}
    if row["outcome"] not in PAIR_OUTCOMES:
        raise BadInput(f"outcome must be one of {', '.join(PAIR_OUTCOMES)}, got "
                       f"{row['outcome']!r}", key="outcome")
    if row["source"] not in PAIR_SOURCES:
        raise BadInput(f"source must be one of {', '.join(PAIR_SOURCES)}, got "
                       f"{row['source']!r}", key="source")
    if not isinstance(row["prompt"], str):
        raise BadInput("a pair's prompt must be text", key="prompt")
    check_text(row["prompt"], "the prompt")
    for side in ("a", "b"):
        turn_id, text_ = row[f"{side}_turn_id"], row[f"{side}_text"]
        if (turn_id is None) == (text_ is None):
            raise BadInput(f"side {side} of a pair is a stored turn or a text, not "
                           f"{'both' if turn_id is not None else 'neither'}")
        if text_ is not None:
            check_text(text_, "a reply")
    row["blind"] = bool(row["blind"])
    row["details"] = dict(row["details"] or {})
    return row


def _rating_texts(ratings) -> list[str]:
    """The comments and tags of ``ratings`` that a hook error could have quoted."""
    out: list[str] = []
    for rating in ratings:
        for text in [rating.comment or "", *(rating.tags or [])]:
            if len(text.strip()) >= MIN_REDACTED and text not in out:
                out.append(text)
    return sorted(out, key=len, reverse=True)  # a longer text first, not cut by a shorter


def _tag_may_match(tag: str):
    """SQL that keeps every rating whose JSON ``tags`` list holds ``tag``, and maybe a few
    more, so that ``history(tag=..., limit=n)`` is cut in SQL. It is a LIKE on the JSON
    text, which SQLite and PostgreSQL both run: the JSON type writes each tag as
    ``json.dumps`` does, quotes included. The few rows it keeps wrongly (SQLite's LIKE
    ignores ASCII case; the tag ``x"wrong`` is written with ``"wrong"`` inside it) are
    dropped by the exact check in Python. ``autoescape`` makes ``%`` and ``_`` literal and
    sets ``ESCAPE '/'``, so the JSON's backslashes are literal on PostgreSQL too."""
    return cast(Rating.tags, Text).contains(json.dumps(tag), autoescape=True)


def _clip(text: str, n: int = 40) -> str:
    """Input echoed in an error: long enough to recognise, never a screenful."""
    return text if len(text) <= n else text[:n] + "…"


# --- ORM -> record ------------------------------------------------------------------------

def _conversation(c: Conversation, n: int) -> ConversationRecord:
    return ConversationRecord(c.id, c.title, c.user_id, c.created_at, c.updated_at, n,
                              c.system_prompt)


def _rating(r: Rating) -> RatingRecord:
    return RatingRecord(r.turn_id, r.score, list(r.tags or []), r.comment or "", bool(r.critical),
                        r.created_at, r.updated_at)


def _require_turn(s: Session, turn_id: int, *, lock: bool = False) -> Turn:
    """The turn ``turn_id`` (``lock``: FOR UPDATE, so that two writers of its one rating or
    rewrite take turns), or NotFound."""
    turn = s.get(Turn, turn_id, with_for_update=lock)
    if turn is None:
        raise NotFound(f"no turn {turn_id}", fix="see `reinf history` for turn ids")
    return turn


def _rewrite(r: Rewrite) -> RewriteRecord:
    return RewriteRecord(r.turn_id, r.text, r.created_at, r.updated_at)


def _slot_sizes(s: Session, turns: Sequence[Turn]) -> dict[tuple[int, int], int]:
    """How many turns (alternatives) each (conversation, index) slot of ``turns`` holds."""
    sizes: dict[tuple[int, int], int] = {(t.conversation_id, t.index): 1 for t in turns}
    conversations = sorted({t.conversation_id for t in turns})
    for i in range(0, len(conversations), 500):  # SQL parameter limits
        rows = s.execute(select(Turn.conversation_id, Turn.index, func.count())
                         .where(Turn.conversation_id.in_(conversations[i:i + 500]))
                         .group_by(Turn.conversation_id, Turn.index)
                         .having(func.count() > 1)).all()
        for cid, index, n in rows:
            if (cid, index) in sizes:
                sizes[cid, index] = n
    return sizes


def _turn(t: Turn, user_id: str | None = None, alternatives: int = 1) -> TurnRecord:
    return TurnRecord(
        id=t.id, conversation_id=t.conversation_id, index=t.index, user_message=t.user_message,
        reply=t.reply, checkpoint_id=t.checkpoint_id, model=t.model,
        gen_params=dict(t.gen_params or {}), created_at=t.created_at, ttft_ms=t.ttft_ms,
        latency_ms=t.latency_ms, interrupted=bool(t.interrupted),
        context_forgotten=bool(t.context_forgotten), prompt_ids=unpack_ids(t.prompt_ids),
        reply_ids=unpack_ids(t.reply_ids), logprobs=unpack_floats(t.logprobs),
        rating=_rating(t.rating) if t.rating else None,
        rewrite=_rewrite(t.rewrite) if t.rewrite else None,
        user_id=user_id or (t.conversation.user_id if t.conversation else "local"),
        system_prompt=t.conversation.system_prompt if t.conversation else None,
        picked=bool(t.picked), alternatives=alternatives)


def _pair(p: Pair, texts: dict[int, str] | None = None) -> PairRecord:
    """``texts``: turn id -> reply, for the sides that are stored turns."""
    texts = texts or {}
    return PairRecord(
        id=p.id, created_at=p.created_at, source=p.source, outcome=p.outcome,
        blind=bool(p.blind), prompt=p.prompt, conversation_id=p.conversation_id,
        prompt_turn_id=p.prompt_turn_id, a_turn_id=p.a_turn_id, b_turn_id=p.b_turn_id,
        a_text=p.a_text if p.a_text is not None else texts.get(p.a_turn_id, ""),
        b_text=p.b_text if p.b_text is not None else texts.get(p.b_turn_id, ""),
        a_checkpoint_id=p.a_checkpoint_id, b_checkpoint_id=p.b_checkpoint_id,
        details=dict(p.details or {}), prompt_ids=unpack_ids(p.prompt_ids),
        a_reply_ids=unpack_ids(p.a_reply_ids), b_reply_ids=unpack_ids(p.b_reply_ids))


def _run(r: TrainingRun) -> RunRecord:
    return RunRecord(r.id, r.started_at, r.finished_at, r.status, r.trigger, r.error,
                     dict(r.metrics or {}), r.samples, r.checkpoint_id, r.pid)


def _checkpoint(c: Checkpoint) -> CheckpointRecord:
    return CheckpointRecord(c.id, c.path, c.parent_id, c.run_id, c.created_at,
                            dict(c.metrics or {}), bool(c.active), c.status)
