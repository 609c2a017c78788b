"""What the request handlers work with: one ``Runtime`` per app, found with ``get_runtime()``.

Kept apart from the application factory (as flaskr keeps ``get_db`` out of it), so the
blueprints import this module and the factory imports the blueprints, never the reverse.
"""
from __future__ import annotations

import functools
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any

from flask import current_app

from reinf.catalog import model_display_name
from reinf.config import Config
from reinf.errors import NotAvailable
from webui.security import Guard
from webui.streaming import Streams

log = logging.getLogger("reinf.webui")


@dataclass
class Runtime:
    """The objects one app serves: the store, the chat service, the engine, and the daemon
    (reinf.daemon.background.Daemon), which owns every training round and every rollback."""
    config: Config
    store: Any
    chat: Any
    engine: Any
    daemon: Any
    guard: Guard
    streams: Streams = field(default_factory=Streams)
    owns_store: bool = False
    # config.yaml as last read by config_now(): (the file's stat, config, change)
    _seen: tuple | None = field(default=None, init=False, repr=False, compare=False)
    _seen_lock: threading.Lock = field(default_factory=threading.Lock, init=False,
                                       repr=False, compare=False)

    def require_chat(self):
        if self.chat is None:
            raise NotAvailable("no model is loaded in this server",
                               fix="start the server with `reinf serve`")
        return self.chat

    @functools.cached_property
    def instance_id(self) -> str:
        """The data directory's random id (reinf.daemon.remote.ensure_instance_id), for
        /api/ping."""
        from reinf.daemon.remote import ensure_instance_id

        return ensure_instance_id(self.config.data_dir)

    @property
    def model_name(self) -> str:
        """The model id shown to clients: a named model or hub id, a directory's name."""
        return model_display_name(self.config.model.model_path)

    def config_now(self) -> tuple[Config, dict | None]:
        """The config the next training round will use (the trainer child reads config.yaml
        afresh each round, the server read it once) and what changed since the server
        started (reinf.daemon.status.config_changes: None when nothing did). While the file does
        not load, the first is the config the server started with. The file is read again
        only when its size or times change."""
        from reinf.config import find_config_file
        from reinf.daemon.status import config_changes, reread_config

        environ = {**os.environ, "REINF_HOME": str(self.config.data_dir)}
        path = self.config.source or find_config_file(environ)
        try:
            stat = os.stat(path) if path else None
            key = (str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns) \
                if stat else None
        except OSError:
            key = (str(path), "missing")
        with self._seen_lock:
            if self._seen is not None and self._seen[0] == key:
                return self._seen[1], self._seen[2]
            current, error = reread_config(self.config)
            change = config_changes(self.config, current, error)
            self._seen = (key, current or self.config, change)
            return self._seen[1], change

    def round_config(self) -> Config:
        """config_now()'s config: what rewards and training settings are now."""
        return self.config_now()[0]

    def schedule_info(self) -> dict[str, Any]:
        """The daemon's schedule and state; GET /api/status answers even if it fails."""
        try:
            info = dict(self.daemon.schedule_info())
        except Exception as exc:  # noqa: BLE001 - status must answer even so
            log.exception("daemon schedule_info failed")
            info = {"running": True, "error": str(exc)}
        info.setdefault("running", True)
        return info

    def notify_rating(self) -> None:
        """Tell the daemon a rating was stored (its ratings trigger counts them)."""
        try:
            self.daemon.notify_rating()
        except Exception:  # noqa: BLE001 - a stored rating stays stored
            log.exception("daemon notify_rating failed")


def get_runtime() -> Runtime:
    return current_app.extensions["reinf"]
