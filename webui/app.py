"""The application factory.

``create_app(config, daemon=..., store=..., chat=..., engine=...)`` builds the Flask app
around objects it is given, so tests inject a real Store, a fake chat service and a real
``reinf.daemon.background.Daemon`` with a fake round runner, and ``reinf serve`` injects the real
engine and its daemon. Training and rollback always go to the daemon. Blueprints stay
thin: they read the request, call these objects, and return JSON.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from flask import Flask
from flask.json.provider import DefaultJSONProvider

from reinf.config import Config
from webui import api, openai_api, pages, training
from webui.errors import install_error_handlers
from webui.runtime import Runtime
from webui.security import Guard, install_security

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


def suggested_tags(config: Config) -> list[str]:
    """The rating panel's tag buttons: the tags the reward mapper knows, then the usual."""
    tags = list(config.rewards.tag_adjustments)
    for tag in SUGGESTED_TAGS:
        if tag not in tags:
            tags.append(tag)
    return tags


def _name_the_size_limit(app: Flask) -> None:
    """A body over ``max_request_bytes`` is a 413 whose JSON names that setting (``key``,
    ``param`` under /v1), as other limits name theirs; whether the Guard refused it by its
    Content-Length or werkzeug while reading a chunked body."""
    from werkzeug.exceptions import RequestEntityTooLarge

    from webui.errors import describe_http_error, render_error
    from webui.security import Refused

    @app.errorhandler(Refused)
    def _refused(exc: Refused):
        key = exc.key or ("max_request_bytes" if exc.status == 413 else None)
        return render_error(exc.status, exc.message, fix=exc.fix, key=key, headers=exc.headers)

    @app.errorhandler(RequestEntityTooLarge)
    def _too_large(exc: RequestEntityTooLarge):
        message, fix = describe_http_error(exc)
        return render_error(413, message, fix=fix, key="max_request_bytes")


def create_app(config: Config, *, daemon, store=None, chat=None, engine=None) -> Flask:
    """The web UI and API around ``daemon`` (a reinf.daemon.background.Daemon: "Train now", rollback
    and the schedule go to it), ``store`` (opened from config if None) and ``chat`` (a
    ChatService; without one, chat routes answer 501)."""
    owns_store = store is None
    if store is None:
        from reinf.storage.store import Store
        store = Store.open(config)
    app = Flask("webui", template_folder=str(HERE / "templates"),
                static_folder=str(HERE / "static"))
    app.json = JSONProvider(app)
    app.config.update(TEMPLATES_AUTO_RELOAD=False, SEND_FILE_MAX_AGE_DEFAULT=0)
    guard = Guard(config)
    runtime = Runtime(config=config, store=store, chat=chat, engine=engine, daemon=daemon,
                      guard=guard, owns_store=owns_store)
    app.extensions["reinf"] = runtime
    install_security(app, guard)
    install_error_handlers(app)
    _name_the_size_limit(app)

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
