"""Safety of a local service (docs/design.md §9): Host allow-list, auth token, CSRF, size limits,
security headers.

Checks run before every request, in this order:

1. **Host** — the Host header must name this machine: localhost, 127.0.0.1, [::1]
   (any port), the bound host, or a name in ``allowed_hosts``. A page served under an
   attacker's domain that re-resolves to 127.0.0.1 (DNS rebinding) is refused with 400,
   and so is a malformed Host (``[::1]evil``, ``localhost:8765/..``).
   When the server is bound off loopback (auth is then mandatory), IP literals are
   accepted too: they cannot be rebound.
2. **Size** — a declared body above ``max_request_bytes`` is refused with 413 before it
   is read; werkzeug enforces the same limit on chunked bodies.
3. **Auth** — with ``auth_token`` set, /api and /v1 need ``Authorization: Bearer
   <token>`` (or the HttpOnly cookie the login page sets) and answer 401 without it;
   pages redirect to /login.
4. **CSRF** — a state-changing request (POST, PUT, PATCH, DELETE) is refused with 403
   when its Origin is another site, when Sec-Fetch-Site says cross-site or same-site,
   or when it comes from a browser (Origin, Sec-Fetch-* or Cookie present) without the
   page's ``X-Reinf-CSRF`` token. Non-browser clients (curl, the OpenAI client, `reinf
   chat`) send none of those; they must send JSON (Content-Type: application/json), which
   a cross-site HTML form cannot.
"""
from __future__ import annotations

import hmac
import ipaddress
import re
import secrets
from urllib.parse import urlsplit

from flask import Flask, redirect, request, url_for

from reinf.config import Config, is_loopback
from reinf.errors import ReinfError

LOCAL_NAMES = {"localhost", "127.0.0.1", "::1"}
SAFE_METHODS = {"GET", "HEAD", "OPTIONS", "TRACE"}
CSRF_HEADER = "X-Reinf-CSRF"
TOKEN_COOKIE = "reinf_token"
OPEN_PATHS = ("/static/", "/login", "/favicon.ico")
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'")


class Refused(ReinfError):
    """A request the safety checks turn away (400, 401, 403, 413, 415)."""

    def __init__(self, message: str, *, status: int, fix: str | None = None,
                 headers: dict | None = None):
        super().__init__(message, fix=fix, status=status)
        self.headers = headers or {}


def split_host(value: str) -> str:
    """The host name of a configured address (``allowed_hosts``, ``host``: "::1" may come
    without brackets), lower-cased, without port or brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


# RFC 9110 Host: a name or IPv4 address, or an IPv6 address in brackets, then an optional
# port. Anything after that ("[::1]evil", "localhost:8773/..") is not a Host at all.
HOST_HEADER = re.compile(r"(?:\[(?P<ip6>[0-9a-f:.]+)\]|(?P<name>[a-z0-9._-]+))(?::\d{0,5})?")


def parse_host_header(value: str) -> str | None:
    """The host name of a Host header, lower-cased, without port or brackets; None when
    the header is malformed."""
    match = HOST_HEADER.fullmatch(value.strip().lower())
    if match is None:
        return None
    return match["ip6"] or match["name"].rstrip(".")


def is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class Guard:
    """The per-app safety state: allowed hosts, the auth token and the CSRF token."""

    def __init__(self, config: Config):
        server = config.server
        self.bound_host = server.host
        self.local_only = is_loopback(server.host)
        self.allowed = LOCAL_NAMES | {split_host(h) for h in server.allowed_hosts}
        if server.host not in ("0.0.0.0", "::", ""):
            self.allowed.add(split_host(server.host))
        self.auth_token = server.auth_token or None
        # A fresh token per process: pages embed it, JavaScript sends it back in a header
        # that no cross-site form or simple request can carry.
        self.csrf_token = secrets.token_urlsafe(32)
        self.max_request_bytes = server.max_request_bytes

    # --- the checks ------------------------------------------------------------------

    def check_host(self) -> None:
        raw = request.headers.get("Host")
        if raw is None:  # HTTP/1.0 without Host: the server's own name is used
            return
        host = parse_host_header(raw)
        if host is None:
            raise Refused(f"Host {raw!r} is not a valid host name", status=400,
                          fix="open the UI at http://127.0.0.1 or localhost")
        if host in self.allowed or host.startswith("127.") and is_ip_literal(host):
            return
        if not self.local_only and is_ip_literal(host):
            return
        raise Refused(f"Host {raw!r} is not an allowed name for this server",
                      status=400, fix="open the UI at http://127.0.0.1 or localhost, or add the "
                                      "name to allowed_hosts in config.yaml")

    def check_size(self) -> None:
        length = request.content_length
        if length is not None and length > self.max_request_bytes:
            raise Refused(f"request body is {length} bytes; the limit is "
                          f"{self.max_request_bytes} bytes", status=413,
                          fix="send less, or raise max_request_bytes in config.yaml")

    def is_authenticated(self) -> bool:
        if self.auth_token is None:
            return True
        given = ""
        header = request.headers.get("Authorization", "")
        if header[:7].lower() == "bearer ":
            given = header[7:].strip()
        elif request.cookies.get(TOKEN_COOKIE):
            given = request.cookies[TOKEN_COOKIE]
        return hmac.compare_digest(given.encode(), self.auth_token.encode())

    def check_auth(self):
        if self.auth_token is None or request.path.startswith(OPEN_PATHS):
            return None
        if self.is_authenticated():
            return None
        if request.path.startswith(("/api/", "/v1/")) or request.path in ("/api", "/v1"):
            raise Refused("this server needs its auth token", status=401,
                          fix="send 'Authorization: Bearer <auth_token>' (see config.yaml)",
                          headers={"WWW-Authenticate": 'Bearer realm="reinf"'})
        return redirect(url_for("pages.login", next=request.full_path.rstrip("?")))

    def check_csrf(self) -> None:
        if request.method in SAFE_METHODS:
            return
        origin = request.headers.get("Origin")
        site = request.headers.get("Sec-Fetch-Site")
        # Under Referrer-Policy: no-referrer, Chromium posts this server's own forms (sign in,
        # sign out) with "Origin: null"; its Sec-Fetch-Site, which no page can set, still
        # says same-origin. Such a request must then carry the CSRF token like any other.
        own_form = origin == "null" and site == "same-origin"
        if origin is not None and not own_form and not self._same_origin(origin):
            raise Refused(f"cross-site request from {origin} refused", status=403,
                          fix="use the web UI served by this server, or a non-browser client")
        if site is not None and site not in ("same-origin", "none"):
            raise Refused(f"{site} request refused", status=403,
                          fix="use the web UI served by this server")
        sent = request.headers.get(CSRF_HEADER)
        if sent is None and request.path in ("/login", "/logout"):  # plain HTML forms
            sent = request.form.get("csrf")
        if sent is not None:
            if hmac.compare_digest(sent.encode(), self.csrf_token.encode()):
                return
            raise Refused("the page's security token is out of date", status=403,
                          fix="reload the page (the server was restarted)")
        from_browser = origin is not None or site is not None or "Cookie" in request.headers
        if from_browser:
            raise Refused("missing security token (X-Reinf-CSRF)", status=403,
                          fix="reload the page; scripts must send the X-Reinf-CSRF header")
        if request.content_length and not request.is_json:
            raise Refused("send the body as JSON", status=415,
                          fix="add the header 'Content-Type: application/json'")

    def _same_origin(self, origin: str) -> bool:
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return False  # "null" (sandboxed frames, file://) and anything odd
        host = request.headers.get("Host", "").lower()
        default = ":443" if parts.scheme == "https" else ":80"
        return parts.netloc.lower().removesuffix(default) == host.removesuffix(default)


def install_security(app: Flask, guard: Guard) -> None:
    app.config["MAX_CONTENT_LENGTH"] = guard.max_request_bytes
    app.extensions["reinf_guard"] = guard

    @app.before_request
    def _guard():
        guard.check_host()
        guard.check_size()
        response = guard.check_auth()
        if response is not None:
            return response
        guard.check_csrf()
        return None

    @app.after_request
    def _headers(response):
        h = response.headers
        h.setdefault("Content-Security-Policy", CSP)
        h.setdefault("X-Content-Type-Options", "nosniff")
        h.setdefault("X-Frame-Options", "DENY")
        h.setdefault("Referrer-Policy", "no-referrer")
        h.setdefault("Cross-Origin-Opener-Policy", "same-origin")
        h.setdefault("Cross-Origin-Resource-Policy", "same-origin")
        if request.path.startswith(("/api/", "/v1/")):
            h.setdefault("Cache-Control", "no-store")
        return response
