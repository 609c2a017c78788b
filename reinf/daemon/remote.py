"""Other processes find and talk to the running ``reinf serve`` of a data directory.

The lock file (reinf.lock) says whether a server runs and where (:func:`locate_server`);
its JSON API does the rest. ``reinf chat`` asks :func:`find_server` where a server
answers, ``reinf status`` calls :func:`locate_server` and :func:`fetch_schedule`,
``reinf rollback`` :func:`notify_rollback`, and ``reinf train`` :func:`request_train`, so
that while a server runs there is one trainer and one adapter switch, both in the server.
Every URL comes from :func:`build_url` and every request, these and ``reinf chat``'s
(reinf.client), goes through :func:`send_request`: standard library only, never through a
proxy, since the server is on this machine.
"""
from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from reinf.daemon.lock import read_lock
from reinf.errors import ReinfError
from reinf.logs import log_path

log = logging.getLogger("reinf.daemon.remote")

HTTP_TIMEOUT_SECONDS = 15.0
PROBE_TIMEOUT_SECONDS = 2.0
# A client cannot connect to a wildcard bind address: it reaches the server on loopback.
# A server bound to "::" surely listens on ::1, on 127.0.0.1 only when dual-stack.
WILDCARD_LOOPBACK = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}

# Never through the environment's http_proxy: the server is on this machine, and a proxy
# must not see its traffic (nor its auth token). Shared, as urllib's own urlopen() does.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Unreachable(ReinfError):
    """A server holds the data directory's lock but does not answer (yet)."""
    status = 503


def send_request(url: str, path: str, body: Any = None, *, method: str = "GET",
                 token: str | None = None, timeout: float = HTTP_TIMEOUT_SECONDS,
                 stream: bool = False, answers: tuple[int, ...] = ()):
    """The one HTTP request Reinf sends to a server: ``method`` ``url + path`` with ``body``
    as JSON (None: no body) and the auth token, directly, never through a proxy.

    Returns the JSON answer, or with ``stream`` the open response (urllib's, a context
    manager: the caller reads the event stream and closes it). An error answer raises
    ReinfError with the server's message, fix and status (the /api or the /v1 shape); a 401
    from a Reinf server raises TokenRefused, which says whether a token was sent; the
    ``answers`` statuses return their JSON instead. No answer at all raises urllib's
    URLError or OSError, and an answer that is not JSON ValueError, for the caller to word.
    """
    headers = {"Accept": "text/event-stream" if stream else "application/json"}
    data = None
    if body is not None:
        headers["Content-Type"] = "application/json"
        data = json.dumps(body).encode("utf-8")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url.rstrip("/") + path, data=data, method=method,
                                     headers=headers)
    try:
        response = _OPENER.open(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        realm = (exc.headers or {}).get("WWW-Authenticate") or ""
        try:
            answer = json.loads(exc.read() or b"{}")
        except ValueError:
            answer = {}
        finally:
            exc.close()
        if exc.code == 401 and 'realm="reinf"' in realm:
            raise token_refused(url, token) from None  # a Reinf server: the token is the fault
        if not isinstance(answer, dict):
            answer = {}
        if exc.code in answers:
            return answer
        if isinstance(answer.get("error"), dict):  # the /v1 shape
            answer = {"error": answer["error"].get("message"), "fix": answer["error"].get("fix")}
        raise ReinfError(answer.get("error") or f"reinf serve answered {exc.code} on {path}",
                         fix=answer.get("fix"), status=exc.code) from None
    if stream:
        return response
    with response:
        return json.loads(response.read() or b"null")


def build_url(host: str, port: int) -> str:
    """The URL a client on this machine uses for a server bound to ``host``:``port``:
    a wildcard address becomes loopback, an IPv6 address is bracketed."""
    host = host.strip("[]")
    host = WILDCARD_LOOPBACK.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def probe_server(url: str, *, token: str | None = None,
                 timeout: float = PROBE_TIMEOUT_SECONDS) -> dict[str, Any] | None:
    """What ``GET {url}/api/ping`` answers ({"service": "reinf", "version", "model",
    "chat"}), or None when no Reinf server answers there (nothing listens, another
    service). A Reinf server that refuses ``token`` (missing or wrong: 401) raises
    TokenRefused, which says so: "no server answers" would send the person looking for
    a server that is running.

    Where nothing listens the connection is refused at once; the timeout only bounds a
    server that accepted the connection (a busy server answers within it)."""
    try:
        data = send_request(url, "/api/ping", token=token, timeout=timeout)
    except TokenRefused:
        raise
    except (ReinfError, OSError, ValueError):  # another service's error answer, or none
        return None
    return data if isinstance(data, dict) and data.get("service") == "reinf" else None


class TokenRefused(ReinfError):
    """A Reinf server answered 401: the client sent no auth token, or a wrong one."""
    status = 401


def token_refused(url: str, token: str | None) -> TokenRefused:
    fix = ("set REINF_AUTH_TOKEN (or auth_token in config.yaml) to the token that server "
           "was started with")
    if not token:
        return TokenRefused(f"reinf serve at {url} needs an auth token, and none is set",
                            fix=fix)
    return TokenRefused(f"reinf serve at {url} refused the auth token: it is not that "
                        "server's", fix=fix)


def locate_server(config) -> dict[str, Any]:
    """{"running", "pid", "url", "host", "port", "started_at", "version", "lock_file",
    "log_file"} of the server using this data directory, from its lock file (no HTTP)."""
    return {**read_lock(config), "log_file": str(log_path(config))}


def _lock_url(info: dict[str, Any]) -> str | None:
    """Where to reach the server of ``info`` (locate_server's): its bind address, else
    the URL it recorded (None while it starts and has not bound a port yet)."""
    host, port = info.get("host"), info.get("port")
    return build_url(host, port) if host and port else info.get("url")


INSTANCE_FILE = "instance_id"


def read_instance_id(data_dir) -> str | None:
    """The random id of a data directory (``<data_dir>/instance_id``), None if it has none
    yet: a server says which data directory it serves by this id, never by its path."""
    try:
        value = (Path(data_dir) / INSTANCE_FILE).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return value or None


def ensure_instance_id(data_dir) -> str:
    """The data directory's id, made (random, 600) the first time a server starts on it."""
    existing = read_instance_id(data_dir)
    if existing:
        return existing
    value = uuid.uuid4().hex
    path = Path(data_dir) / INSTANCE_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it first
        return read_instance_id(data_dir) or value
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(value + "\n")
    return value


def find_server(config, url: str | None = None) -> str | None:
    """The URL of a Reinf server that answers: at ``url`` when given, else this data
    directory's server (same DB), else the configured address; None when none answers.

    A server found at the configured address that serves another data directory is
    refused (ReinfError): chatting with it would put this person's messages in another
    person's history. ``url`` given on purpose is taken as asked."""
    explicit = bool(url)
    if not url:
        info = locate_server(config)
        url = (_lock_url(info) if info["running"] else None) or \
            build_url(config.server.host, config.server.port)
    answer = probe_server(url, token=config.server.auth_token)
    if answer is None:
        return None
    theirs, ours = answer.get("instance"), read_instance_id(config.data_dir)
    if not explicit and theirs is not None and theirs != ours:
        raise ReinfError(
            f"the Reinf server at {url} serves another data directory, not {config.data_dir}",
            fix=f"talk to it on purpose with --url {url}, or start this data directory's own "
                f"server on another port (REINF_PORT=8766 reinf serve), or stop the other one",
            status=409)
    return url


def call_daemon(config, path: str, body: dict | None = None, *, method: str = "POST",
                answers: tuple[int, ...] = ()) -> dict[str, Any] | None:
    """Send JSON to the running server; None when none runs. An error answer raises
    ReinfError with the server's message, fix and status, except the ``answers``
    statuses, whose JSON is returned; no answer at all raises Unreachable."""
    info = locate_server(config)
    if not info["running"]:
        return None
    url = _lock_url(info)
    if not url:
        raise Unreachable(f"reinf serve (pid {info['pid']}) is starting and has no address "
                          "yet", fix="try again in a moment")
    try:
        answer = send_request(url, path, None if method == "GET" else (body or {}),
                              method=method, token=config.server.auth_token, answers=answers)
    except (OSError, ValueError) as exc:  # urllib's URLError is an OSError
        reason = getattr(exc, "reason", exc)
        raise Unreachable(f"reinf serve (pid {info['pid']}) holds {config.data_dir} but does "
                          f"not answer at {url}: {reason}",
                          fix="wait until it has started, or stop it") from None
    return {} if answer is None else answer


def notify_rollback(config, checkpoint_id: str | None) -> bool:
    """Tell a running server to switch adapters; False when none runs or it does not
    answer (then the store's choice applies when it starts). A refusal raises."""
    try:
        return call_daemon(config, "/api/rollback",
                           {"checkpoint_id": checkpoint_id or "base"}) is not None
    except Unreachable as exc:
        log.warning("%s", exc)
        return False


def fetch_schedule(config) -> dict[str, Any] | None:
    """The running server's schedule (its GET /api/status "schedule": next_run, training,
    ratings_waiting, last_result, warnings, ...) for ``reinf status``; None when no
    server runs or it does not answer."""
    try:
        status = call_daemon(config, "/api/status", method="GET")
    except Unreachable:
        return None
    return (status or {}).get("schedule") if status is not None else None


def request_train(config, *, force: bool = False, wait: bool = False,
                  timeout: float | None = None, poll_seconds: float = 0.5) -> dict[str, Any] | None:
    """Ask a running server to train now; None when none runs.

    The answer is the server's: {"started": True, "trigger", ...} (202), or
    {"started": False, "reason", "run_id"?, ...} (409: a round runs, or nothing new to
    train on; ``force`` trains on the stored ratings again). With ``wait``, a
    started round is followed (GET /api/status) until it ends, and its result (the
    daemon's last_result: status, message, run_id, checkpoint_id, metrics) is added as
    "result". ``timeout`` defaults to train_timeout_minutes plus a minute.
    """
    def last_result() -> dict:
        status = call_daemon(config, "/api/status", method="GET") or {}
        return (status.get("schedule") or {}).get("last_result") or {}

    before = last_result() if wait else None
    answer = call_daemon(config, "/api/train", {"force": True} if force else {},
                         answers=(409,))
    if answer is None or not wait or not answer.get("started"):
        return answer
    limit = timeout if timeout is not None else config.schedule.train_timeout_minutes * 60 + 60
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        time.sleep(poll_seconds)
        # last_result changes when a round ends. Not gated on "training": a ratings round
        # may start right after ours, and its result is told apart by its trigger.
        result = last_result()
        if result and result != before and result.get("trigger") == answer.get("trigger"):
            return {**answer, "result": result}
    raise ReinfError(f"the server's training round did not finish within {limit:.0f} s",
                     fix="it may still be running: `reinf status` shows it", status=504)
