"""Commands on stored turns and ratings: rate, undo, rewrite, history, forget, export."""
from __future__ import annotations

import sys

import click

from reinf.cli.common import dump_json, emit, json_option, parse_turn
from reinf.errors import BadInput


@click.command()
@click.argument("turn")
@click.argument("score", type=int)
@click.option("--tags", help="Comma-separated tags, e.g. 'too long,wrong'.")
@click.option("--comment", help="Free-text comment.")
@click.option("--critical", is_flag=True, help="This rating matters more than most.")
@json_option
@click.pass_obj
def rate(app, turn, score, tags, comment, critical, as_json):
    """Rate TURN with SCORE 1-5. Re-rating replaces the old rating.

    TURN is 'last', a turn number, or the completion id an OpenAI client got from
    /v1/chat/completions (chatcmpl-…, streamed ones too).
    """
    turn_id = parse_turn(app.store, turn)
    rating = app.store.rate(turn_id, score, tags=tags, comment=comment or "", critical=critical)
    emit(rating.to_dict(), as_json, lambda r: click.echo(
        f"rated turn {r['turn_id']}: {r['score']}"
        + (f" [{', '.join(r['tags'])}]" if r["tags"] else "")
        + (" (critical)" if r["critical"] else "")))


@click.command()
@click.option("--turn", "turn",
              help="Undo the rating of this turn (as `rate` takes it), not the newest.")
@json_option
@click.pass_obj
def undo(app, turn, as_json):
    """Remove the most recent rating (or the rating of --turn)."""
    turn_id = parse_turn(app.store, turn) if turn else None
    removed = app.store.undo_rating(turn_id)
    data = {"removed": removed.to_dict() if removed else None}
    emit(data, as_json, lambda d: click.echo(
        f"removed rating {d['removed']['score']} from turn {d['removed']['turn_id']}"
        if d["removed"] else "no rating to undo"))


@click.command()
@click.argument("turn")
@click.argument("text", required=False)
@click.option("--file", "path", metavar="PATH",
              help="Read the text from PATH ('-': standard input) instead of TEXT.")
@click.option("--delete", is_flag=True, help="Remove the turn's rewrite instead.")
@json_option
@click.pass_obj
def rewrite(app, turn, text, path, delete, as_json):
    """Write the reply you wanted for TURN; writing again replaces it.

    The next training round learns from it: your text is preferred over the reply the
    model gave, and shown to it as an example. TURN is as for `rate` ('last', a turn
    number, chatcmpl-…). Give the text as TEXT or with --file (e.g. `--file -` to pipe
    it in); --delete removes the rewrite.
    """
    if delete:
        if text is not None or path is not None:
            raise click.UsageError("--delete takes no text: give TURN alone")
    elif (text is None) == (path is None):
        raise click.UsageError("give the reply you wanted as TEXT or with --file PATH "
                               "(exactly one of them)")
    if path is not None:
        text = read_text_file(path)
    turn_id = parse_turn(app.store, turn)
    if delete:
        removed = app.store.delete_rewrite(turn_id)
        data = {"removed": removed.to_dict() if removed else None}
        emit(data, as_json, lambda d: click.echo(
            f"turn {turn_id}: rewrite removed" if d["removed"]
            else f"turn {turn_id} has no rewrite to remove"))
        return
    replaced = app.store.get_rewrite(turn_id) is not None
    record = app.store.rewrite(turn_id, text)
    emit(record.to_dict(), as_json, lambda r: click.echo(
        f"turn {r['turn_id']}: rewrite {'replaced' if replaced else 'saved'} "
        f"({count(len(r['text']), 'character', 'characters')}); "
        "the next training round learns from it"))


def read_text_file(path: str) -> str:
    """The text of ``path`` (``-``: standard input) as UTF-8, without the line break(s) a
    file ends with; a file that cannot be read is BadInput, with a fix."""
    try:
        if path == "-":
            stdin = sys.stdin
            raw = stdin.buffer.read() if hasattr(stdin, "buffer") else stdin.read().encode()
        else:
            with open(path, "rb") as f:
                raw = f.read()
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror or exc}",
                       fix="check the path and its permissions, or give the text as TEXT"
                       ) from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        where = "standard input" if path == "-" else path
        raise BadInput(f"{where} is not UTF-8 text (byte {exc.start})",
                       fix="save it as UTF-8 (e.g. `iconv -t UTF-8`)") from None
    return text.rstrip("\r\n")


@click.command()
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 100_000),
              help="Most recent turns to show.")
@click.option("--conversation", "conversation_id", type=int, help="Only this conversation.")
@click.option("--rated/--unrated", default=None, help="Only rated (or unrated) turns.")
@json_option
@click.pass_obj
def history(app, limit, conversation_id, rated, as_json):
    """Past turns, newest first, with their ratings (✎: you wrote a rewrite)."""
    if conversation_id is not None:
        app.reading_store().get_conversation(conversation_id)  # a clear error for an unknown id
    turns = app.reading_store().history(limit=limit, conversation_id=conversation_id, rated=rated)
    emit([t.to_dict() for t in turns], as_json, _print_history)


def _print_history(turns):
    if not turns:
        click.echo("no turns yet — start with `reinf chat`")
    for t in turns:
        r = t["rating"]
        mark = f"★{r['score']}" + (f" [{', '.join(r['tags'])}]" if r["tags"] else "") if r \
            else "unrated"
        if t.get("rewrite"):
            mark += " ✎"  # the person wrote the reply they wanted (`reinf rewrite`)
        click.echo(f"#{t['turn_id']}  conv {t['conversation_id']}  {t['created_at']}  {mark}  "
                   f"({t['checkpoint_id']})")
        click.echo(f"  you: {_clip(t['user_message'])}")
        click.echo(f"  bot: {_clip(t['reply'])}")


def _clip(text: str, n: int = 100) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= n else flat[: n - 1] + "…"


@click.command()
@click.option("--turn", "turn", help="Forget one turn (as for `rate`: id, 'last', chatcmpl-…).")
@click.option("--conversation", "conversation_id", type=int, help="Forget a whole conversation.")
@click.option("--all", "everything", is_flag=True, help="Forget every conversation and rating.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation with --all.")
@json_option
@click.pass_obj
def forget(app, turn, conversation_id, everything, yes, as_json):
    """Delete turns and their ratings for good; they are never trained on again.

    Adapters already trained keep what they learned; roll back to an older
    checkpoint (`reinf rollback`) to drop that too.
    """
    chosen = [x for x in (turn, conversation_id, everything or None) if x is not None]
    if len(chosen) != 1:
        raise click.UsageError("give exactly one of --turn, --conversation or --all")
    if turn:
        result = app.store.forget_turn(parse_turn(app.store, turn))
    elif conversation_id is not None:
        result = app.store.forget_conversation(conversation_id)
    else:
        if not yes and not as_json:
            click.confirm("Forget every conversation, turn and rating?", abort=True)
        result = app.store.forget_all()
    emit({"forgotten": result}, as_json, lambda d: click.echo(
        "forgot " + ", ".join(count(n, *FORGOTTEN.get(k, (k, k))) for k, n in
                              d["forgotten"].items() if k != "warning")))
    if result.get("warning") and not as_json:
        click.echo(f"Warning: {result['warning']}", err=True)


# forget's counts, in words: (one, many)
FORGOTTEN = {"conversations": ("conversation", "conversations"), "turns": ("turn", "turns"),
             "ratings": ("rating", "ratings"),
             "later_turns_untrainable": ("later turn untrainable", "later turns untrainable"),
             "pairs": ("pair", "pairs"),
             "alternatives_kept": ("alternative kept", "alternatives kept"),
             "rewrites": ("rewrite", "rewrites")}


def count(n: int, one: str, many: str) -> str:
    """'1 turn', '0 turns', '2 turns'."""
    return f"{n} {one if n == 1 else many}"


@click.command()
@click.option("--format", "fmt", type=click.Choice(["raw", "sft", "kto"]), default="raw",
              show_default=True, help="raw: everything; sft: chats rated 4-5, and your rewrites; "
                                      "kto: labelled.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), default="-",
              help="File to write, readable by you only (default: standard output).")
@click.pass_obj
def export(app, fmt, output):
    """Rated turns (and your rewrites) as JSONL, for other training tools."""
    from reinf.storage.export import export_rows
    from reinf.storage.permissions import open_private

    rows = export_rows(app.reading_store(), fmt)  # the store opens (and may fail) before the file
    if output == "-":
        for row in rows:
            click.echo(dump_json(row))
        return
    n = 0
    with open_private(output) as out:  # every conversation is in it: 600, as the database
        for row in rows:
            out.write(dump_json(row) + "\n")
            n += 1
    click.echo(f"wrote {count(n, 'row', 'rows')} ({fmt}) to {output}", err=True)


COMMANDS = [rate, undo, rewrite, history, forget, export]
