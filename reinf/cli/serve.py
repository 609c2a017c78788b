"""``reinf serve``: web UI, API and scheduler (lands with the Web UI issue)."""
import click

from reinf.cli.common import not_available


@click.command()
@click.option("--host", help="Address to bind (default 127.0.0.1).")
@click.option("--port", type=int, help="Port (default 8765).")
@click.option("--no-train", is_flag=True, help="Serve without scheduled training.")
@click.pass_obj
def serve(app, host, port, no_train):
    """Serve the web UI, the HTTP API and background training."""
    not_available("serve", "the Web UI and HTTP API issue")


COMMANDS = [serve]
