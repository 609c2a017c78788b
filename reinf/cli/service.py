"""``reinf service``: background service files (lands with the Background daemon issue)."""
import click

from reinf.cli.common import not_available


@click.group()
def service():
    """Install, remove or inspect the background service (systemd user unit / launchd)."""


@service.command()
def install():
    """Write the service file and print how to enable it."""
    not_available("service install", "the Background daemon issue")


@service.command()
def uninstall():
    """Remove the service file."""
    not_available("service uninstall", "the Background daemon issue")


@service.command(name="status")
def service_status():
    """Report whether the service is installed and running."""
    not_available("service status", "the Background daemon issue")


COMMANDS = [service]
