"""``reinf chat``: the terminal REPL (lands with the Inference engine issue)."""
import click

from reinf.cli.common import json_option, not_available


@click.command()
@click.option("--once", "once", metavar="TEXT", help="Send one message, print the reply, exit.")
@click.option("--conversation", "conversation_id", type=int, help="Continue this conversation.")
@click.option("--url", help="Talk to the daemon at this URL instead of the default.")
@json_option
@click.pass_obj
def chat(app, once, conversation_id, url, as_json):
    """Chat in the terminal, rating each reply 1-5 (Enter skips)."""
    not_available("chat", "the Inference engine issue")


COMMANDS = [chat]
