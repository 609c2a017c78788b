"""The JSON API of chat and ratings (docs/design.md §6): chat, rate, history, conversations,
forget, alternatives (again, pick), compare, pairs and the leaderboard. Thin: parse, call
the store, the chat service, reinf.serving.compare or reinf.training.leaderboard, return JSON."""
from __future__ import annotations

from importlib import metadata

from flask import Blueprint, Response, current_app, jsonify, request

from reinf.errors import BadInput, NotAvailable, NotFound
from webui.params import (generation_args, get_id, get_text, query_bool, query_datetime, query_int,
                          query_text, read_json)
from webui.reports import history_rows
from webui.runtime import get_runtime
from webui.streaming import SSE_HEADERS, Relay, sse

bp = Blueprint("api", __name__, url_prefix="/api")

CHAT_FIELDS = {"message", "conversation_id", "stream", "temperature", "top_p", "max_new_tokens",
               "system_prompt"}
CONVERSATION_FIELDS = {"system_prompt"}
RATING_FIELDS = {"score", "tags", "comment", "critical"}
REWRITE_FIELDS = {"text"}
AGAIN_FIELDS = {"stream", "temperature", "top_p", "max_new_tokens"}
COMPARE_FIELDS = {"prompt", "turn_id", "checkpoint", "blind", "temperature", "top_p",
                  "max_new_tokens"}
PICK_FIELDS = {"winner", "reveal"}


def version() -> str:
    try:
        return metadata.version("reinf")
    except metadata.PackageNotFoundError:
        return "unknown"


@bp.get("/ping")
def ping():
    runtime = get_runtime()
    return jsonify({"service": "reinf", "version": version(), "model": runtime.model_name,
                    "chat": runtime.chat is not None,
                    # which data directory this server serves, by its random id (never the
                    # path): a client bound to another one refuses to use it
                    "instance": runtime.instance_id})


# --- chat ------------------------------------------------------------------------------

@bp.post("/chat")
def chat():
    runtime = get_runtime()
    body = read_json(CHAT_FIELDS)
    message = get_text(body, "message", max_chars=runtime.config.server.max_message_chars,
                       config_key="max_message_chars")
    conversation_id = get_id(body.get("conversation_id"), "conversation_id")
    stream = read_stream_flag(body)
    gen = generation_args(body, runtime.config)
    system_prompt = read_system_prompt(body, runtime.config)
    if system_prompt is not None:  # else a new conversation takes the config's
        gen["system_prompt"] = system_prompt
    service = runtime.require_chat()
    if conversation_id is not None:
        runtime.store.get_conversation(conversation_id)  # 404 before anything starts
    if not stream:
        turn = service.send(message, conversation_id=conversation_id, **gen)
        return jsonify(turn.to_dict())
    return stream_reply(runtime, service.stream(message, conversation_id=conversation_id,
                                                **gen))


def read_stream_flag(body) -> bool:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadInput("'stream' must be true or false", key="stream")
    return stream


def stream_reply(runtime, reply, **start: object) -> Response:
    """A reply in progress as Server-Sent Events: ``start`` (conversation_id, stream_id and
    ``start``'s fields), a ``delta`` per piece of text, then ``done`` (the stored turn) or
    ``error``."""
    stream_id = runtime.streams.add(reply)

    def done(turn) -> str:
        return sse({"turn_id": turn.id, "conversation_id": turn.conversation_id,
                    "reply": turn.reply, "checkpoint_id": turn.checkpoint_id or "base",
                    "interrupted": turn.interrupted, "ttft_ms": turn.ttft_ms,
                    "latency_ms": turn.latency_ms, "reply_tokens": len(turn.reply_ids),
                    "index": turn.index, "picked": turn.picked,
                    "alternatives": turn.alternatives,
                    "style": turn.style}, "done")

    events = Relay(reply, runtime.streams, stream_id,
                   start=lambda: sse({"conversation_id": reply.conversation_id,
                                      "stream_id": stream_id, **start}, "start"),
                   delta=lambda text: sse({"delta": text}), done=done,
                   error=lambda err: sse(err, "error"))
    return Response(events, mimetype="text/event-stream", headers=SSE_HEADERS)


@bp.post("/chat/<stream_id>/stop")
def stop(stream_id: str):
    read_json(set(), optional_body=True)
    if not get_runtime().streams.stop(stream_id):
        raise NotFound(f"no reply in progress with stream id {stream_id[:40]!r}",
                       fix="it may have finished already")
    return jsonify({"stopped": True, "stream_id": stream_id})


# --- ratings ---------------------------------------------------------------------------

@bp.put("/turns/<turn_ref>/rating")
def rate(turn_ref: str):
    runtime = get_runtime()
    turn_id = runtime.store.resolve_turn(turn_ref)  # last, 12, chatcmpl-12, chatcmpl-stream-…
    body = read_json(RATING_FIELDS, required=("score",))
    rating = runtime.store.rate(turn_id, body["score"], tags=body.get("tags"),
                                comment=body.get("comment") or "",
                                critical=body.get("critical", False))
    runtime.notify_rating()
    return jsonify(rating.to_dict())


@bp.delete("/turns/<turn_ref>/rating")
def undo(turn_ref: str):
    runtime = get_runtime()
    turn_id = runtime.store.resolve_turn(turn_ref)
    runtime.store.get_turn(turn_id)  # 404 for an unknown turn
    removed = runtime.store.undo_rating(turn_id)
    return jsonify({"removed": removed.to_dict() if removed else None})


# --- rewrites: the reply the person wanted ----------------------------------------------

@bp.put("/turns/<turn_ref>/rewrite")
def rewrite(turn_ref: str):
    runtime = get_runtime()
    turn_id = runtime.store.resolve_turn(turn_ref)
    body = read_json(REWRITE_FIELDS, required=("text",))
    # Not a rating for the ratings trigger: the timer's round reads it, as it reads picks.
    return jsonify(runtime.store.rewrite(turn_id, body["text"]).to_dict())


@bp.delete("/turns/<turn_ref>/rewrite")
def remove_rewrite(turn_ref: str):
    runtime = get_runtime()
    removed = runtime.store.delete_rewrite(runtime.store.resolve_turn(turn_ref))
    return jsonify({"removed": removed.to_dict() if removed else None})


# --- turns and conversations -----------------------------------------------------------

@bp.get("/turns/<turn_ref>")
def turn(turn_ref: str):
    runtime = get_runtime()
    record = runtime.store.get_turn(runtime.store.resolve_turn(turn_ref))
    return jsonify(history_rows(runtime.round_config(), [record])["turns"][0])


@bp.delete("/turns/<turn_ref>")
def forget_turn(turn_ref: str):
    runtime = get_runtime()
    return jsonify({"forgotten": runtime.store.forget_turn(runtime.store.resolve_turn(turn_ref))})


@bp.get("/history")
def history():
    runtime = get_runtime()
    min_score = query_int("min_score", low=1, high=5)
    max_score = query_int("max_score", low=1, high=5)
    if min_score is not None and max_score is not None and min_score > max_score:
        raise BadInput(f"min_score ({min_score}) is above max_score ({max_score})")
    conversation = request.args.get("conversation_id")
    turns = runtime.store.history(
        limit=query_int("limit", low=1, high=10_000, default=50),
        conversation_id=get_id(conversation, "conversation_id") if conversation else None,
        rated=query_bool("rated"), min_score=min_score, max_score=max_score,
        tag=query_text("tag"), since=query_datetime("since"),
        until=query_datetime("until", end_of_day=True))
    out = history_rows(runtime.round_config(), turns)
    out["count"] = len(out["turns"])
    return jsonify(out)


@bp.get("/conversations")
def conversations():
    runtime = get_runtime()
    rows = runtime.store.list_conversations(
        limit=query_int("limit", low=1, high=1000, default=50),
        offset=query_int("offset", low=0, high=10**9, default=0))
    return jsonify({"conversations": [c.to_dict() for c in rows]})


@bp.get("/conversations/<conversation_ref>")
def conversation(conversation_ref: str):
    runtime = get_runtime()
    conversation_id = get_id(conversation_ref, "conversation_id")
    record = runtime.store.get_conversation(conversation_id)
    turns = runtime.store.conversation_turns(conversation_id)
    return jsonify({"conversation": record.to_dict(), "turns": [t.to_dict() for t in turns]})


@bp.route("/conversations/<conversation_ref>", methods=["PUT", "PATCH"])
def update_conversation(conversation_ref: str):
    """``{system_prompt}`` ("" or null: none), only while the conversation has no turns."""
    runtime = get_runtime()
    conversation_id = get_id(conversation_ref, "conversation_id")
    body = read_json(CONVERSATION_FIELDS, required=())
    if "system_prompt" not in body:
        raise BadInput("nothing to change", key="system_prompt",
                       fix='send {"system_prompt": "..."}')
    text = read_system_prompt(body, runtime.config) or ""
    if runtime.chat is not None:  # waits for a reply to it that is still running
        record = runtime.chat.update_conversation(conversation_id, system_prompt=text)
    else:
        record = runtime.store.update_conversation(conversation_id, system_prompt=text)
    return jsonify({"conversation": record.to_dict()})


def read_system_prompt(body, config) -> str | None:
    """A request's ``system_prompt`` (at most max_message_chars); None when absent or null."""
    return get_text(body, "system_prompt", max_chars=config.server.max_message_chars,
                    required=False, config_key="max_message_chars")


@bp.delete("/conversations/<conversation_ref>")
def forget_conversation(conversation_ref: str):
    runtime = get_runtime()
    conversation_id = get_id(conversation_ref, "conversation_id")
    return jsonify({"forgotten": runtime.store.forget_conversation(conversation_id)})


@bp.post("/turns/<turn_ref>/cut")
def cut(turn_ref: str):
    """Keep of a stored reply only what the person saw: ``{"shown": text}``, the start of
    the reply as displayed before they stopped it. The turn keeps the tokens of that text,
    marked interrupted; with ``shown`` empty it is forgotten (``{"turn": null}``)."""
    runtime = get_runtime()
    turn_id = runtime.store.resolve_turn(turn_ref)
    body = read_json({"shown"})
    shown = body.get("shown")
    if not isinstance(shown, str):
        raise BadInput("shown must be the text of the reply that was displayed",
                       fix='send {"shown": "..."}')
    turn = runtime.require_chat().cut_to_shown(turn_id, shown)
    return jsonify({"turn": None if turn is None else turn.to_dict()})


# --- alternatives: another reply to the same message, and the pick ---------------------

@bp.post("/turns/<turn_ref>/again")
def again(turn_ref: str):
    """Another reply to the message of the conversation's last turn, stored as an
    alternative in its slot and picked (the conversation continues from it)."""
    runtime = get_runtime()
    turn_id = runtime.store.resolve_turn(turn_ref)
    body = read_json(AGAIN_FIELDS, optional_body=True)
    stream = read_stream_flag(body)
    gen = generation_args(body, runtime.config)
    service = runtime.require_chat()
    turn = runtime.store.get_turn(turn_id)  # 404 before anything starts
    if not stream:
        return jsonify(service.stream_again(turn_id, **gen).wait().to_dict())
    return stream_reply(runtime, service.stream_again(turn_id, **gen), alternative_of=turn_id,
                        index=turn.index)


@bp.get("/turns/<turn_ref>/alternatives")
def alternatives(turn_ref: str):
    runtime = get_runtime()
    turns = runtime.store.alternatives(runtime.store.resolve_turn(turn_ref))
    return jsonify({"turns": [t.to_dict() for t in turns]})


@bp.post("/turns/<turn_ref>/pick")
def pick(turn_ref: str):
    """This alternative continues the conversation; a pair (source ``regenerate``) records
    it as preferred over each other alternative of its slot."""
    runtime = get_runtime()
    turn_id = runtime.store.resolve_turn(turn_ref)
    read_json(set(), optional_body=True)
    if runtime.chat is not None:  # waits for a reply to that conversation still running
        turn, pairs = runtime.chat.pick(turn_id)
    else:
        turn, pairs = runtime.store.pick_alternative(turn_id)
    return jsonify({"turn": turn.to_dict(), "pairs": [p.to_dict() for p in pairs]})


# --- compare: base, active and another checkpoint, blind --------------------------------

def comparisons():
    """This app's comparisons waiting for a pick (reinf.serving.compare.Comparisons)."""
    from reinf.serving.compare import Comparisons

    return current_app.extensions.setdefault("reinf.comparisons", Comparisons())


@bp.post("/compare")
def compare():
    from reinf.serving.compare import build_comparison

    runtime = get_runtime()
    body = read_json(COMPARE_FIELDS)
    prompt = get_text(body, "prompt", max_chars=runtime.config.server.max_message_chars,
                      required=False, config_key="max_message_chars")
    turn_ref = body.get("turn_id")
    if isinstance(turn_ref, bool) or not isinstance(turn_ref, (str, int, type(None))):
        raise BadInput("'turn_id' must be a turn id, `last` or a chatcmpl-… id", key="turn_id")
    turn_id = runtime.store.resolve_turn(str(turn_ref)) if turn_ref is not None else None
    if (prompt is None) == (turn_id is None):
        raise BadInput("give 'prompt' or 'turn_id' (one of them)", key="prompt",
                       fix='e.g. {"prompt": "Explain LoRA briefly"}')
    if prompt is not None and not prompt.strip():
        raise BadInput("'prompt' is empty", key="prompt", fix="type something to compare")
    checkpoint = body.get("checkpoint")
    if checkpoint is not None and not isinstance(checkpoint, str):
        raise BadInput("'checkpoint' must be a checkpoint id (or a unique prefix)",
                       key="checkpoint")
    blind = body.get("blind", True)
    if not isinstance(blind, bool):
        raise BadInput("'blind' must be true or false", key="blind")
    if turn_id is not None:
        runtime.store.get_turn(turn_id)  # 404
    engine = runtime.engine
    if engine is None:
        raise NotAvailable("no model is loaded in this server", fix="start it with `reinf serve`")
    comparison = build_comparison(engine, runtime.store, runtime.config, prompt=prompt,
                                  turn_id=turn_id, checkpoint=checkpoint, blind=blind,
                                  **generation_args(body, runtime.config))
    return jsonify(comparisons().add(comparison).to_dict())


@bp.get("/compare/<compare_id>")
def comparison(compare_id: str):
    return jsonify(comparisons().get(compare_id).to_dict())


@bp.post("/compare/<compare_id>/pick")
def compare_pick(compare_id: str):
    runtime = get_runtime()
    body = read_json(PICK_FIELDS, required=("winner",))
    reveal = body.get("reveal", True)
    if not isinstance(reveal, bool):
        raise BadInput("'reveal' must be true or false", key="reveal")
    picked = comparisons().pick(runtime.store, compare_id, body["winner"])
    return jsonify(picked.to_dict(reveal=reveal))


@bp.get("/prompts")
def prompts():
    """The person's recent distinct messages (the compare page's picker)."""
    runtime = get_runtime()
    limit = query_int("limit", low=1, high=500, default=20)
    return jsonify({"prompts": runtime.store.recent_prompts(limit)})


# --- pairs -----------------------------------------------------------------------------

@bp.get("/pairs")
def pairs():
    runtime = get_runtime()
    conversation = request.args.get("conversation_id")
    turn = request.args.get("turn_id")
    checkpoint = query_text("checkpoint_id", max_chars=64)
    rows = runtime.store.list_pairs(
        limit=query_int("limit", low=1, high=10_000, default=50),
        source=query_text("source"), outcome=query_text("outcome"),
        conversation_id=get_id(conversation, "conversation_id") if conversation else None,
        turn_id=get_id(turn, "turn_id") if turn else None,
        checkpoint_id=... if checkpoint is None else (None if checkpoint == "base"
                                                      else checkpoint),
        since=query_datetime("since"))
    return jsonify({"pairs": [p.to_dict() for p in rows], "count": len(rows)})


@bp.get("/leaderboard")
def leaderboard():
    """A Bradley-Terry score per checkpoint from the person's picks (reinf.training.leaderboard);
    ``blind``: only blind (true) or only seen (false) picks."""
    from reinf.training.leaderboard import build_leaderboard

    return jsonify(build_leaderboard(get_runtime().store, blind=query_bool("blind")))
