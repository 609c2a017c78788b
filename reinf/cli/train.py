"""``reinf train``: one PPO training round now.

With no server running it trains in the foreground, with a progress bar. While a
``reinf serve`` uses the data directory, it asks that server to train instead
(reinf.daemon.remote.request_train) and waits for the round, so there is only ever one trainer
and the new checkpoint is swapped into the running model.

Either way it reports the same, exit codes included: 0 succeeded, 3 rejected by the
promotion gate, 4 nothing new to train on, 5 reward hook broken, 6 model missing or
unloadable, 1 any other failure (a round already running included).
"""
import sys

import click

from reinf.cli.common import emit, json_option
from reinf.training.outcome import RoundOutcome

# The daemon's reconcile job and a starting server hold the train lock for a moment.
LOCK_RETRY_SECONDS = 1.0


@click.command()
@click.option("--once", is_flag=True, help="Run exactly one round (the default; for scripts).")
@click.option("--force", is_flag=True, help="Train even when no rating arrived since the last "
                                            "round (revisits the stored ratings).")
@json_option
@click.pass_obj
def train(app, once, force, as_json):
    """Run one PPO training round now, with a progress bar.

    While `reinf serve` runs on this data directory, the round runs in that server
    (and is swapped into its model); this command waits for it.

    \b
    --json prints {"run_id", "status", "checkpoint_id", "metrics", "message", "error"};
    metrics use the CleanRL names (reward_mean, kl, approx_kl, clipfrac, policy_loss,
    value_loss, explained_variance, entropy, samples, seconds). KL figures are per reply
    token, in nats.

    \b
    Exit codes: 0 succeeded, 3 rejected by the promotion gate, 4 nothing new to
    train on, 5 reward hook broken, 6 model missing, 1 anything else.
    """
    from reinf.daemon.remote import locate_server

    config = app.config
    daemon = locate_server(config)
    if daemon["running"]:
        code, payload, error = train_in_daemon(config, daemon, force=force, quiet=as_json)
    else:
        code, payload, error = train_here(app, force=force, progress=not as_json)
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


def train_here(app, *, force: bool, progress: bool):
    """One round in this process -> (exit code, payload, error)."""
    from reinf.errors import Conflict
    from reinf.daemon.lock import acquire_train_lock, train_lock_holder
    from reinf.training.child import ProgressBar, apply_process_settings, run_once

    config, store = app.config, app.store
    # one round at a time, the daemon's included
    lock = acquire_train_lock(config, trigger="manual", wait=LOCK_RETRY_SECONDS)
    if lock is None:
        raise Conflict(f"another training round is running (pid {train_lock_holder(config)})",
                       fix="wait for it to finish; `reinf status` shows the last run")
    bar = ProgressBar(enabled=progress)
    try:
        if not force and store.ratings_waiting() == 0:
            # With nothing new the round would stop before it reaches the hook; a broken
            # hook is the thing to fix, so it is what this says (exit 5), as with new ratings.
            broken = hook_problem(config, store)
            if broken is not None:
                hook = RoundOutcome.HOOK_BROKEN
                return hook.exit_code, hook.payload(str(broken)), broken
        apply_process_settings(config)
        return run_once(config, store, trigger="manual", force=force, progress=bar)
    finally:
        bar.close()
        lock.release()


def train_in_daemon(config, daemon: dict, *, force: bool, quiet: bool):
    """Ask the running server for a round and wait for it -> (exit code, payload, error)."""
    from reinf.errors import Conflict, ReinfError
    from reinf.daemon.remote import request_train
    from reinf.training.outcome import NothingToTrain

    if not quiet:
        click.echo(f"reinf serve (pid {daemon['pid']}) uses this data directory: the round "
                   "runs there…", err=True)
    answer = request_train(config, force=force, wait=True)
    if answer is None:  # the server stopped between the probe and the request
        raise Conflict("reinf serve stopped before it could train",
                       fix="run `reinf train` again")
    if not answer.get("started"):
        reason = answer.get("reason") or answer.get("error") or "training did not start"
        if answer.get("ratings_waiting") == 0 and not force:
            broken = hook_problem(config)  # the same file and settings as the server's
            if broken is not None:
                hook = RoundOutcome.HOOK_BROKEN
                return hook.exit_code, build_payload(hook.payload(str(broken)), daemon), broken
        if answer.get("ratings_waiting") == 0:
            error = NothingToTrain(reason, fix="rate some replies first, or pass --force to "
                                               "train on the stored ratings again")
            nothing = RoundOutcome.NOTHING_NEW
            return nothing.exit_code, build_payload(nothing.payload(str(error)), daemon), error
        run = f", run #{answer['run_id']}" if answer.get("run_id") else ""
        raise Conflict(f"{reason} in reinf serve (pid {daemon['pid']}{run})",
                       fix="wait for it to finish; `reinf status` shows it")
    payload = build_payload(answer.get("result") or {}, daemon)
    ended = RoundOutcome.of(payload["status"], payload["error"])
    return ended.exit_code, payload, None if ended.ok else ReinfError(payload["message"])


def hook_problem(config, store=None):
    """The broken reward hook, worded as a round reports it, or None when it works."""
    from reinf.errors import HookError
    from reinf.rewards.mapper import check_hook

    try:
        check_hook(config, store)
    except HookError as exc:
        broken = HookError(f"reward hook broken: {exc.message}", fix=exc.fix, key=exc.key)
        broken.path, broken.line = getattr(exc, "path", None), getattr(exc, "line", None)
        return broken
    return None


def build_payload(result: dict, daemon: dict) -> dict:
    """The foreground's JSON shape, from the daemon's round result; "daemon" says where it
    ran and whether the new checkpoint was swapped into the running model."""
    status = result.get("status") or RoundOutcome.FAILED.status
    # A skipped result without an error kind was not started: another process's round
    # held the lock (FAILED: exit code 1, error "error").
    error = result.get("error") or RoundOutcome.of(status).error
    return {"run_id": result.get("run_id"), "status": status,
            "checkpoint_id": result.get("checkpoint_id"), "metrics": result.get("metrics") or {},
            "message": result.get("message") or status, "error": error,
            "daemon": {"pid": daemon.get("pid"), "url": daemon.get("url"),
                       "swapped": result.get("swapped", False),
                       "trigger": result.get("trigger")}}


COMMANDS = [train]
