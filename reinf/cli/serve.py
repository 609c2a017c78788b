"""``reinf serve``: the web UI, the HTTP API and background training, in one process.

Start-up order, so that a mistake is reported before the slow model load:
config (flags through ``app.override``, so a non-loopback host without auth_token stops
here) -> the data directory's server lock -> log file -> store (migrations) -> model ->
daemon (scheduler, child trainer) -> web app -> bind the port -> serve until SIGTERM or
Ctrl+C (reinf.daemon.shutdown stops gracefully) -> exit at once, status 0, once everything is
closed. A second server on the same data directory stops at the lock, before the model
loads.
"""
from __future__ import annotations

import logging
import os
import sys

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
    from reinf.daemon.background import Daemon
    from reinf.daemon.lock import acquire_lock
    from reinf.logs import setup_logging
    from reinf.daemon.shutdown import install_signal_handlers, run_server
    from webui.server import check_port, create_server, format_url

    # One server per data directory: a clear Conflict if taken. Before the log file: only
    # the lock holder may write (and rotate) it.
    lock = acquire_lock(config)
    log_file = setup_logging(config, debug=app.debug)
    daemon = None
    try:
        check_port(config.server.host, config.server.port)  # before the slow model load
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # no bars in the log
        # torch and transformers: after the quick checks
        from reinf.serving.chat import ChatService, exploring_styles
        exploring_styles(config)  # a bad styles file stops start-up before the model load
        from reinf.catalog import resolve_model_path
        from reinf.config import hidden_model_defaults_note
        from reinf.serving.engine import Engine
        from webui import create_app

        store = app.store
        click.echo(f"loading {resolve_model_path(config)} …", err=True)
        engine = Engine.load(config)
        for warning in engine.warnings:
            click.echo(f"warning: {warning}", err=True)
        if (hidden := hidden_model_defaults_note(config, at_default_only=True)) is not None:
            click.echo(f"warning: {hidden}", err=True)
        chat = ChatService(engine, store, config)
        # --no-train keeps the daemon (rollback, "Train now") but schedules nothing.
        daemon = Daemon(config, store, engine, lock=lock, schedule=not no_train).start()
        web = create_app(config, store=store, chat=chat, engine=engine, daemon=daemon)
        server = create_server(web, host=config.server.host, port=config.server.port,
                               threads=config.server.threads,
                               max_request_bytes=config.server.max_request_bytes,
                               header_timeout=config.server.request_header_timeout_seconds,
                               connection_limit=config.server.connection_limit)
        url = format_url(config.server.host, server.effective_port)
        lock.update(url=url.rstrip("/"), host=config.server.host, port=server.effective_port)
        click.echo(f"Reinf is serving {url}  (model {engine.model_name}; "
                   f"{'training on schedule' if not no_train else 'scheduled training off'})")
        if config.server.auth_token:
            click.echo(f"sign in at {url}login with auth_token from the config", err=True)
        click.echo(f"log: {log_file} — Ctrl+C stops", err=True)
        stop = install_signal_handlers(daemon)
        streams = web.extensions["reinf"].streams
        run_server(server, stop, daemon=daemon, stop_replies=streams.stop_all)
    finally:
        if daemon is not None:
            daemon.shutdown()
        if lock.held:
            lock.release()
    exit_now(app)


def exit_now(app, code: int = 0) -> None:
    """Exit now that everything is shut down: the replies are answered, the trainer is
    stopped, the lock is released; the store and the log are closed here. The
    interpreter's own teardown of torch and transformers would add about a second to
    every stop (and to every restart of the service)."""
    app.close()
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


COMMANDS = [serve]
