"""``reinf rewards``: the reward mapper (lands with the Reward mapper issue)."""
import click

from reinf.cli.common import json_option, not_available


@click.group()
def rewards():
    """Inspect how ratings become rewards."""


@rewards.command()
@click.option("--limit", default=10, type=click.IntRange(1, 10_000), help="Recent ratings shown.")
@json_option
def preview(limit, as_json):
    """Apply the current mapper and critics to recent ratings."""
    not_available("rewards preview", "the Reward mapper issue")


COMMANDS = [rewards]
