"""The application factory.

``create_app(config, store=..., chat=..., engine=..., daemon=...)`` builds the Flask app
around objects it is given, so tests inject a real Store and a fake chat service, and
``reinf serve`` injects the real engine and the daemon. Blueprints stay thin: they read
the request, call these objects, and return JSON.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import math

from flask import Flask, current_app
from flask.json.provider import DefaultJSONProvider

from reinf.config import Config
from reinf.errors import NotAvailable
from webui.control import Control
from webui.errors import install_error_handlers
from webui.security import Guard, install_security
from webui.streaming import Streams

HERE = Path(__file__).resolve().parent
SUGGESTED_TAGS = ("too technical", "needs examples", "too long", "too short", "wrong",
                  "great tone")


def finite(value: Any) -> Any:
    """``value`` with NaN and infinities as None: JSON has no NaN, browsers reject it."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


class JSONProvider(DefaultJSONProvider):
    """Key order kept, UTF-8 as is, and never NaN (a failed run's metrics may hold NaN)."""
    sort_keys = False
    ensure_ascii = False

    def dumps(self, obj: Any, **kwargs: Any) -> str:
        try:
            return super().dumps(obj, allow_nan=False, **kwargs)
        except ValueError:
            return super().dumps(finite(obj), allow_nan=False, **kwargs)


@dataclass
class Runtime:
    """What the request handlers work with; one per app."""
    config: Config
    store: Any
    chat: Any
    engine: Any
    daemon: Any
    control: Control
    guard: Guard
    streams: Streams = field(default_factory=Streams)
    owns_store: bool = False

    def require_chat(self):
        if self.chat is None:
            raise NotAvailable("no model is loaded in this server",
                               fix="start the server with `reinf serve`")
        return self.chat

    @property
    def model_name(self) -> str:
        """The model id shown to OpenAI clients: the config's model_path, last component."""
        value = self.config.model.model_path.rstrip("/\\")
        return value.replace("\\", "/").rsplit("/", 1)[-1] if value.startswith(
            (".", "/", "~")) else value


def suggested_tags(config: Config) -> list[str]:
    """The rating panel's tag buttons: the tags the reward mapper knows, then the usual."""
    tags = list(config.rewards.tag_adjustments)
    for tag in SUGGESTED_TAGS:
        if tag not in tags:
            tags.append(tag)
    return tags


def get_runtime() -> Runtime:
    return current_app.extensions["reinf"]


def create_app(config: Config, *, store=None, chat=None, engine=None, daemon=None) -> Flask:
    """The web UI and API around ``store`` (opened from config if None) and ``chat``
    (a ChatService; without one, chat routes answer 501)."""
    owns_store = store is None
    if store is None:
        from reinf.store import Store
        store = Store.open(config)
    app = Flask("webui", template_folder=str(HERE / "templates"),
                static_folder=str(HERE / "static"))
    app.json = JSONProvider(app)
    app.config.update(TEMPLATES_AUTO_RELOAD=False, SEND_FILE_MAX_AGE_DEFAULT=0)
    guard = Guard(config)
    runtime = Runtime(config=config, store=store, chat=chat, engine=engine, daemon=daemon,
                      control=Control(config, store, engine=engine, daemon=daemon),
                      guard=guard, owns_store=owns_store)
    app.extensions["reinf"] = runtime
    install_security(app, guard)
    install_error_handlers(app)

    from webui import api, openai_api, pages, training
    app.register_blueprint(api.bp)
    app.register_blueprint(training.bp)
    app.register_blueprint(openai_api.bp)
    app.register_blueprint(pages.bp)

    @app.context_processor
    def _page_globals():
        return {"csrf_token": guard.csrf_token, "model_name": runtime.model_name,
                "auth_enabled": guard.auth_token is not None,
                "suggested_tags": suggested_tags(config),
                "max_message_chars": config.server.max_message_chars}

    return app
