"""Rated turns as training data for other tools (``reinf export``).

Formats, one JSON object per line:

- ``raw``: everything known about each rated turn (context, reply, rating, checkpoint, and
  the person's rewrite or null).
- ``sft``: ``{"messages": [...]}`` chat transcripts of turns rated 4 or 5, and of every turn
  the person rewrote, with the rewrite as the reply (it is the reply they wanted).
- ``kto``: TRL's unpaired preference format, ``{"prompt": [...], "completion": [...],
  "label": bool}``; 4-5 are desirable, 1-2 undesirable, 3 is dropped; a rewrite is one more
  desirable completion.

The context of a turn is its conversation's system prompt, if it has one, then the earlier
turns of its conversation that still exist.
"""
from __future__ import annotations

from typing import Any, Iterator

from reinf.records import TurnRecord, iso

FORMATS = ("raw", "sft", "kto")


def _context(turns_by_conv: dict[int, list[TurnRecord]], turn: TurnRecord) -> list[dict]:
    messages: list[dict[str, str]] = []
    if turn.system_prompt:  # the model saw it first; other tools should too
        messages.append({"role": "system", "content": turn.system_prompt})
    for earlier in turns_by_conv.get(turn.conversation_id, []):
        if earlier.index >= turn.index:
            break
        messages += [{"role": "user", "content": earlier.user_message},
                     {"role": "assistant", "content": earlier.reply}]
    return messages


def export_rows(store, fmt: str = "raw") -> Iterator[dict[str, Any]]:
    """Yield one dict per exported turn, oldest first."""
    if fmt not in FORMATS:
        from reinf.errors import BadInput
        raise BadInput(f"unknown export format {fmt!r}", fix="use one of " + ", ".join(FORMATS))
    turns = store.history(limit=None, oldest_first=True)
    by_conv: dict[int, list[TurnRecord]] = {}
    for t in turns:
        by_conv.setdefault(t.conversation_id, []).append(t)
    for turn in turns:
        rating, rewrite = turn.rating, turn.rewrite
        if rating is None and (rewrite is None or fmt == "raw"):
            continue
        context = _context(by_conv, turn)
        user = {"role": "user", "content": turn.user_message}
        assistant = {"role": "assistant", "content": turn.reply}
        wanted = {"role": "assistant", "content": rewrite.text} if rewrite else None
        if fmt == "sft":
            if wanted or rating.score >= 4:
                yield {"messages": context + [user, wanted or assistant]}
            continue
        if fmt == "kto" and wanted:
            yield {"prompt": context + [user], "completion": [wanted], "label": True}
        if rating is None:
            continue
        if fmt == "raw":
            yield {"turn_id": turn.id, "conversation_id": turn.conversation_id,
                   "index": turn.index, "messages": context + [user], "reply": turn.reply,
                   "score": rating.score, "tags": rating.tags, "comment": rating.comment,
                   "critical": rating.critical, "rated_at": iso(rating.updated_at),
                   "created_at": iso(turn.created_at),
                   "checkpoint_id": turn.checkpoint_id or "base",
                   "interrupted": turn.interrupted,
                   "rewrite": rewrite.text if rewrite else None}
        elif rating.score != 3:
            yield {"prompt": context + [user], "completion": [assistant],
                   "label": rating.score >= 4}
