"""Other processes talk to the running ``reinf serve`` of a data directory.

The lock file (reinf.lock) says whether a server runs and where; its JSON API does the
rest. ``reinf status`` calls :func:`probe_daemon`, ``reinf rollback``
:func:`notify_rollback`, and ``reinf train`` :func:`request_train`, so that while a
server runs there is one trainer and one adapter switch, both in the server. Standard
library only, never through a proxy: the server is on this machine.
"""
from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from typing import Any

from reinf.errors import ReinfError
from reinf.lock import read_lock
from reinf.logs import log_path

log = logging.getLogger("reinf.remote")

HTTP_TIMEOUT_SECONDS = 15.0


class Unreachable(ReinfError):
    """A server holds the data directory's lock but does not answer (yet)."""
    status = 503


def probe_daemon(config) -> dict[str, Any]:
    """{"running", "pid", "url", "host", "port", "started_at", "version", "lock_file",
    "log_file"} of the server using this data directory."""
    return {**read_lock(config), "log_file": str(log_path(config))}


def connect_url(info: dict[str, Any]) -> str | None:
    """Where to reach the server: its address, with a wildcard bind read as loopback."""
    host, port = info.get("host"), info.get("port")
    if not host or not port:
        return info.get("url")
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def call_daemon(config, path: str, body: dict | None = None, *, method: str = "POST",
                answers: tuple[int, ...] = ()) -> dict[str, Any] | None:
    """Send JSON to the running server; None when none runs. An error answer raises
    ReinfError with the server's message, fix and status, except the ``answers``
    statuses, whose JSON is returned; no answer at all raises Unreachable."""
    info = probe_daemon(config)
    if not info["running"]:
        return None
    url = connect_url(info)
    if not url:
        raise Unreachable(f"reinf serve (pid {info['pid']}) is starting and has no address "
                          "yet", fix="try again in a moment")
    headers = {"Accept": "application/json"}
    data = None
    if method != "GET":
        headers["Content-Type"] = "application/json"
        data = json.dumps(body or {}).encode()
    if config.server.auth_token:
        headers["Authorization"] = f"Bearer {config.server.auth_token}"
    request = urllib.request.Request(url.rstrip("/") + path, method=method, headers=headers,
                                     data=data)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=HTTP_TIMEOUT_SECONDS) as response:
            return json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        try:
            answer = json.loads(exc.read() or b"{}")
        except ValueError:
            answer = {}
        if exc.code in answers and isinstance(answer, dict):
            return answer
        raise ReinfError(answer.get("error") or f"reinf serve answered {exc.code} on {path}",
                         fix=answer.get("fix"), status=exc.code) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise Unreachable(f"reinf serve (pid {info['pid']}) holds {config.data_dir} but does "
                          f"not answer at {url}: {reason}",
                          fix="wait until it has started, or stop it") from None


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
