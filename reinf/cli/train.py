"""``reinf train``: one PPO training round in the foreground, with a progress bar.

It behaves like the daemon's child process (``python -m reinf.trainer``), exit codes
included: 0 succeeded, 3 rejected by the promotion gate, 4 nothing new to train on,
5 reward hook broken, 6 model missing or unloadable, 1 any other failure.
"""
import sys

import click

from reinf.cli.common import emit, json_option


@click.command()
@click.option("--once", is_flag=True, help="Run exactly one round (the default; for scripts).")
@click.option("--force", is_flag=True, help="Train even when no rating arrived since the last "
                                            "round (revisits the stored ratings).")
@json_option
@click.pass_obj
def train(app, once, force, as_json):
    """Run one PPO training round now, with a progress bar.

    \b
    --json prints {"run_id", "status", "checkpoint_id", "metrics", "message", "error"};
    metrics use the CleanRL names (reward_mean, kl, approx_kl, clipfrac, policy_loss,
    value_loss, explained_variance, entropy, samples, seconds). KL figures are per reply
    token, in nats.

    \b
    Exit codes: 0 succeeded, 3 rejected by the promotion gate, 4 nothing new to
    train on, 5 reward hook broken, 6 model missing, 1 anything else.
    """
    from reinf.errors import Conflict
    from reinf.lock import acquire_train_lock, read_info, train_lock_path
    from reinf.trainer import ProgressBar, apply_process_settings, run_once

    config, store = app.config, app.store
    lock = acquire_train_lock(config, trigger="manual")  # one round at a time, daemon included
    if lock is None:
        pid = read_info(train_lock_path(config)).get("pid", "?")
        raise Conflict(f"another training round is running (pid {pid})",
                       fix="wait for it to finish; `reinf status` shows the last run")
    apply_process_settings(config)
    bar = ProgressBar(enabled=not as_json)
    try:
        code, payload, error = run_once(config, store, trigger="manual", force=force,
                                        progress=bar)
    finally:
        bar.close()
        lock.release()
    if error is not None and app.debug:
        raise error
    if as_json:
        emit(payload, True, None)
    elif error is not None:
        click.echo(f"Error: {error}", err=True)
    else:
        click.echo(payload["message"])
    if code:
        sys.exit(code)


COMMANDS = [train]
