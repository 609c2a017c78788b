"""``reinf serve``: the web UI, the HTTP API and background training, in one process.

Start-up order, so that a mistake is reported before the slow model load:
config (flags through ``app.override``, so a non-loopback host without auth_token stops
here) -> log file -> the data directory's server lock -> store (migrations) -> model ->
daemon (scheduler, child trainer) -> web app -> bind the port -> serve until SIGTERM or
Ctrl+C (reinf.shutdown stops gracefully).
"""
from __future__ import annotations

import click


@click.command()
@click.option("--host", help="Address to bind (default 127.0.0.1; others need auth_token).")
@click.option("--port", type=int, help="Port (default 8765).")
@click.option("--no-train", is_flag=True, help="Serve without scheduled training.")
@click.pass_obj
def serve(app, host, port, no_train):
    """Serve the web UI, the HTTP API and background training."""
    app.override(host=host, port=port)
    config = app.config  # validation: a ConfigError stops start-up with its fix
    from reinf.logs import setup_logging
    from webui.server import check_port, create_server, format_url

    log_file = setup_logging(config, debug=app.debug)
    lock = _take_lock(config)
    daemon = None
    try:
        check_port(config.server.host, config.server.port)  # before the slow model load
        from reinf.chat import ChatService  # torch and transformers: after the quick checks
        from reinf.config import resolve_model_path
        from reinf.engine import Engine
        from webui import create_app

        store = app.store
        click.echo(f"loading {resolve_model_path(config)} …", err=True)
        engine = Engine.load(config)
        for warning in engine.warnings:
            click.echo(f"warning: {warning}", err=True)
        chat = ChatService(engine, store, config)

        # --- the daemon: scheduler, child trainer, hot-swap (reinf.daemon) -------------
        # --no-train keeps the daemon (rollback, "Train now") but schedules nothing.
        daemon = _start_daemon(config, store, engine, lock, schedule=not no_train)
        # ---------------------------------------------------------------------------------

        web = create_app(config, store=store, chat=chat, engine=engine, daemon=daemon)
        server = create_server(web, host=config.server.host, port=config.server.port,
                               threads=config.server.threads,
                               max_request_bytes=config.server.max_request_bytes)
        url = format_url(config.server.host, server.effective_port)
        if lock is not None:
            lock.update(url=url.rstrip("/"), host=config.server.host,
                        port=server.effective_port)
        click.echo(f"Reinf is serving {url}  (model {engine.model_name}; "
                   f"{'training on schedule' if not no_train else 'scheduled training off'})")
        if config.server.auth_token:
            click.echo(f"sign in at {url}login with auth_token from the config", err=True)
        click.echo(f"log: {log_file} — Ctrl+C stops", err=True)
        _run(server, daemon, web.extensions["reinf"].streams)
    finally:
        if daemon is not None:
            daemon.shutdown()
        if lock is not None and lock.held:
            lock.release()


def _take_lock(config):
    """One server per data directory; None when this build has no lock module."""
    try:
        from reinf.lock import acquire_lock
    except ModuleNotFoundError as exc:
        if exc.name != "reinf.lock":
            raise
        return None
    return acquire_lock(config)


def _start_daemon(config, store, engine, lock, *, schedule: bool):
    try:
        from reinf.daemon import Daemon
    except ModuleNotFoundError as exc:
        if exc.name != "reinf.daemon":
            raise
        return None
    return Daemon(config, store, engine, lock=lock, schedule=schedule).start()


def _run(server, daemon, streams) -> None:
    """Serve until a signal; stop gracefully (replies in flight finish or are cut)."""
    try:
        from reinf.shutdown import install_signal_handlers, run_server
    except ModuleNotFoundError as exc:
        if exc.name != "reinf.shutdown":
            raise
        try:
            server.run()
        except KeyboardInterrupt:
            pass
        return
    stop = install_signal_handlers(daemon)
    run_server(server, stop, daemon=daemon, stop_replies=streams.stop_all)


COMMANDS = [serve]
