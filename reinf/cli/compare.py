"""``reinf compare``: one prompt, replies from the base model, the active checkpoint (and
``--checkpoint``), shown blind as A, B (, C); the person says which is better, the pairs are
stored (reinf.serving.compare), then who wrote which is revealed."""
from __future__ import annotations

import click

from reinf.cli.common import dump_json, json_option, strip_escapes
from reinf.errors import NotAvailable

PICK_PROMPT = "which is better? {slots}, tie, bad (Enter: skip, nothing is stored): "
ANSWERS = {"tie": "tie", "bad": "both_bad", "both_bad": "both_bad", "both bad": "both_bad"}


class LocalCompare:
    """The comparison API of a server (``HttpBackend.compare`` / ``pick_compare``), run on
    the model in this process."""

    def __init__(self, engine, store, config):
        from reinf.serving.compare import Comparisons

        self.engine, self.store, self.config = engine, store, config
        self.comparisons = Comparisons()

    def compare(self, prompt: str, *, checkpoint: str | None = None, blind: bool = True) -> dict:
        from reinf.serving.compare import build_comparison

        comparison = build_comparison(self.engine, self.store, self.config, prompt=prompt,
                                      checkpoint=checkpoint, blind=blind)
        return self.comparisons.add(comparison).to_dict()

    def pick_compare(self, compare_id: str, winner: str) -> dict:
        return self.comparisons.pick(self.store, compare_id, winner).to_dict(reveal=True)


@click.command()
@click.argument("prompt")
@click.option("--checkpoint", metavar="ID",
              help="Also compare this checkpoint (its id or a unique prefix).")
@click.option("--blind/--no-blind", default=True, show_default=True,
              help="Hide which checkpoint wrote which reply until you pick.")
@click.option("--pick", "winner", metavar="A|B|C|tie|bad",
              help="Your answer, without asking (scripts).")
@click.option("--url", help="Use the daemon at this URL instead of the default.")
@json_option
@click.pass_obj
def compare(app, prompt, checkpoint, blind, winner, url, as_json):
    """Compare replies to PROMPT from the base model and the active checkpoint.

    The replies are shown in a random order as A and B (C with --checkpoint); you answer
    which is better (a, b, c), tie, or bad (both bad). The answer is stored as a pairwise
    preference, then the checkpoint behind each reply is shown. With a Reinf daemon
    running it does the work; otherwise the model runs in this process.
    """
    if winner is not None:  # a typo fails before the model is loaded or anything generated
        parse_answer(winner, ["A", "B", "C"] if checkpoint else ["A", "B"])
    backend = build_compare_backend(app, url, quiet=as_json)
    shown = backend.compare(prompt, checkpoint=checkpoint, blind=blind)
    slots = [r["slot"] for r in shown["replies"]]
    if not as_json:
        for reply in shown["replies"]:
            click.echo(f"{describe(reply)}\n{strip_escapes(reply['text'])}\n")
    answer = parse_answer(winner, slots) if winner is not None else ask(slots, err=as_json)
    if answer is None:
        if as_json:
            click.echo(dump_json({**shown, "picked": None}, indent=2))
        else:
            click.echo("skipped: nothing stored")
        return
    picked = backend.pick_compare(shown["compare_id"], answer)
    if as_json:
        click.echo(dump_json(picked, indent=2))
        return
    for reply in picked["replies"]:
        click.echo(f"{reply['slot']}: {reply['checkpoint_id']} ({reply['role']})")
    n = len(picked["pairs"])
    click.echo(f"stored {n} pair{'s' if n != 1 else ''} ({answer_text(answer)})")


def describe(reply: dict) -> str:
    head = f"--- {reply['slot']}"
    if "checkpoint_id" in reply:  # not blind
        head += f": {reply['checkpoint_id']} ({reply['role']})"
    if reply.get("predicted_score") is not None:
        head += f"  [predicted {reply['predicted_score']:.1f}]"
    return head + " ---"


def parse_answer(text: str, slots: list[str]) -> str | None:
    """``a`` / ``B`` -> the slot, ``tie``, ``bad`` -> both_bad; "" -> None (skip)."""
    value = " ".join(text.strip().lower().split())
    if not value:
        return None
    if value.upper() in slots:
        return value.upper()
    if value in ANSWERS:
        return ANSWERS[value]
    from reinf.errors import BadInput

    raise BadInput(f"{text.strip()[:20]!r} is not an answer",
                   fix=f"answer {', '.join(s.lower() for s in slots)}, tie or bad")


def ask(slots: list[str], *, err: bool = False) -> str | None:
    """The person's answer (None: skipped, Enter or Ctrl-D); ``err``: ask on stderr, so that
    stdout holds only the JSON."""
    from reinf.errors import BadInput

    question = PICK_PROMPT.format(slots="/".join(s.lower() for s in slots))
    while True:
        try:
            line = click.prompt(question, default="", show_default=False, prompt_suffix="",
                                err=err)
        except (click.Abort, EOFError):
            click.echo(err=err)
            return None
        try:
            return parse_answer(line, slots)
        except BadInput as exc:
            click.echo(f"{exc.message} — {exc.fix}", err=err)


def answer_text(answer: str) -> str:
    return {"tie": "a tie", "both_bad": "both bad"}.get(answer, f"{answer} is better")


def build_compare_backend(app, url: str | None, *, quiet: bool = False):
    """The daemon's API when one answers (as `reinf chat` finds it), else the model here."""
    from reinf.client import HttpBackend
    from reinf.daemon.remote import find_server

    target = find_server(app.config, url)
    if target:
        return HttpBackend(target, app.config, generation=dict(app.overrides))
    if url:
        raise NotAvailable(f"no Reinf daemon answers at {url}",
                           fix="start one with `reinf serve`, or leave out --url to run the "
                               "model in this process")
    from reinf.cli.chat import local_backend

    local = local_backend(app, quiet=quiet)
    return LocalCompare(local.service.engine, app.store, app.config)


COMMANDS = [compare]
