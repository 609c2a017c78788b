"""The ``reinf`` command line.

This module holds the root group and its global options. The one error boundary
is the root group's class, ``ReinfGroup`` in reinf/cli/common.py: a ReinfError
(or ConfigError) raised anywhere below becomes a ``click.ClickException`` with a
message for the person; tracebacks appear only with ``--debug``. Commands live in
the sibling modules, one per area, and are registered at the bottom of this file.
"""
from __future__ import annotations

import logging
import sys

import click

from reinf.cli.common import AppContext, ReinfGroup
from reinf.logs import quiet_libraries

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(cls=ReinfGroup, context_settings=CONTEXT_SETTINGS)
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              envvar="REINF_CONFIG", help="Config file (default: $REINF_HOME/config.yaml).")
@click.option("--home", type=click.Path(file_okay=False), envvar="REINF_HOME",
              help="Data directory holding all state (default: ~/.reinf; env REINF_HOME).")
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.version_option(package_name="reinf")
@click.pass_context
def main(ctx: click.Context, config_path: str | None, home: str | None, debug: bool) -> None:
    """Reinf: a local assistant that learns from your 1-5 ratings.

    Chat with a local model, rate its replies, and a background trainer turns the
    ratings into a LoRA adapter (PPO) that is swapped into the running model.
    Nothing leaves this machine.

    \b
    Start here:
      reinf init          create the data directory, database and model
      reinf serve         web UI, API and background training on 127.0.0.1:8765
      reinf chat          chat and rate in the terminal
    """
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    quiet_libraries(debug=debug)
    from reinf.config import unknown_env

    for warning in unknown_env():
        click.echo(f"warning: {warning}", err=True)
    from_flag = ctx.get_parameter_source("home") == click.core.ParameterSource.COMMANDLINE
    ctx.obj = AppContext(config_path=config_path, home=home, debug=debug, home_is_flag=from_flag)
    ctx.call_on_close(ctx.obj.close)


def _register() -> None:
    from reinf.cli import (bench, chat, compare, data, models, rewards, serve, service, system,
                           train)

    for module in (data, system, models, chat, compare, train, serve, service, rewards, bench):
        for command in module.COMMANDS:
            main.add_command(command)


_register()
