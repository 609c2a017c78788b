"""``reinf chat``: the terminal REPL, and ``--once`` for scripts."""
from __future__ import annotations

import sys

import click

from reinf.cli.common import dump_json, json_option, strip_escapes
from reinf.errors import NotAvailable

PASTE_ON, PASTE_OFF = "\x1b[?2004h", "\x1b[?2004l"  # bracketed paste mode on / off


@click.command()
@click.option("--once", "once", metavar="TEXT", help="Send one message, print the reply, exit.")
@click.option("--conversation", "conversation_id", type=int, help="Continue this conversation.")
@click.option("--url", help="Talk to the daemon at this URL instead of the default.")
@click.option("--temperature", type=float, help="Sampling temperature for this session.")
@click.option("--max-new-tokens", type=int, help="Longest reply, in tokens, for this session.")
@click.option("--system", "system_prompt", metavar="TEXT",
              help="System prompt of the conversations this session starts (\"\" = none; "
                   "default: system_prompt in config.yaml).")
@json_option
@click.pass_obj
def chat(app, once, conversation_id, url, temperature, max_new_tokens, system_prompt, as_json):
    """Chat in the terminal, rating each reply 1-5 (Enter skips).

    With a Reinf daemon running (`reinf serve`), chat talks to it; otherwise the model
    runs in this process. Ctrl-C stops a reply (the part you saw is kept, marked
    interrupted; nothing, if nothing appeared yet). At a prompt Ctrl-C clears the line;
    a second Ctrl-C, or Ctrl-D, leaves.
    """
    app.override(temperature=temperature, max_new_tokens=max_new_tokens)
    backend = build_backend(app, url, quiet=as_json, conversation_id=conversation_id,
                            system_prompt=system_prompt)
    if once is not None:
        sys.exit(send_once(backend, once, conversation_id, as_json, system_prompt=system_prompt))
    from reinf.cli.repl import Repl

    bracketed_paste()
    sys.exit(Repl(backend, conversation_id=conversation_id, system_prompt=system_prompt).run())


def bracketed_paste() -> None:
    """At a terminal, ask it to mark pastes (ESC[200~ ... ESC[201~), so that a paste of
    several lines is one message (reinf.cli.repl.Repl.unbracket), not one message per line;
    and to stop marking them when chat ends. A terminal that does not know the request
    ignores it; /paste and a trailing backslash still take several lines."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        return
    import atexit

    sys.stdout.write(PASTE_ON)
    sys.stdout.flush()
    atexit.register(lambda: (sys.stdout.write(PASTE_OFF), sys.stdout.flush()))


def build_backend(app, url: str | None, *, quiet: bool = False,
                  conversation_id: int | None = None, system_prompt: str | None = None):
    """The daemon's HTTP backend when one answers, else the model in this process.

    An unknown ``conversation_id`` fails here, before the slow model load, and so does a
    ``system_prompt`` other than its own once it has turns."""
    from reinf.client import HttpBackend
    from reinf.daemon.remote import find_server

    cfg = app.config
    # at --url, else the server of this data directory (same DB), else the configured address
    target = find_server(cfg, url)
    if target:
        backend = HttpBackend(target, cfg, generation=dict(app.overrides))
        if conversation_id is not None:
            check_system_prompt(backend.conversation(conversation_id), system_prompt)
        return backend
    if url:
        raise NotAvailable(f"no Reinf daemon answers at {url}",
                           fix="start one with `reinf serve`, or leave out --url to run the "
                               "model in this process")
    if conversation_id is not None:
        check_system_prompt(app.store.get_conversation(conversation_id).to_dict(),
                            system_prompt)
    return local_backend(app, quiet=quiet)


def check_system_prompt(conversation: dict, system_prompt: str | None) -> None:
    """``--system`` with ``--conversation``: a conversation with turns keeps its own."""
    from reinf.errors import Conflict
    from reinf.storage.store import check_system_prompt as normalize

    if system_prompt is None or not conversation["turns"] or \
            normalize(system_prompt) == conversation.get("system_prompt"):
        return
    raise Conflict(f"conversation {conversation['conversation_id']} already has turns, "
                   "generated with another system prompt, which stays",
                   fix="leave out --system, or leave out --conversation to start a new one")


def local_backend(app, *, quiet: bool = False):
    from reinf.serving.chat import ChatService
    from reinf.catalog import resolve_model_path
    from reinf.daemon.background import serve_active
    from reinf.serving.engine import Engine
    from reinf.cli.repl import LocalBackend

    _quiet_libraries(app.debug)
    store = app.store  # opened (and migrated) before the slow model load
    from reinf.serving.chat import exploring_styles
    exploring_styles(app.config)  # a bad styles file, before it too
    if not quiet:
        click.echo(f"loading {resolve_model_path(app.config)} …", err=True)
    engine = Engine.load(app.config)
    # serve the adapter the person's ratings trained (what `reinf serve` would serve)
    for warning in [*engine.warnings, *serve_active(engine, store)]:
        click.echo(f"warning: {warning}", err=True)
    return LocalBackend(ChatService(engine, store, app.config), store)


# The documented shape of a turn (README "JSON output"), as `history --json` prints it.
TURN_FIELDS = ("turn_id", "conversation_id", "index", "created_at", "user_message", "reply",
               "checkpoint_id", "model", "reply_tokens", "ttft_ms", "latency_ms",
               "interrupted", "rating", "system_prompt", "picked", "alternatives", "rewrite",
               "style")


def send_once(backend, message: str, conversation_id: int | None, as_json: bool, *,
              system_prompt: str | None = None) -> int:
    """Send one message; print the reply (streamed) or its turn as JSON. Ctrl-C at any point
    stops the reply, which is still stored and printed (exit status 130)."""
    from reinf.cli.repl import finish, held_interrupt

    extra = {} if system_prompt is None else {"system_prompt": system_prompt}
    with held_interrupt() as pressed:  # a Ctrl-C while it starts stops the reply, once it exists
        handle = backend.send_stream(message, conversation_id, **extra)
    interrupted_by_key = bool(pressed)
    try:
        if pressed:
            handle.stop()
        for delta in handle:
            if not as_json:
                click.echo(strip_escapes(delta), nl=False)
    except KeyboardInterrupt:
        handle.stop()
        interrupted_by_key = True
    turn = finish(handle)
    if as_json:
        turn.setdefault("user_message", message)
        click.echo(dump_json({k: turn.get(k) for k in TURN_FIELDS}, indent=2))
    else:
        click.echo()
    return 130 if interrupted_by_key else 0


def _quiet_libraries(debug: bool) -> None:
    """Progress bars and library chatter would land in the person's terminal."""
    if debug:
        return
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    warnings.filterwarnings("ignore", module="transformers")
    warnings.filterwarnings("ignore", module="peft")


COMMANDS = [chat]
