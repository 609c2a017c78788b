"""``reinf rewards``: see how ratings become rewards with the current mapper and critics."""
from __future__ import annotations

import json

import click

from reinf.cli.common import emit, json_option


@click.group()
def rewards():
    """Inspect how ratings become rewards."""


@rewards.command()
@click.option("--limit", default=10, show_default=True, type=click.IntRange(1, 10_000),
              help="Most recently rated turns shown.")
@json_option
@click.pass_obj
def preview(app, limit, as_json):
    """Apply the current mapper and critics to recent ratings.

    The hook file is read as it is now, so an edit shows at once. A broken hook prints its
    error (file, line, message) and exits with status 1.
    """
    from reinf.errors import HookError
    from reinf.rewards.mapper import preview as build_preview, rewards_settings

    cfg = app.config
    settings = rewards_settings(cfg)
    weights = {k: v for k, v in settings["critics"].items() if v > 0}
    head = {"mapper": settings["reward_mapper"], "path": _hook_path(cfg),
            "critics": weights, "critic_combine": settings["critic_combine"],
            "human_weight": settings["human_weight"]}
    try:
        rows = build_preview(cfg, app.reading_store(), limit)
    except HookError as exc:
        if as_json:  # the JSON reader gets the error too, then the usual one line and exit 1
            click.echo(json.dumps({**head, "ok": False, "error": str(exc),
                                   "line": getattr(exc, "line", None), "rows": []}, indent=2))
        raise
    emit({**head, "ok": True, "error": None, "rows": rows}, as_json, _print_preview)


def _hook_path(cfg) -> str | None:
    from reinf.errors import HookError
    from reinf.rewards.hooks import parse_spec

    try:
        spec = parse_spec(cfg.rewards.reward_mapper, cfg.data_dir)
    except HookError:
        return None
    return str(spec.path) if spec else None


def _print_preview(d) -> None:
    mapper = d["mapper"] + (f" ({d['path']})" if d["path"] else " (built in)")
    critics = ", ".join(f"{k} {v:g}" for k, v in d["critics"].items()) or "off"
    click.echo(f"mapper: {mapper}")
    click.echo(f"critics: {critics}" + (f" — combined by {d['critic_combine']}"
                                         if d["critics"] else ""))
    rows = d["rows"]
    if not rows:
        click.echo("no rated turns yet — rate a reply first (`reinf rate last 4`)")
        return
    names = list(d["critics"])
    header = (f"{'turn':>6} {'score':>5} {'age':>5} " + "".join(f"{n[:10]:>11}" for n in names)
              + f" {'human':>7} {'reward':>7} {'weight':>6} {'kept':>4}  tags")
    click.echo(header)
    for r in rows:
        score = f"{r['score']}{'!' if r['critical'] else ''}"
        critic_cells = "".join(f"{r['critics'][n]:>+11.2f}" for n in names)
        click.echo(f"{r['turn_id']:>6} {score:>5} {r['age']:>5} {critic_cells}"
                   f" {r['human_reward']:>+7.2f} {r['reward']:>+7.2f} {r['weight']:>6.2f}"
                   f" {'yes' if r['kept'] else 'no':>4}  {', '.join(r['tags'])}")
    click.echo("(! = critical; weight = time decay; kept = no: dropped by consensus)")


COMMANDS = [rewards]
