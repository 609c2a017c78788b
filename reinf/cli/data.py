"""Commands on stored turns and ratings: rate, undo, history, forget, export."""
from __future__ import annotations

import click

from reinf.cli.common import dump_json, emit, json_option, parse_turn


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
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 100_000),
              help="Most recent turns to show.")
@click.option("--conversation", "conversation_id", type=int, help="Only this conversation.")
@click.option("--rated/--unrated", default=None, help="Only rated (or unrated) turns.")
@json_option
@click.pass_obj
def history(app, limit, conversation_id, rated, as_json):
    """Past turns, newest first, with their ratings."""
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
             "alternatives_kept": ("alternative kept", "alternatives kept")}


def count(n: int, one: str, many: str) -> str:
    """'1 turn', '0 turns', '2 turns'."""
    return f"{n} {one if n == 1 else many}"


@click.command()
@click.option("--format", "fmt", type=click.Choice(["raw", "sft", "kto"]), default="raw",
              show_default=True, help="raw: everything; sft: chats rated 4-5; kto: labelled.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), default="-",
              help="File to write, readable by you only (default: standard output).")
@click.pass_obj
def export(app, fmt, output):
    """Rated turns as JSONL, for other training tools."""
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


COMMANDS = [rate, undo, history, forget, export]
