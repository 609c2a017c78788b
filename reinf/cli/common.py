"""What every command shares: the lazily built config and store, JSON output, and the
CLI's one error boundary (``ReinfGroup``, the root group's class)."""
from __future__ import annotations

import json
import re
from typing import Any, Callable

import click

from reinf.config import Config, load_config
from reinf.errors import ReinfError


class AppContext:
    """Per-invocation state. The config and store are built on first use, so ``--help``
    and commands that need neither never touch the disk."""

    def __init__(self, config_path: str | None = None, home: str | None = None,
                 debug: bool = False, home_is_flag: bool = False):
        self.config_path = config_path
        self.home = home
        self.home_is_flag = home_is_flag  # --home, not REINF_HOME: `config show` says which
        self.debug = debug
        self.overrides: dict[str, Any] = {}
        self._config: Config | None = None
        self._store = None
        self._umask: int | None = None  # the umask before use_private_umask, for close()

    def override(self, **values: Any) -> None:
        """Record command-line flags (highest precedence); call before using ``config``."""
        self.overrides.update({k: v for k, v in values.items() if v is not None})
        self._config = None

    @property
    def config(self) -> Config:
        if self._config is None:
            import os
            environ = dict(os.environ)
            overrides = dict(self.overrides)
            if self.home:
                environ["REINF_HOME"] = self.home  # where the config file is looked for
                if self.home_is_flag:
                    overrides["data_dir"] = self.home
            self._config = load_config(self.config_path, environ=environ,
                                       overrides=overrides)
            self._private()
        return self._config

    def _private(self) -> None:
        """From here on, what Reinf writes (logs, checkpoints by the trainer child, the
        config that ``init`` writes) is for this user only; a data directory an older Reinf
        left open is tightened now, with one line on stderr (reinf.storage.permissions)."""
        from reinf.storage.permissions import secure_data_dir, use_private_umask

        if self._umask is None:
            self._umask = use_private_umask()
        secure_data_dir(self._config)

    @property
    def store(self):
        if self._store is None:
            from reinf.storage.store import Store
            self._store = Store.open(self.config)
        return self._store

    def reading_store(self):
        """The store for a command that only reads: it must not create or migrate a
        database (see Store.open_existing)."""
        if self._store is None:
            from reinf.storage.store import Store
            self._store = Store.open_existing(self.config)
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
        if self._umask is not None:  # in-process callers (tests) get theirs back
            from reinf.storage.permissions import restore_umask

            restore_umask(self._umask)
            self._umask = None


class ReinfGroup(click.Group):
    """Turns domain errors into one clean line (exit 1) unless --debug is given."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ReinfError as exc:
            if ctx.obj is not None and getattr(ctx.obj, "debug", False):
                raise
            raise click.ClickException(strip_escapes(str(exc))) from None
        except KeyboardInterrupt:
            click.echo("\ninterrupted", err=True)
            ctx.exit(130)
        except Exception as exc:  # noqa: BLE001 - only the kinds translate() knows
            known = translate(exc, ctx.obj)
            if known is None or getattr(ctx.obj, "debug", False):
                raise
            raise click.ClickException(strip_escapes(str(known))) from None


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
        from reinf.storage import db

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
        from reinf.storage import db

        return db.explain(exc, db.sqlite_path(app._store.engine))
    return None


json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print machine-readable JSON (stable; see README).")


def emit(data: Any, as_json: bool, text: Callable[[Any], None]) -> None:
    """Print ``data`` as JSON, or hand it to ``text`` for the human form, with every string
    in it (stored messages, tags, a run's error) stripped of terminal escapes."""
    if as_json:
        click.echo(dump_json(data, indent=2))
    else:
        text(strip_all(data))


# --- stored text on a terminal -------------------------------------------------------------

# A reply, a message or a tag is text from a model or a person; printed raw, an escape
# sequence in it can set the clipboard (OSC 52), plant a link (OSC 8), retitle the window
# (OSC 0) or redraw the screen (CSI). ECMA-48 sequences are removed whole, in their 7-bit
# (ESC x) and 8-bit (C1) forms: a string command up to its terminator, a CSI with its
# parameters, a two-character escape. Then every control character left goes (a lone ESC,
# CR, backspace, C1), and the bidi controls that reorder what is shown ("Trojan Source").
ESCAPE_SEQUENCE = re.compile(
    r"(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)"
    r"|(?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]"
    r"|\x1b[\x20-\x2f]*[\x30-\x7e]")
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e"
                     "\u2066-\u2069\ud800-\udfff]")
# What json.dumps(ensure_ascii=False) leaves raw but a terminal acts on: escaped as \uXXXX
# inside JSON strings, which every JSON reader decodes back to the same text.
JSON_RAW_CONTROL = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e"
                              "\u2066-\u2069]")


def strip_escapes(text: str) -> str:
    """``text`` safe to print on a terminal: no control sequence or character but newline
    and tab. Every printer of stored text goes through this."""
    return CONTROL.sub("", ESCAPE_SEQUENCE.sub("", text))


def strip_all(data: Any) -> Any:
    """``data`` (JSON-like) with strip_escapes applied to every string in it."""
    if isinstance(data, str):
        return strip_escapes(data)
    if isinstance(data, dict):
        return {strip_all(k): strip_all(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [strip_all(v) for v in data]
    return data


def dump_json(data: Any, **options: Any) -> str:
    """JSON text as Reinf prints it (UTF-8 as is), with the C1 and bidi controls that
    json.dumps leaves raw written as escapes: the same data to a reader, inert on a
    terminal."""
    text = json.dumps(data, ensure_ascii=False, default=str, **options)
    return JSON_RAW_CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def parse_turn(store, turn: str) -> int:
    """A TURN argument: ``last``, a turn number, or an OpenAI completion id (``chatcmpl-…``,
    as `/v1/chat/completions` and clients such as `llm logs` show it)."""
    return store.resolve_turn(turn)
