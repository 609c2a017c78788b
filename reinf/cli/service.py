"""``reinf service``: the background service files (systemd user unit / launchd agent)."""
from __future__ import annotations

import click

from reinf.cli.common import emit, json_option


@click.group()
def service():
    """Install, remove or inspect the background service (systemd user unit / launchd)."""


@service.command()
@json_option
@click.pass_obj
def install(app, as_json):
    """Write the service file for this installation and print how to enable it."""
    from reinf.daemon.service import install_service

    data = install_service(app.config)

    def text(d):
        verb = "updated" if d["replaced"] else ("wrote" if d["changed"] else "unchanged:")
        click.echo(f"{verb} {d['path']}")
        click.echo(f"  runs:     {' '.join(d['command'])}")
        click.echo(f"  data dir: {d['data_dir']}")
        click.echo("enable and start it with:")
        click.echo("  " + " && ".join(d["enable"]))
        if d["note"]:
            click.echo(d["note"])
    emit(data, as_json, text)


@service.command()
@json_option
@click.pass_obj
def uninstall(app, as_json):
    """Remove the service file (stop the service first; the command is printed)."""
    from reinf.daemon.service import uninstall_service

    data = uninstall_service(app.config)

    def text(d):
        if not d["removed"]:
            click.echo(f"no service file at {d['path']}; nothing to remove")
            return
        click.echo(f"removed {d['path']}")
        click.echo("if the service was running, stop it with:")
        click.echo("  " + " && ".join(d["disable_first"] + d["after"]))
    emit(data, as_json, text)


@service.command(name="status")
@json_option
@click.pass_obj
def service_status(app, as_json):
    """Report whether the service is installed, current, and running."""
    from reinf.daemon.service import service_status as collect

    data = collect(app.config)

    def text(d):
        if not d["installed"]:
            click.echo(f"not installed ({d['path']}); `reinf service install` writes it")
        else:
            click.echo(f"installed:  {d['path']}"
                       + ("" if d["up_to_date"] else "  (differs from this installation; "
                                                      "`reinf service install` updates it)"))
            click.echo(f"{d['manager']}:    active {d['active'] or 'unknown'}, "
                       f"enabled {d['enabled'] or 'unknown'}")
            if d.get("manager_error"):  # why a state is unknown
                click.echo(f"            {d['manager_error']}")
        daemon = d["daemon"]
        click.echo("server:     " + (f"running, pid {daemon['pid']}, {daemon['url'] or ''}"
                                     if daemon["running"] else "not running"))
    emit(data, as_json, text)


COMMANDS = [service]
