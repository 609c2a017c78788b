"""What the request handlers work with: one ``Runtime`` per app, found with ``get_runtime()``.

Kept apart from the application factory (as flaskr keeps ``get_db`` out of it), so the
blueprints import this module and the factory imports the blueprints, never the reverse.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Any

from flask import current_app

from reinf.config import Config, model_display_name
from reinf.errors import NotAvailable
from webui.security import Guard
from webui.streaming import Streams

log = logging.getLogger("reinf.webui")


@dataclass
class Runtime:
    """The objects one app serves: the store, the chat service, the engine, and the daemon
    (reinf.daemon.Daemon), which owns every training round and every rollback."""
    config: Config
    store: Any
    chat: Any
    engine: Any
    daemon: Any
    guard: Guard
    streams: Streams = field(default_factory=Streams)
    owns_store: bool = False

    def require_chat(self):
        if self.chat is None:
            raise NotAvailable("no model is loaded in this server",
                               fix="start the server with `reinf serve`")
        return self.chat

    @functools.cached_property
    def instance_id(self) -> str:
        """The data directory's random id (reinf.remote.ensure_instance_id), for /api/ping."""
        from reinf.remote import ensure_instance_id

        return ensure_instance_id(self.config.data_dir)

    @property
    def model_name(self) -> str:
        """The model id shown to clients: a named model or hub id, a directory's name."""
        return model_display_name(self.config.model.model_path)

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
