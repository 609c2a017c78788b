"""One error renderer for the whole app.

A ReinfError carries its status, message and fix; werkzeug's HTTP errors (404, 405,
413) get messages written for a person. Under /api the body is
``{"error", "status", "fix"?, "key"?}``; under /v1 it is OpenAI's shape
``{"error": {"message", "type", "code", "fix"?}}`` so OpenAI clients show the message;
pages get a small HTML page. Anything unexpected is logged with its traceback and
answered with a 500 as a last resort.
"""
from __future__ import annotations

import logging

from flask import Flask, current_app, jsonify, render_template, request
from flask.globals import request_ctx
from markupsafe import escape
from werkzeug.exceptions import HTTPException

from reinf.errors import ReinfError

log = logging.getLogger("reinf.webui")

OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "not_found_error", 409: "conflict_error",
                413: "invalid_request_error", 415: "invalid_request_error",
                429: "rate_limit_error"}


def is_api_path(path: str) -> bool:
    return path.startswith(("/api/", "/v1/")) or path in ("/api", "/v1")


def printable(text: str | None) -> str | None:
    """``text`` with anything UTF-8 cannot carry (a lone surrogate echoed from a request)
    written as an escape, so an error about bad text can itself be sent."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8") if text else text


def render_error(status: int, message: str, *, fix: str | None = None, key: str | None = None,
                 headers: dict | None = None):
    """The response for an error, as JSON or HTML depending on where it happened."""
    message, fix, key = printable(message), printable(fix), printable(key)
    path = request.path
    if path.startswith("/v1/") or path == "/v1":
        body = {"message": message, "type": OPENAI_TYPES.get(status, "server_error"
                                                             if status >= 500 else
                                                             "invalid_request_error"),
                "code": status, "param": key}
        if fix:
            body["fix"] = fix
        response = jsonify({"error": body})
    elif is_api_path(path) or request.accept_mimetypes.best == "application/json":
        body = {"error": message, "status": status}
        if fix:
            body["fix"] = fix
        if key:
            body["key"] = key
        response = jsonify(body)
    elif request_ctx.url_adapter is None:
        response = bare_page(status, message, fix)
    else:
        response = current_app.response_class(
            render_template("error.html", page="error", status=status, message=message, fix=fix),
            mimetype="text/html")
    response.status_code = status
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


def bare_page(status: int, message: str, fix: str | None):
    """The error page without the layout: werkzeug could not bind this request's Host to
    the URL map (``a..b``), so ``url_for`` in base.html has nothing to build with."""
    body = (f"<!doctype html>\n<title>Error {status}</title>\n<h1>Error {status}</h1>\n"
            f'<p role="alert">{escape(message)}</p>\n')
    if fix:
        body += f"<p>{escape(fix)}</p>\n"
    return current_app.response_class(body, mimetype="text/html")


def describe_http_error(exc: HTTPException) -> tuple[str, str | None]:
    """A message and fix for werkzeug's HTTP errors, naming what was asked for."""
    code = exc.code or 500
    if code == 404:
        return (f"no such page or route: {request.method} {request.path}",
                "see the API list in the README (docs/api.md)")
    if code == 405:
        allowed = ", ".join(sorted(m for m in (exc.valid_methods or []) if m != "OPTIONS"))
        return (f"method {request.method} is not allowed on {request.path}",
                f"use {allowed}" if allowed else None)
    if code == 413:
        limit = current_app.config.get("MAX_CONTENT_LENGTH")
        return (f"request body is too large (limit {limit} bytes)",
                "send less, or raise max_request_bytes in config.yaml")
    if code == 400:
        return (exc.description or "bad request", None)
    return (exc.description or exc.name, None)


def install_error_handlers(app: Flask) -> None:
    @app.errorhandler(ReinfError)
    def _reinf(exc: ReinfError):
        headers = getattr(exc, "headers", None)
        return render_error(exc.status, exc.message, fix=exc.fix, key=exc.key, headers=headers)

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException):
        message, fix = describe_http_error(exc)
        headers = {}
        if exc.code == 405 and exc.valid_methods:
            headers["Allow"] = ", ".join(exc.valid_methods)
        return render_error(exc.code or 500, message, fix=fix, headers=headers)

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        log.exception("unexpected error on %s %s", request.method, request.path)
        return render_error(500, f"internal error ({type(exc).__name__}); details are in the log",
                            fix="please report it with the log file (see `reinf status`)")
