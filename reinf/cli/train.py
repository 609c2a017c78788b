"""``reinf train``: one training round in the foreground (lands with the PPO trainer issue)."""
import click

from reinf.cli.common import json_option, not_available


@click.command()
@click.option("--once", is_flag=True, help="Run exactly one round (the default).")
@json_option
@click.pass_obj
def train(app, once, as_json):
    """Run one PPO training round now, with a progress bar."""
    not_available("train", "the LoRA PPO trainer issue")


COMMANDS = [train]
