"""Compare: one prompt answered by the bare base model, the active checkpoint and, if asked,
another checkpoint; the person picks the better reply, blind, and the preference is stored
as pairs (reinf.storage.schema.Pair, source ``compare``).

The replies are shown in a shuffled order under the slots A, B (, C); which checkpoint wrote
which stays on this side, in a ``Comparison`` kept by ``Comparisons`` under a random token
(the ``compare_id`` the pick names), and is revealed with the pick. Each reply comes from
its own adapter through ``Engine.borrow``: the engine puts it in place for that reply alone,
under its lock, so chats running at the same time are served by the active adapter as
always. All replies share one sampling seed, so they differ by their adapter, not by luck.

Predicted scores: when the checkpoint being served holds a rating model
(``rating_model.safetensors``, reinf.training.rating_model), each reply gets its predicted
1-5 score (the heads' mean), from the base model's features as in training; None otherwise.
The serving engine computes the features (``Engine.rating_features``), so the trainer's
model is not needed; its device or dtype may differ from the trainer's, so a score can
differ a little from what a round would predict.

A pick stores one pair per two replies that it orders: the winner against each other reply,
or every two replies for ``tie`` / ``both_bad``. In a pair, side ``a`` is the earlier slot.
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reinf.errors import BadInput, Conflict, NotFound
from reinf.records import PairRecord

log = logging.getLogger(__name__)

SLOTS = "ABC"
OUTCOMES = ("tie", "both_bad")   # a pick that names no slot
KEEP = 64                        # comparisons waiting for a pick, the newest kept
KEEP_SECONDS = 3600.0            # a comparison not picked within an hour is dropped


@dataclass(frozen=True)
class Candidate:
    """One reply of a comparison."""
    slot: str                       # "A", "B", "C": where it is shown
    role: str                       # base | active | checkpoint
    checkpoint_id: str | None       # None: the bare base
    text: str
    reply_ids: list[int] = field(repr=False)
    finish_reason: str = "stop"
    predicted_score: float | None = None

    def to_dict(self, reveal: bool) -> dict[str, Any]:
        out = {"slot": self.slot, "text": self.text, "predicted_score": self.predicted_score,
               "finish_reason": self.finish_reason}
        if reveal:
            out.update(role=self.role, checkpoint_id=self.checkpoint_id or "base")
        return out


@dataclass
class Comparison:
    id: str                         # the token a pick names
    prompt: str                     # the message both replies answer
    prompt_ids: list[int] = field(repr=False)
    replies: list[Candidate]
    blind: bool
    gen_params: dict[str, Any]
    prompt_turn_id: int | None = None
    created: float = field(default_factory=time.monotonic)
    outcome: str | None = None      # the pick: a slot, "tie" or "both_bad"
    pairs: list[PairRecord] = field(default_factory=list)

    def slot(self, name: str) -> Candidate:
        return next(c for c in self.replies if c.slot == name)

    def to_dict(self, reveal: bool | None = None) -> dict[str, Any]:
        """The comparison as the API shows it: who wrote which only when not blind, or
        once picked (``reveal`` overrides)."""
        reveal = (not self.blind or self.outcome is not None) if reveal is None else reveal
        return {"compare_id": self.id, "prompt": self.prompt,
                "prompt_turn_id": self.prompt_turn_id, "blind": self.blind,
                "replies": [c.to_dict(reveal) for c in self.replies],
                "picked": self.outcome,
                # a pair names its checkpoints: unrevealed, only its id and outcome
                "pairs": [p.to_dict() if reveal else {"pair_id": p.id, "outcome": p.outcome}
                          for p in self.pairs]}


def build_comparison(engine, store, config, *, prompt: str | None = None,
                     turn_id: int | None = None, checkpoint: str | None = None,
                     blind: bool = True, seed: int | None = None,
                     **generation: Any) -> Comparison:
    """Generate the replies of a comparison for ``prompt`` (a new conversation's first
    message, with the config's system prompt) or for the message of ``turn_id`` (with the
    context its reply had). ``checkpoint``: another checkpoint to add, by its id or a unique
    prefix. Bad input raises before anything is generated."""
    if (prompt is None) == (turn_id is None):
        raise BadInput("give a prompt or a turn_id (one of them)", key="prompt")
    params = engine.generation_params(**{k: v for k, v in generation.items() if v is not None})
    params["seed"] = int(seed) if seed is not None else secrets.randbelow(2**31)
    sides = choose_sides(engine, store, checkpoint)
    if turn_id is not None:
        turn = store.get_turn(turn_id)
        prompt, prompt_ids = turn.user_message, prompt_of(engine, store, turn, params)
    else:
        from reinf.storage.store import check_system_prompt

        prompt = check_prompt(prompt, config)
        prompt_ids = engine.build_prompt(  # as a new conversation's first message
            [], prompt, max_new_tokens=params["max_new_tokens"],
            system=check_system_prompt(config.generation.system_prompt))
    borrowed = [(role, cid, borrow(engine, store, cid)) for role, cid in sides]
    if blind:
        secrets.SystemRandom().shuffle(borrowed)
    replies = []
    for slot, (role, cid, adapter) in zip(SLOTS, borrowed):
        reply = engine.stream_prompt(prompt_ids, params, adapter=adapter).wait()
        replies.append(Candidate(slot, role, cid, reply.text, list(reply.reply_ids),
                                 reply.finish_reason))
    active = next((cid for role, cid in sides if role == "active"), None)
    scores = predict_scores(engine, store, active, prompt_ids, replies)
    replies = [dataclasses.replace(c, predicted_score=score) for c, score in zip(replies, scores)]
    return Comparison(secrets.token_hex(16), prompt, list(prompt_ids), replies, bool(blind),
                      dict(params), prompt_turn_id=turn_id)


def check_prompt(prompt: Any, config) -> str:
    if not isinstance(prompt, str) or not prompt.strip():
        raise BadInput("the prompt is empty", key="prompt", fix="type something to compare")
    limit = config.server.max_message_chars
    if len(prompt) > limit:
        raise BadInput(f"the prompt has {len(prompt)} characters; the limit is {limit}",
                       key="max_message_chars", fix="shorten it, or raise max_message_chars")
    return prompt


def choose_sides(engine, store, checkpoint: str | None) -> list[tuple[str, str | None]]:
    """[(role, checkpoint id)]: the base, the active checkpoint, and ``checkpoint``."""
    active = engine.active_checkpoint_id
    sides = [("base", None)]
    if active is not None:
        sides.append(("active", active))
    if checkpoint is not None:
        other = store.resolve_checkpoint(checkpoint)
        if other is None or other == active:
            raise BadInput(f"checkpoint {checkpoint!r} is the "
                           f"{'bare base' if other is None else 'active one'}, which is "
                           "compared anyway", key="checkpoint",
                           fix="name another checkpoint (`reinf checkpoints` lists them)")
        if store.get_checkpoint(other).status == "deleted":
            raise Conflict(f"checkpoint {other} was removed by retention; only its record is "
                           "left", key="checkpoint", fix="name another checkpoint")
        sides.append(("checkpoint", other))
    if len(sides) < 2:
        raise Conflict("nothing to compare: the model is serving the bare base, so base and "
                       "active are the same", key="checkpoint",
                       fix="train a round first, or name a checkpoint to compare with")
    return sides


def borrow(engine, store, checkpoint_id: str | None):
    """The engine's adapter for ``checkpoint_id``, read from its directory (so a swap while
    the comparison runs cannot change what a side is); one the store does not know must be
    loaded in the engine."""
    if checkpoint_id is None:
        return engine.borrow(None)
    try:
        path = store.get_checkpoint(checkpoint_id).path
    except NotFound:
        return engine.borrow(checkpoint_id)
    return engine.borrow(checkpoint_id, path)


def prompt_of(engine, store, turn, params: dict[str, Any]) -> list[int]:
    """The prompt ids a turn's reply answered: as stored, else (an imported turn, or one
    whose context was forgotten) built again from the conversation's path before it."""
    if turn.prompt_ids and len(turn.prompt_ids) + params["max_new_tokens"] <= \
            engine.context_limit:
        return list(turn.prompt_ids)
    path = store.conversation_turns(turn.conversation_id)
    history = [(t.user_message, t.reply) for t in path if t.index < turn.index and t.reply]
    return engine.build_prompt(history, turn.user_message,
                               max_new_tokens=params["max_new_tokens"],
                               system=turn.system_prompt)


def predict_scores(engine, store, active: str | None, prompt_ids,
                   replies) -> list[float | None]:
    """Each reply's predicted score by the rating model of ``active``, the checkpoint being
    served; Nones when it has none (or it does not fit this model: that is logged)."""
    none = [None] * len(replies)
    if active is None:
        return none
    try:
        from reinf.training.checkpoints import load_rating_model
        from reinf.training.rating_model import RatingModel

        state = load_rating_model(Path(store.get_checkpoint(active).path))
        if state is None:
            return none
        model = RatingModel.from_state_dict(state)
        scored = [i for i, c in enumerate(replies) if c.reply_ids]
        if not scored:
            return none
        features = engine.rating_features([(prompt_ids, replies[i].reply_ids) for i in scored])
        mean, _ = model.predict(features)
    except Exception:  # noqa: BLE001 - scores are a hint; the comparison goes on without
        log.warning("no predicted scores: the rating model of %s could not score", active,
                    exc_info=True)
        return none
    out = list(none)
    for i, score in zip(scored, mean.tolist()):
        out[i] = round(float(score), 3)
    return out


def parse_pick(winner: Any, comparison: Comparison) -> str:
    """A pick: a slot letter (any case), ``tie`` or ``both_bad``."""
    slots = [c.slot for c in comparison.replies]
    if isinstance(winner, str):
        value = winner.strip()
        if value.upper() in slots:
            return value.upper()
        if value.lower() in OUTCOMES:
            return value.lower()
    raise BadInput(f"winner must be one of {', '.join(slots)}, tie or both_bad, got "
                   f"{str(winner)[:40]!r}", key="winner")


def store_pick(store, comparison: Comparison, pick: str) -> list[PairRecord]:
    """The pairs a pick stands for, stored in one transaction: the winner against each other
    reply, or every two replies for a tie or both bad. Side ``a`` is the earlier slot."""
    rows = []
    for a, b in itertools.combinations(comparison.replies, 2):
        if pick in OUTCOMES:
            outcome = pick
        elif pick in (a.slot, b.slot):
            outcome = "a" if pick == a.slot else "b"
        else:
            continue  # neither won: the pick says nothing about these two
        rows.append(dict(
            prompt=comparison.prompt, outcome=outcome, source="compare", blind=comparison.blind,
            a_text=a.text, b_text=b.text, a_checkpoint_id=a.checkpoint_id,
            b_checkpoint_id=b.checkpoint_id, prompt_turn_id=comparison.prompt_turn_id,
            prompt_ids=comparison.prompt_ids, a_reply_ids=a.reply_ids, b_reply_ids=b.reply_ids,
            details={"compare_id": comparison.id, "slots": {"a": a.slot, "b": b.slot},
                     "roles": {"a": a.role, "b": b.role},
                     "predicted_scores": {"a": a.predicted_score, "b": b.predicted_score},
                     "gen_params": dict(comparison.gen_params)}))
    return store.add_pairs(rows)


class Comparisons:
    """Comparisons waiting for their pick, by id: the newest ``KEEP``, each for
    ``KEEP_SECONDS`` (a server keeps them in memory: a restart forgets them). Thread-safe."""

    def __init__(self, keep: int = KEEP, keep_seconds: float = KEEP_SECONDS, clock=time.monotonic):
        self.keep, self.keep_seconds, self.clock = keep, keep_seconds, clock
        self._items: dict[str, Comparison] = {}
        self._lock = threading.Lock()

    def add(self, comparison: Comparison) -> Comparison:
        with self._lock:
            self._expire()
            comparison.created = self.clock()
            self._items[comparison.id] = comparison
            while len(self._items) > self.keep:
                self._items.pop(next(iter(self._items)))
        return comparison

    def get(self, compare_id: str) -> Comparison:
        with self._lock:
            self._expire()
            comparison = self._items.get(compare_id)
        if comparison is None:
            raise NotFound(f"no comparison {compare_id[:40]!r}",
                           fix="it expired (after an hour, or a server restart); compare again")
        return comparison

    def pick(self, store, compare_id: str, winner: Any) -> Comparison:
        """Store the pick of a comparison (Conflict when it was picked already)."""
        comparison = self.get(compare_id)
        pick = parse_pick(winner, comparison)
        with self._lock:
            if comparison.outcome is not None:
                raise Conflict(f"comparison {compare_id} was picked already "
                               f"({comparison.outcome})", fix="compare again")
            comparison.outcome = pick  # claimed: a second pick now is the Conflict above
        try:
            comparison.pairs = store_pick(store, comparison, pick)
        except BaseException:
            comparison.outcome = None
            raise
        return comparison

    def _expire(self) -> None:
        now = self.clock()
        for key in [k for k, c in self._items.items() if now - c.created > self.keep_seconds]:
            del self._items[key]
