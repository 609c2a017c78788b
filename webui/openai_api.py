"""The OpenAI-compatible API: POST /v1/chat/completions and GET /v1/models.

Any OpenAI client can chat with the learning model, and every completion is a stored
turn that can be rated: the completion id is ``chatcmpl-<turn_id>``, which
``PUT /api/turns/<id>/rating`` accepts as is.

How ``messages`` maps to Reinf's conversations: the last message must be the user's,
and it is the new message. The earlier user/assistant pairs are the history. If they
equal a stored conversation's turns (a client re-sending its history, as OpenAI clients
do), that conversation is continued; otherwise a new conversation is created holding
those pairs as imported turns (model ``client-history``; never trained on, since they
have no tokens), so the model sees the same history. A ``conversation_id`` field, or the
``X-Reinf-Conversation`` header, continues that conversation directly. ``user`` becomes
the conversation's user id. ``system`` and ``developer`` messages, wherever they stand,
joined by blank lines, are the conversation's system prompt: a new conversation gets it
(without any, the config's ``system_prompt``); a matching stored conversation is continued
only if its own is the same (any, when the request has none); an explicit one whose own
differs takes the request's while it has no turns, else the request gets 409.
``seed`` makes a request repeatable: the same request (same prompt, settings and model)
gives the same choices. Fields OpenAI defines but Reinf does not use (stop, penalties, ...)
are ignored; tools and non-text content are refused with 400.

``n`` (1 to MAX_CHOICES): the first choice is sampled (and streamed) as any reply; the
other ``n - 1`` are then sampled together, in one batch from the same prompt
(``ChatService.alternatives``; with ``seed``, that batch has ``seed + 1``). The first is a
new turn; the others are stored as its alternatives (reinf.storage.schema.Turn: the
same slot, not picked), so each choice is a turn of its own with its own id, rated as any
turn: ``chatcmpl-<choices[i].turn_id>`` (each choice carries ``turn_id`` and ``id``, and
``style``: the instruction ``explore_styles`` asked for the reply in, or null). A
client that continues the conversation from another choice (re-sending it as the
assistant message) continues it from that one: it becomes the picked alternative.

Streaming: the turn id is known only once the reply is stored, so the final chunk (the
one with ``finish_reason``) has id ``chatcmpl-<turn_id>`` plus ``turn_id``,
``conversation_id`` and ``style`` fields; with ``n`` > 1 the first choice streams token by
token, then each other choice comes whole (one content chunk), each ending with such a
chunk for its ``index``. Earlier chunks carry ``chatcmpl-stream-<hex>`` (clients such
as the ``llm`` CLI log the first chunk's id): the turn stores the hex, so ``reinf rate``
and the rating route resolve it too, after a restart as well (Store.resolve_turn).
"""
from __future__ import annotations

import json
import time
from typing import Any

from flask import Blueprint, Response, jsonify, request

from reinf.errors import BadInput, NotFound, ReinfError
from reinf.storage.store import COMPLETION_PREFIX, STREAM_PREFIX, check_system_prompt
from webui.params import get_id, get_number, read_json
from webui.runtime import get_runtime
from webui.streaming import SSE_HEADERS, Relay, new_stream_id

bp = Blueprint("openai", __name__, url_prefix="/v1")

SYSTEM_ROLES = {"system", "developer"}
CREATED = int(time.time())
MATCH_WINDOW = 200  # recent turns searched for a conversation to continue
MAX_CHOICES = 8     # n: each choice is a full reply (the first, then the others in one batch)
MAX_SEED = 2**63 - 1


def chunk_data(payload: dict) -> str:
    return "data: " + json.dumps(payload, ensure_ascii=False) + "\n\n"


def model_entry(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": CREATED, "owned_by": "reinf"}


@bp.get("/models")
def models():
    return jsonify({"object": "list", "data": [model_entry(get_runtime().model_name)]})


@bp.get("/models/<path:model_id>")
def model(model_id: str):
    name = get_runtime().model_name
    if model_id != name:
        raise NotFound(f"no model {model_id!r}; this server serves {name!r}")
    return jsonify(model_entry(name))


# --- messages -> (history pairs, new message) ------------------------------------------

def message_text(message: Any, i: int) -> str:
    if not isinstance(message, dict):
        raise BadInput(f"messages[{i}] must be an object with role and content",
                       key="messages")
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or \
                    not isinstance(part.get("text"), str):
                raise BadInput(f"messages[{i}]: only text content parts are supported",
                               key="messages")
            parts.append(part["text"])
        return "".join(parts)
    raise BadInput(f"messages[{i}].content must be a string or a list of text parts",
                   key="messages")


def split_messages(messages: Any) -> tuple[list[tuple[str, str]], str, str | None]:
    """OpenAI messages -> ([(user, assistant), ...] oldest first, the new user message, the
    system prompt: the system and developer messages joined by blank lines, None if none)."""
    if not isinstance(messages, list) or not messages:
        raise BadInput("'messages' must be a non-empty list", key="messages",
                       fix='e.g. [{"role": "user", "content": "hello"}]')
    pairs: list[tuple[str, str]] = []
    system: list[str] = []
    pending: str | None = None
    last_role = None
    for i, message in enumerate(messages):
        text = message_text(message, i)
        role = message.get("role")
        if not isinstance(role, str):
            raise BadInput(f"messages[{i}].role must be a string: user, assistant or system",
                           key="messages")
        if role in SYSTEM_ROLES:
            system.append(text)
            continue
        if role == "user":
            pending = text if pending is None else pending + "\n\n" + text
        elif role == "assistant":
            pairs.append((pending or "", text))
            pending = None
        else:
            raise BadInput(f"messages[{i}].role {role!r} is not supported; use user, "
                           "assistant or system", key="messages")
        last_role = role
    if last_role != "user" or pending is None or not pending.strip():
        raise BadInput("the last message must be a non-empty user message", key="messages")
    return pairs, pending, "\n\n".join(t for t in system if t.strip()) if system else None


def resolve_conversation(store, pairs: list[tuple[str, str]], user: str | None,
                         explicit: int | None, system: str | None,
                         default_system: str | None = None) -> tuple[int, bool]:
    """The conversation a completion belongs to (see the module docstring), and whether it
    was created for this request. ``system``: the request's system prompt (None: it sent
    none; a new conversation then takes ``default_system``, the config's)."""
    if explicit is not None:
        store.get_conversation(explicit)
        return explicit, False
    if pairs:
        last_user, last_reply = pairs[-1]
        seen: set[int] = set()
        for turn in store.history(limit=MATCH_WINDOW):
            cid = turn.conversation_id
            if cid in seen or turn.user_message != last_user or turn.reply != last_reply:
                continue
            seen.add(cid)
            turns = store.conversation_turns(cid)
            path = [(t.user_message, t.reply) for t in turns]
            # the client went on from another choice (n > 1) of the last reply: pick it
            other_choice = not turn.picked and turns and turns[-1].index == turn.index and \
                path[:-1] == pairs[:-1]
            if (path == pairs or other_choice) and \
                    (user is None or turns[0].user_id == user) and \
                    (system is None or turns[0].system_prompt == check_system_prompt(system)):
                if other_choice:
                    store.pick_alternative(turn.id, record=False)
                return cid, False
    conversation = store.create_conversation(
        user_id=user or "local", system_prompt=default_system if system is None else system)
    for user_text, reply in pairs:
        store.append_turn(conversation.id, user_text, reply, model="client-history",
                          gen_params={"imported": True})
    return conversation.id, True


def generation_from(body: dict, config) -> dict[str, Any]:
    temperature = get_number(body.get("temperature"), "temperature", low=0.0, high=5.0)
    gen = {"temperature": max(temperature, 0.01) if temperature is not None else None,
           "top_p": get_number(body.get("top_p"), "top_p", low=0.01, high=1.0)}
    for name in ("max_completion_tokens", "max_tokens"):
        if body.get(name) is not None:
            gen["max_new_tokens"] = get_number(body[name], name, low=1, high=32_768,
                                               integer=True)
            break
    gen["seed"] = get_number(body.get("seed"), "seed", low=0, high=MAX_SEED, integer=True)
    return {k: v for k, v in gen.items() if v is not None}


def finish_reason(turn, gen: dict, config) -> str:
    limit = gen.get("max_new_tokens") or config.generation.max_new_tokens
    return "length" if not turn.interrupted and len(turn.reply_ids) >= limit else "stop"


def usage(turns) -> dict[str, int]:
    """Token counts of one completion's choices (one prompt, each choice's reply)."""
    turns = turns if isinstance(turns, list) else [turns]
    prompt = len(turns[0].prompt_ids)
    completion = sum(len(t.reply_ids) for t in turns)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


# --- the route -------------------------------------------------------------------------

@bp.post("/chat/completions")
def completions():
    runtime = get_runtime()
    config = runtime.config
    body = read_json()
    pairs, message, system = split_messages(body.get("messages"))
    limit = config.server.max_message_chars
    if len(message) > limit:
        raise ReinfError(f"the last message is {len(message)} characters; the limit is {limit}",
                         status=413, key="max_message_chars",
                         fix="send a shorter message, or raise max_message_chars")
    n = get_number(body.get("n"), "n", low=1, high=MAX_CHOICES, integer=True) or 1
    if body.get("tools") or body.get("functions"):
        raise BadInput("tools and functions are not supported by this server", key="tools")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadInput("'stream' must be true or false", key="stream")
    user = body.get("user")
    if user is not None and (not isinstance(user, str) or len(user) > 100):
        raise BadInput("'user' must be a string of at most 100 characters", key="user")
    explicit = get_id(body.get("conversation_id") or
                      request.headers.get("X-Reinf-Conversation"), "conversation_id")
    if system is not None and len(system) > limit:
        raise ReinfError(f"the system messages are {len(system)} characters; the limit is "
                         f"{limit}", status=413, key="max_message_chars",
                         fix="send a shorter system message, or raise max_message_chars")
    gen = generation_from(body, config)
    if system is not None and explicit is not None:  # must match, or replace one unused yet
        gen["system_prompt"] = system
    service = runtime.require_chat()
    conversation_id, new = resolve_conversation(runtime.store, pairs, user or None, explicit,
                                                system, config.generation.system_prompt)
    created, name = int(time.time()), runtime.model_name
    stream_id = new_stream_id()  # chosen before the reply starts: its turn stores it
    again = {k: v for k, v in gen.items() if k != "system_prompt"}  # the choices after the 1st
    if "seed" in again:  # one batch of their own: not the first choice's random stream
        again["seed"] += 1
    try:
        if stream:
            reply = service.stream(message, conversation_id=conversation_id,
                                   stream_id=stream_id, **gen)
        else:
            turn = service.send(message, conversation_id=conversation_id, **gen)
    except Exception:
        if new:  # refused before a reply was stored: leave no conversation half-made
            runtime.store.forget_conversation(conversation_id)
        raise
    if not stream:
        turns = [turn] + (service.alternatives(turn.id, n - 1, **again) if n > 1 else [])
        return jsonify({
            "id": f"{COMPLETION_PREFIX}{turn.id}", "object": "chat.completion", "created": created,
            "model": name, "system_fingerprint": turn.checkpoint_id or "base",
            "choices": [{"index": i, "message": {"role": "assistant", "content": t.reply},
                         "logprobs": None, "finish_reason": finish_reason(t, gen, config),
                         "id": f"{COMPLETION_PREFIX}{t.id}", "turn_id": t.id,
                         "style": t.style}
                        for i, t in enumerate(turns)],
            "usage": usage(turns), "turn_id": turn.id, "conversation_id": turn.conversation_id})
    include_usage = isinstance(body.get("stream_options"), dict) and \
        bool(body["stream_options"].get("include_usage"))
    if n > 1:
        reply = Choices(service, reply, n, again)
    runtime.streams.add(reply, stream_id)
    provisional = STREAM_PREFIX + stream_id

    def chunk(delta: dict, reason: str | None = None, cid: str = provisional, index: int = 0,
              **extra) -> str:
        return chunk_data({"id": cid, "object": "chat.completion.chunk", "created": created,
                           "model": name, "choices": [{"index": index, "delta": delta,
                                                       "logprobs": None,
                                                       "finish_reason": reason}], **extra})

    def end(turn, index: int = 0) -> str:
        return chunk({}, finish_reason(turn, gen, config), f"{COMPLETION_PREFIX}{turn.id}",
                     index, turn_id=turn.id, conversation_id=turn.conversation_id,
                     style=turn.style)

    def delta(item) -> str:
        if isinstance(item, str):
            return chunk({"content": item})
        kind, index, value = item  # Choices: ("delta", i, text) or ("end", i, turn)
        return chunk({"content": value}, index=index) if kind == "delta" else end(value, index)

    def done(stored) -> list[str]:
        turns = stored if isinstance(stored, list) else [stored]
        out = [] if isinstance(stored, list) else [end(stored)]
        if include_usage and turns:
            out.append(chunk_data({"id": f"{COMPLETION_PREFIX}{turns[0].id}",
                                   "object": "chat.completion.chunk", "created": created,
                                   "model": name, "choices": [], "usage": usage(turns)}))
        return out + ["data: [DONE]\n\n"]

    def error(err: dict) -> str:
        return chunk_data({"error": {"message": err.get("error", "generation failed"),
                                     "type": "server_error", "code": err.get("status")}}) \
            + "data: [DONE]\n\n"

    def start() -> str:
        return "".join(chunk({"role": "assistant", "content": ""}, index=i) for i in range(n))

    events = Relay(reply, runtime.streams, stream_id, start=start, delta=delta, done=done,
                   error=error)
    return Response(events, mimetype="text/event-stream", headers=SSE_HEADERS)


class Choices:
    """``n`` streamed choices as one stream (webui.streaming.Relay's interface): the first
    reply as it streams, then the ``n - 1`` others, sampled together as alternatives of its
    turn (``ChatService.alternatives``, not picked), each whole. Iterating gives
    ``("delta", index, text)`` and, as each choice is stored, ``("end", index, turn)``;
    ``turn`` is then the list of stored turns. ``stop()`` ends the first reply if it is
    still running and samples no others."""

    def __init__(self, service, first, n: int, generation: dict):
        self.service, self.n, self.generation = service, n, generation
        self.conversation_id = first.conversation_id
        self.turns: list = []
        self._first = first
        self._stopped = False
        self._items = self._run()

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._items)

    def _run(self):
        for text in self._first:
            yield "delta", 0, text
        turn = self._first.turn
        if turn is None:
            return
        self.turns.append(turn)
        yield "end", 0, turn
        if self._stopped:
            return
        for index, other in enumerate(self.service.alternatives(turn.id, self.n - 1,
                                                                **self.generation), start=1):
            self.turns.append(other)
            if other.reply:
                yield "delta", index, other.reply
            yield "end", index, other

    def stop(self) -> None:
        self._stopped = True
        self._first.stop()

    @property
    def turn(self) -> list:
        return self.turns
