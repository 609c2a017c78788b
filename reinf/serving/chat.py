"""ChatService: one message in, one stored turn out (the engine plus the store).

The web API and the terminal REPL both go through it. A turn is stored by the reply's
own thread as soon as the reply ends, whether the caller read it to the end, stopped it
(stored with ``interrupted=True``) or went away, so a reply the person saw is never lost.

Context: a conversation's earlier turns are sent oldest first, the engine keeps the last
``max_history`` and trims to fit. Interrupted turns are sent with their partial reply,
since that is what the person saw and answered; turns stopped before their first token
(an empty reply) are left out, as an empty assistant message only confuses the model.

System prompt: a conversation stores its own (``conversations.system_prompt``). A new one
takes the ``system_prompt`` given with its first message, else the config's, copied then, so
a later change of the config never rewrites what earlier turns were generated with. It can
change only while the conversation has no turns. The engine puts it first in every prompt,
so the stored prompt ids (what training replays) hold it.

Alternatives: ``stream_again(turn_id)`` samples another reply to the message of a
conversation's last turn, from the same context, stored in the same slot (the same index;
see reinf.storage.schema.Turn); by default it becomes the picked one, which the conversation
continues from. ``pick(turn_id)`` picks another and records the person's preference
(reinf.storage.store.Store.pick_alternative).

Exploring styles (``generation.explore_styles``): that share of replies, new or sampled
again, is asked for in a style (``explore``: an instruction at the end of the person's
message, reinf.training.styles.Explorer); the turn stores the plain prompt's ids and names
the instruction in its ``gen_params["style"]``. ``explore_pick: ratings`` draws the style by
the person's ratings of the replies asked for in each (Store.style_ratings, pick_style).

Messages to one conversation are handled one at a time (its history must include the
previous turn); different conversations only queue at the engine. Thread-safe.
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Any, Iterator

from reinf.catalog import model_display_name
from reinf.config import Config
from reinf.errors import BadInput, Conflict
from reinf.records import ConversationRecord, PairRecord, StyleRatings, TurnRecord
from reinf.storage.store import check_system_prompt

GENERATION_KEYS = ("temperature", "top_p", "max_new_tokens", "seed")


class ChatStream:
    """A reply on its way to becoming a stored turn. Iterate it for text deltas.

    ``conversation_id`` is known at once (a new conversation is created up front);
    ``stop()`` ends the reply early; ``wait()`` (or ``turn``) gives the stored TurnRecord.
    """

    def __init__(self, service: "ChatService", conversation_id: int, message: str,
                 stream_id: str | None = None):
        self.conversation_id = conversation_id
        self.message = message
        self.stream_id = stream_id
        self._service = service
        self._reply_stream = None
        self._turn: TurnRecord | None = None
        self._shown: str | None = None  # what the person saw of it, when stop() was told
        self.context_turn_ids: list[int] = []  # the earlier turns in its prompt
        self.slot: int | None = None  # an alternative's index (None: a new turn)
        self.picked = True            # an alternative becomes the picked one
        self.style: str | None = None  # the instruction it was asked for in (explore_styles)
        self.plain_prompt_ids: list[int] | None = None  # the prompt without it

    def __iter__(self) -> Iterator[str]:
        return iter(self._reply_stream)

    def stop(self, shown: str | None = None) -> None:
        """End the reply early. ``shown``: the text the person saw. The generator runs
        ahead of the screen (a terminal prints each delta after it arrives, and Ctrl-C
        lands in between), so then only the tokens of that text are stored, and nothing
        at all when it is empty: a cut before anything appeared leaves no turn."""
        if shown is not None:
            self._shown = shown
        self._reply_stream.stop()

    def wait(self, timeout: float | None = None) -> TurnRecord | None:
        """The stored turn (None: cut before anything was shown, so none was stored);
        raises the generation or storage error, if any."""
        self._reply_stream.wait(timeout)
        if self._turn is not None and self._shown is not None:
            # the reply had ended and been stored before the cut came: cut it now
            self._turn = self._service.cut_to_shown(self._turn.id, self._shown)
        return self._turn

    @property
    def turn(self) -> TurnRecord:
        return self.wait()

    @property
    def reply(self):
        """The engine's Reply (token ids, log-probs, finish_reason)."""
        return self._reply_stream.wait()

    def close(self) -> None:
        """Stop the reply and wait until it is stored; errors are left for ``wait()``."""
        self._reply_stream.close()

    def _store(self, reply, error) -> None:
        """Runs in the reply's thread when it ends (see ChatService.stream)."""
        try:
            if error is None and self._shown is not None and reply.text != self._shown:
                kept = keep_shown(self._shown, reply.text, reply.reply_ids, reply.logprobs,
                                  self._service.engine.tokenizer)
                reply = None if kept is None else dataclasses.replace(
                    reply, text=kept[0], reply_ids=kept[1], logprobs=kept[2],
                    interrupted=True, finish_reason="interrupted")
            if error is None and reply is not None:
                self._turn = self._service.store_reply(
                    self.conversation_id, self.message, reply,
                    context_turn_ids=self.context_turn_ids, slot=self.slot,
                    picked=self.picked, stream_id=self.stream_id, style=self.style,
                    plain_prompt_ids=self.plain_prompt_ids)
        finally:
            self._service._release(self.conversation_id)


def keep_shown(shown: str, text: str, reply_ids, logprobs,
               tokenizer) -> tuple[str, list[int], list[float]] | None:
    """(text, reply_ids, logprobs) of a reply cut to the tokens whose text is ``shown``
    (a prefix of ``text``, made of whole deltas); None when nothing was shown. The ids are
    replayed through the same Detokenizer that made the deltas, so the cut falls right
    after the token of the last delta shown."""
    from reinf.model.modeling import Detokenizer

    if not shown:
        return None
    if shown == text:
        return text, list(reply_ids), list(logprobs)
    decoded, kept = Detokenizer(tokenizer), len(reply_ids)
    for n, token in enumerate(reply_ids, 1):
        decoded.add(token)
        if len(decoded.text) >= len(shown):
            kept = n
            break
    return shown, list(reply_ids[:kept]), list(logprobs[:kept])


def exploring_styles(config: Config) -> list[str]:
    """The instructions ``explore_styles`` draws from (none when it is off); BadInput naming
    ``training.styles_file`` when that file cannot be used. The CLI calls it before the
    model loads, so a bad file stops start-up at once."""
    if config.generation.explore_styles <= 0:
        return []
    from reinf.training.styles import load_styles

    return load_styles(config.training.styles_file)


class ChatService:
    def __init__(self, engine, store, config: Config):
        self.engine = engine
        self.store = store
        self.config = config
        self._locks: dict[int, threading.Lock] = {}  # one per conversation with a reply running
        self._locks_guard = threading.Lock()
        self._explorer = None  # reinf.training.styles.Explorer, made at the first reply
        self._styles = exploring_styles(config)

    def explore(self, prompt_ids: list[int], params: dict[str, Any], key: str = "", *,
                rated: StyleRatings | None = None) -> tuple[list[int], str | None]:
        """The ids a reply to ``prompt_ids`` is sampled from, and the style instruction they
        carry (None: the prompt as it is). With ``generation.explore_styles`` above 0, that
        share of replies is asked for in a style (reinf.training.styles.Explorer); the reply
        is stored under ``prompt_ids`` all the same (``store_reply``). With
        ``explore_pick: ratings`` the style is drawn by the person's ratings (``rated``, or
        read from the store when the reply is to be styled; a batch reads them once,
        ``style_ratings``)."""
        generation = self.config.generation
        if generation.explore_styles <= 0:
            return prompt_ids, None
        if self._explorer is None:
            from reinf.training.styles import Explorer
            self._explorer = Explorer(self.engine.tokenizer, self._styles,
                                      generation.explore_styles, generation.explore_pick)
        return self._explorer.draw(prompt_ids, seed=params.get("seed"), key=key,
                                   limit=self.engine.context_limit - params["max_new_tokens"],
                                   rated=rated if rated is not None else self.style_ratings)

    def style_ratings(self) -> StyleRatings | None:
        """What ``explore_pick: ratings`` reads (Store.style_ratings); None when exploring
        is off or picks uniformly."""
        generation = self.config.generation
        if generation.explore_styles <= 0 or generation.explore_pick != "ratings":
            return None
        return self.store.style_ratings()

    def cut_to_shown(self, turn_id: int, shown: str) -> TurnRecord | None:
        """Keep of a stored reply only the tokens whose text is ``shown`` (what the person
        saw before stopping it), marked interrupted; nothing was shown: forget the turn
        (None). A ``shown`` that is not the start of the reply is refused."""
        turn = self.store.get_turn(turn_id)
        if shown == turn.reply:
            return turn
        if not turn.reply.startswith(shown):
            raise BadInput(f"the text shown is not the start of turn {turn_id}'s reply",
                           fix="send exactly the part of the reply that was displayed")
        kept = keep_shown(shown, turn.reply, turn.reply_ids, turn.logprobs,
                          self.engine.tokenizer)
        if kept is None:
            self.store.forget_turn(turn_id)
            return None
        return self.store.cut_reply(turn_id, *kept)

    def check_message(self, message: Any) -> str:
        if not isinstance(message, str) or not message.strip():
            raise BadInput("the message is empty", fix="type something to send")
        limit = self.config.server.max_message_chars
        if len(message) > limit:
            raise BadInput(f"the message has {len(message)} characters; the limit is {limit}",
                           fix="shorten it, or raise max_message_chars")
        return message

    def check_system_prompt(self, system_prompt: Any) -> str | None:
        """None: not given; otherwise the text as stored ("" or blank: none)."""
        if system_prompt is None:
            return None
        text = check_system_prompt(system_prompt) or ""
        limit = self.config.server.max_message_chars
        if len(text) > limit:
            raise BadInput(f"the system prompt has {len(text)} characters; the limit is "
                           f"{limit}", fix="shorten it, or raise max_message_chars",
                           key="system_prompt")
        return text

    def update_conversation(self, conversation_id: int, *,
                            system_prompt: str | None) -> ConversationRecord:
        """Set a conversation's system prompt while it has no turns (Conflict after); waits
        for a reply to it that is still running, which will have made a turn."""
        text = self.check_system_prompt(system_prompt)
        self.store.get_conversation(conversation_id)  # NotFound before waiting on a lock
        self._acquire(conversation_id)
        try:
            return self.store.update_conversation(conversation_id, system_prompt=text)
        finally:
            self._release(conversation_id)

    def history(self, conversation_id: int) -> list[tuple[str, str]]:
        """(user, reply) pairs the engine sends as context, oldest first."""
        return [(t.user_message, t.reply) for t in self._context(conversation_id)]

    def _context(self, conversation_id: int) -> list[TurnRecord]:
        """The earlier turns whose text goes into the prompt, oldest first."""
        return [t for t in self.store.conversation_turns(conversation_id) if t.reply]

    def stream(self, message: str, conversation_id: int | None = None, *,
               system_prompt: str | None = None, stream_id: str | None = None,
               **generation: Any) -> ChatStream:
        """Start a reply. Bad input raises BadInput (or NotFound for an unknown
        conversation) before anything is stored or generated.

        ``stream_id``: the id a client saw before the turn existed (an OpenAI streamed
        completion's), stored with the turn so that ``Store.resolve_turn`` finds it.

        ``system_prompt`` (None: not given): a new conversation's, instead of the config's
        ("" for none). With ``conversation_id`` it must equal the conversation's, unless that
        has no turns yet, when it replaces it (Conflict otherwise)."""
        message = self.check_message(message)
        wanted = self.check_system_prompt(system_prompt)
        params = self._params(generation)
        if conversation_id is not None:
            self.store.get_conversation(conversation_id)  # NotFound before waiting on a lock
            self._acquire(conversation_id)
        try:
            change, context_ids = False, []
            if conversation_id is None:
                system = check_system_prompt(self.config.generation.system_prompt
                                             if wanted is None else wanted)
                history = []
            else:
                conv = self.store.get_conversation(conversation_id)  # now that no reply runs
                context = self._context(conversation_id)
                system = conv.system_prompt
                history = [(t.user_message, t.reply) for t in context]
                context_ids = [t.id for t in context]
                change = wanted is not None and (wanted or None) != system
                if change and conv.turns:  # the store refuses it: Conflict
                    self.store.update_conversation(conversation_id, system_prompt=wanted)
                system = (wanted or None) if change else system
            prompt_ids = self.engine.build_prompt(history, message,
                                                  max_new_tokens=params["max_new_tokens"],
                                                  system=system)
            if conversation_id is None:
                conversation_id = self.store.create_conversation(system_prompt=system).id
                self._acquire(conversation_id)
            elif change:  # still no turns: this lock is held
                self.store.update_conversation(conversation_id, system_prompt=system)
            chat = ChatStream(self, conversation_id, message, stream_id)
            chat.context_turn_ids = context_ids  # a forget meanwhile marks the new turn
            sampled_ids = self._explore_into(chat, prompt_ids, params)
            chat._reply_stream = self.engine.stream_prompt(sampled_ids, params,
                                                           on_finish=chat._store)
        except BaseException:
            if conversation_id is not None:
                self._release(conversation_id)
            raise
        return chat

    def _explore_into(self, chat: ChatStream, prompt_ids: list[int], params: dict[str, Any],
                      key: str = "") -> list[int]:
        """``explore`` for a streamed reply: the ids to sample, with the style and the plain
        prompt noted on ``chat`` for storing."""
        sampled_ids, style = self.explore(prompt_ids, params, key)
        if style is not None:
            chat.style, chat.plain_prompt_ids = style, list(prompt_ids)
        return sampled_ids

    def send(self, message: str, conversation_id: int | None = None,
             **generation: Any) -> TurnRecord:
        return self.stream(message, conversation_id, **generation).wait()

    def send_many(self, messages: list[str], *, seed: int | None = None) -> list[TurnRecord]:
        """Each message the first of a new conversation (the config's system prompt), the
        replies sampled together in one batch (``Engine.replies``: one random stream, seeded
        by ``seed``) and stored as ``send`` stores them. For many independent first
        messages at once (the simulated people of ``reinf bench learn``); with best-of-n
        on, one ``send`` each (seeds ``seed``, ``seed + 1``, ...), since best-of-n chooses
        each reply on its own. Bad input raises before anything is stored."""
        messages = [self.check_message(m) for m in messages]
        if self.config.generation.best_of > 1:
            return [self.send(m, seed=None if seed is None else seed + i)
                    for i, m in enumerate(messages)]
        params = self._params({"seed": seed})
        system = check_system_prompt(self.config.generation.system_prompt)
        prompts = [self.engine.build_prompt([], m, max_new_tokens=params["max_new_tokens"],
                                            system=system) for m in messages]
        rated = self.style_ratings()
        drawn = [self.explore(p, params, key=str(i), rated=rated)
                 for i, p in enumerate(prompts)]
        replies = self.engine.replies([ids for ids, _ in drawn], params)
        turns = []
        for message, prompt, (_, style), reply in zip(messages, prompts, drawn, replies):
            conversation_id = self.store.create_conversation(system_prompt=system).id
            turns.append(self.store_reply(conversation_id, message, reply, style=style,
                                          plain_prompt_ids=prompt))
        return turns

    def store_reply(self, conversation_id: int, message: str, reply, *,
                    context_turn_ids: list[int] | None = None, slot: int | None = None,
                    picked: bool = True, stream_id: str | None = None,
                    style: str | None = None,
                    plain_prompt_ids: list[int] | None = None) -> TurnRecord:
        """Store an engine Reply to ``message`` as the conversation's next turn (or, with
        ``slot``, an alternative there). ``stream_id``: a client's streamed completion id,
        kept so that the turn is found by it later. ``style``: the instruction the reply was
        asked for in (``explore``); it is kept in ``gen_params`` and the turn stores
        ``plain_prompt_ids``, the prompt of the message the person wrote."""
        gen_params = dict(reply.gen_params)
        if stream_id:
            gen_params["stream_id"] = stream_id
        prompt_ids = reply.prompt_ids
        if style is not None:
            gen_params["style"] = style
            prompt_ids = plain_prompt_ids
        return self.store.append_turn(
            conversation_id, message, reply.text,
            prompt_ids=prompt_ids, reply_ids=reply.reply_ids,
            logprobs=reply.logprobs, checkpoint_id=reply.checkpoint_id,
            model=model_display_name(self.engine.model_name), gen_params=gen_params,
            ttft_ms=reply.ttft_ms, latency_ms=reply.latency_ms,
            interrupted=reply.interrupted, context_turn_ids=context_turn_ids or [],
            slot=slot, picked=picked)

    def stream_again(self, turn_id: int, *, picked: bool = True, stream_id: str | None = None,
                     **generation: Any) -> ChatStream:
        """Another reply to the message of ``turn_id``, the last turn of its conversation (or
        an alternative of it), from the same context: stored as an alternative in its slot.
        ``picked``: it becomes the turn the conversation continues from (the default: it is
        the reply the person sees last). NotFound for an unknown turn; Conflict when the
        conversation went on after it."""
        params = self._params(generation)
        turn = self.store.get_turn(turn_id)  # NotFound before waiting on a lock
        conversation_id = turn.conversation_id
        self._acquire(conversation_id)
        try:
            context, prompt_ids = self._again_prompt(turn, params)
            chat = ChatStream(self, conversation_id, turn.user_message, stream_id)
            chat.context_turn_ids = [t.id for t in context]
            chat.slot, chat.picked = turn.index, picked
            sampled_ids = self._explore_into(chat, prompt_ids, params, key=f"again-{turn_id}")
            chat._reply_stream = self.engine.stream_prompt(sampled_ids, params,
                                                           on_finish=chat._store)
        except BaseException:
            self._release(conversation_id)
            raise
        return chat

    def alternatives(self, turn_id: int, count: int, **generation: Any) -> list[TurnRecord]:
        """``count`` more replies to the message of ``turn_id``, as ``stream_again`` samples
        one, but together in one batch (``Engine.replies``: one random stream, seeded by
        ``seed`` when given) and not streamed; each is stored as an alternative in its
        slot, not picked. With best-of-n on, one ``stream_again`` each (seeds ``seed``,
        ``seed + 1``, ...), since best-of-n chooses each reply on its own."""
        if self.config.generation.best_of > 1:
            seed = generation.get("seed")
            return [self.stream_again(turn_id, picked=False, **{
                **generation, "seed": None if seed is None else seed + i}).wait()
                for i in range(count)]
        params = self._params(generation)
        turn = self.store.get_turn(turn_id)
        self._acquire(turn.conversation_id)
        try:
            context, prompt_ids = self._again_prompt(turn, params)
            rated = self.style_ratings()
            drawn = [self.explore(prompt_ids, params, key=f"alt-{turn_id}-{i}", rated=rated)
                     for i in range(count)]
            replies = self.engine.replies([ids for ids, _ in drawn], params)
            return [self.store_reply(turn.conversation_id, turn.user_message, reply,
                                     context_turn_ids=[t.id for t in context],
                                     slot=turn.index, picked=False, style=style,
                                     plain_prompt_ids=prompt_ids)
                    for reply, (_, style) in zip(replies, drawn)]
        finally:
            self._release(turn.conversation_id)

    def _again_prompt(self, turn: TurnRecord, params: dict[str, Any]):
        """The context turns and prompt ids of another reply to ``turn``'s message; Conflict
        when the conversation went on after it. Called with the conversation's lock held."""
        path = self.store.conversation_turns(turn.conversation_id)  # now that no reply runs
        if path and path[-1].index > turn.index:
            raise Conflict(f"turn {turn.id} is not the last of its conversation; only the "
                           "last reply can be sampled again (later turns continue from it)",
                           fix="regenerate the last reply of the conversation")
        context = [t for t in path if t.index < turn.index and t.reply]
        conv = self.store.get_conversation(turn.conversation_id)
        prompt_ids = self.engine.build_prompt(
            [(t.user_message, t.reply) for t in context], turn.user_message,
            max_new_tokens=params["max_new_tokens"], system=conv.system_prompt)
        return context, prompt_ids

    def pick(self, turn_id: int) -> tuple[TurnRecord, list[PairRecord]]:
        """Make ``turn_id`` the alternative its conversation continues from, and store the
        person's preference for it over each other alternative (``regenerate`` pairs); waits
        for a reply to that conversation that is still running."""
        conversation_id = self.store.get_turn(turn_id).conversation_id
        self._acquire(conversation_id)
        try:
            return self.store.pick_alternative(turn_id)
        finally:
            self._release(conversation_id)

    def _params(self, generation: dict[str, Any]) -> dict[str, Any]:
        unknown = set(generation) - set(GENERATION_KEYS)
        if unknown:
            raise BadInput(f"unknown generation setting {sorted(unknown)[0]!r}",
                           fix="use " + ", ".join(GENERATION_KEYS))
        return self.engine.generation_params(
            **{k: v for k, v in generation.items() if v is not None})

    def _acquire(self, conversation_id: int) -> None:
        with self._locks_guard:
            lock = self._locks.setdefault(conversation_id, threading.Lock())
        lock.acquire()

    def _release(self, conversation_id: int) -> None:
        with self._locks_guard:
            lock = self._locks.get(conversation_id)
        if lock is not None and lock.locked():
            lock.release()
