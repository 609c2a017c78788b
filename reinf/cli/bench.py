"""``reinf bench``: benchmarks (land with the Benchmarks issue)."""
import click

from reinf.cli.common import json_option, not_available


@click.group()
def bench():
    """Measure learning and speed (benchmarks, not tests)."""


@bench.command()
@json_option
def learn(as_json):
    """Run the whole loop with a simulated rater and compare against baselines."""
    not_available("bench learn", "the Benchmarks issue")


@bench.command()
@json_option
def speed(as_json):
    """Time to first token, tokens/s, swap pause and PPO round time, as ratios."""
    not_available("bench speed", "the Benchmarks issue")


COMMANDS = [bench]
