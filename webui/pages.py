"""The HTML pages: chat, compare, history, training, and the login form used when an auth
token is set. Pages are shells; their scripts fetch data from the JSON API and render it with
textContent, never as HTML."""
from __future__ import annotations

import hmac
import unicodedata
from urllib.parse import unquote, urlsplit

from flask import Blueprint, make_response, redirect, render_template, request

from webui.runtime import get_runtime
from webui.security import TOKEN_COOKIE

bp = Blueprint("pages", __name__)


@bp.get("/")
def chat():
    return render_template("chat.html", page="chat",
                           system_prompt=get_runtime().config.generation.system_prompt)


@bp.get("/compare")
def compare():
    """Replies of the base model and the trained checkpoints side by side, picked blind."""
    return render_template("compare.html", page="compare")


@bp.get("/history")
def history():
    return render_template("history.html", page="history")


@bp.get("/training")
def training():
    return render_template("training.html", page="training")


@bp.get("/favicon.ico")
def favicon():
    return redirect("/static/favicon.svg", code=301)


def safe_next(target: str | None) -> str:
    """Only same-site paths: never redirect a person to another site after login.

    Browsers drop tabs and newlines from URLs and read ``\\`` as ``/``, so ``/%09/evil``
    is ``//evil``: another site. The target is checked percent-decoded (until it stops
    changing) and with whitespace and control characters removed; anything that then
    starts with ``//`` or holds ``\\``, a scheme (``x://``, ``javascript:``) or a control
    character (CR/LF would split the header) gives ``/``."""
    if not target or len(target) > 2000 or not target.startswith("/"):
        return "/"
    decoded = target
    for _ in range(5):
        decoded, before = unquote(decoded), decoded
        if decoded == before:
            break
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in decoded):
        return "/"
    bare = "".join(c for c in decoded if not c.isspace())
    if not bare.startswith("/") or bare.startswith("//") or "\\" in bare or "://" in bare \
            or urlsplit(bare).scheme or urlsplit(bare).netloc:
        return "/"
    return target


@bp.route("/login", methods=["GET", "POST"])
def login():
    guard = get_runtime().guard
    target = safe_next(request.values.get("next"))
    if guard.auth_token is None:
        return redirect(target)
    if request.method == "GET":
        return render_template("login.html", page="login", next=target, error=None)
    given = request.form.get("token", "")
    if not hmac.compare_digest(given.encode(), guard.auth_token.encode()):
        html = render_template("login.html", page="login", next=target,
                               error="That token is not right. It is auth_token in config.yaml.")
        return html, 401
    response = make_response(redirect(target))
    response.set_cookie(TOKEN_COOKIE, guard.auth_token, httponly=True, samesite="Strict",
                        secure=request.is_secure, path="/")
    return response


@bp.post("/logout")
def logout():
    response = make_response(redirect("/login"))
    response.delete_cookie(TOKEN_COOKIE, path="/")
    return response
