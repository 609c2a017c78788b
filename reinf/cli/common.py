"""What every command shares: the lazily built config and store, JSON output, and the
CLI's one error boundary (``ReinfGroup``, the root group's class)."""
from __future__ import annotations

import json
from typing import Any, Callable

import click

from reinf.config import Config, load_config
from reinf.errors import ReinfError


class AppContext:
    """Per-invocation state. The config and store are built on first use, so ``--help``
    and commands that need neither never touch the disk."""

    def __init__(self, config_path: str | None = None, home: str | None = None,
                 debug: bool = False):
        self.config_path = config_path
        self.home = home
        self.debug = debug
        self.overrides: dict[str, Any] = {}
        self._config: Config | None = None
        self._store = None

    def override(self, **values: Any) -> None:
        """Record command-line flags (highest precedence); call before using ``config``."""
        self.overrides.update({k: v for k, v in values.items() if v is not None})
        self._config = None

    @property
    def config(self) -> Config:
        if self._config is None:
            import os
            environ = dict(os.environ)
            if self.home:
                environ["REINF_HOME"] = self.home
            self._config = load_config(self.config_path, environ=environ,
                                       overrides=self.overrides)
        return self._config

    @property
    def store(self):
        if self._store is None:
            from reinf.store import Store
            self._store = Store.open(self.config)
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


class ReinfGroup(click.Group):
    """Turns domain errors into one clean line (exit 1) unless --debug is given."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ReinfError as exc:
            if ctx.obj is not None and getattr(ctx.obj, "debug", False):
                raise
            raise click.ClickException(str(exc)) from None
        except KeyboardInterrupt:
            click.echo("\ninterrupted", err=True)
            ctx.exit(130)
        except Exception as exc:  # noqa: BLE001 - only the kinds translate() knows
            known = translate(exc, ctx.obj)
            if known is None or getattr(ctx.obj, "debug", False):
                raise
            raise click.ClickException(str(known)) from None


def translate(exc: BaseException, app: AppContext | None) -> ReinfError | None:
    """The errors no command expects but the machine can cause, as one line with a fix: a
    file Reinf may not write (a read-only data directory: the server's lock, the log, the
    config that ``init`` writes), and a database that turned out damaged or locked after
    it was opened. Anything else stays a traceback: it is a bug."""
    import errno
    from pathlib import Path

    config = getattr(app, "_config", None)
    if isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS) \
            and exc.filename:
        from reinf import db

        path = Path(exc.filename)
        home = config.data_dir if config is not None else None
        if home is not None and (path == home or home in path.parents):
            try:
                db.check_directory(home)
            except ReinfError as error:
                return error
            return ReinfError(f"cannot write {path}: {exc.strerror}",
                              fix=f"make it writable (check its owner and permissions with "
                                  f"`ls -l {path}`), or set REINF_HOME to another directory")
        return ReinfError(f"cannot write {path}: {exc.strerror}",
                          fix=f"check the permissions of {path.parent}, or choose another path")
    try:
        from sqlalchemy.exc import DBAPIError
    except ImportError:  # pragma: no cover - a dependency
        return None
    if isinstance(exc, DBAPIError) and app is not None and app._store is not None:
        from reinf import db

        return db.explain(exc, db.sqlite_path(app._store.engine))
    return None


json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print machine-readable JSON (stable; see README).")


def emit(data: Any, as_json: bool, text: Callable[[Any], None]) -> None:
    """Print ``data`` as JSON, or hand it to ``text`` for the human form."""
    if as_json:
        click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))
    else:
        text(data)


def parse_turn(store, turn: str) -> int:
    """A TURN argument: a number, or ``last`` for the newest turn."""
    from reinf.errors import BadInput, NotFound

    if turn == "last":
        last = store.last_turn()
        if last is None:
            raise NotFound("there are no turns yet", fix="chat first: `reinf chat`")
        return last.id
    try:
        return int(turn)
    except ValueError:
        raise BadInput(f"TURN must be a turn id or 'last', got {turn!r}") from None
