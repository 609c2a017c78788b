"""``reinf service``: run ``reinf serve`` as a background service of the logged-in user.

Linux gets a systemd user unit, ``$XDG_CONFIG_HOME/systemd/user/reinf.service`` (default
``~/.config/systemd/user``); macOS a launchd agent, ``~/Library/LaunchAgents/
dev.reinf.serve.plist``. Both start this very interpreter (``sys.executable``, not
resolved: a virtual environment's ``python`` is a symlink whose location *is* the
environment) with ``-m reinf serve``, with ``REINF_HOME`` (and ``REINF_CONFIG`` when the
config file is not the data directory's own) set, and restart it when it fails.

Nothing here enables or starts the service: ``install`` writes the file and says which
command to run, so the person decides. Paths are passed in (``environ``, ``platform``)
so tests write into a temporary HOME, never the real one.
"""
from __future__ import annotations

import os
import plistlib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

from reinf.errors import BadInput, NotAvailable

UNIT_NAME = "reinf.service"
LAUNCHD_LABEL = "dev.reinf.serve"
RESTART_SECONDS = 5
# SIGTERM makes the server finish the reply in flight and stop the trainer (its grace
# period is 5 s; a round's child gets SIGKILL after that), well within this.
STOP_TIMEOUT_SECONDS = 60
_PLAIN = re.compile(r"[A-Za-z0-9_@+=:,./-]+")


def default_exe_args() -> list[str]:
    return [os.path.abspath(sys.executable), "-m", "reinf", "serve"]


def service_environment(config) -> dict[str, str]:
    env = {"REINF_HOME": str(data_dir(config)), "PYTHONUNBUFFERED": "1"}
    if config.source:
        source = Path(config.source).expanduser().resolve()
        if source != data_dir(config) / "config.yaml":
            env["REINF_CONFIG"] = str(source)
    return env


def data_dir(config) -> Path:
    return Path(config.data_dir).expanduser().resolve()


# --- systemd ---------------------------------------------------------------------------

def quote_systemd(value: str) -> str:
    """One ExecStart argument: ``%`` and ``$`` escaped (specifiers, variables), quoted
    when it holds anything but plain path characters."""
    if "\n" in value or "\r" in value:
        raise BadInput(f"cannot put a line break into a systemd unit: {value!r}")
    value = value.replace("%", "%%").replace("$", "$$")
    if _PLAIN.fullmatch(value.replace("%%", "").replace("$$", "") or "-"):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_systemd_unit(config, exe_args: Sequence[str] | None = None) -> str:
    """The user unit's text. ``exe_args``: the command (default: this interpreter with
    ``-m reinf serve``); its first element must be an absolute path."""
    args = list(exe_args or default_exe_args())
    if not os.path.isabs(args[0]):
        raise BadInput(f"the service command must start with an absolute path, got {args[0]!r}")
    env_lines = []
    for key, value in service_environment(config).items():
        assignment = f"{key}={value}".replace("%", "%%")
        env_lines.append('Environment="' + assignment.replace("\\", "\\\\").replace('"', '\\"')
                         + '"')
    workdir = str(data_dir(config))
    if "\n" in workdir:
        raise BadInput(f"cannot put a line break into a systemd unit: {workdir!r}")
    lines = [
        "# Written by `reinf service install`; `reinf service uninstall` removes it.",
        "[Unit]",
        "Description=Reinf: local assistant that learns from your ratings (web UI, API, "
        "training)",
        "After=network.target",
        # Give up after 5 failed starts in 5 minutes (e.g. another `reinf serve` holds
        # the data directory) instead of restarting forever.
        "StartLimitIntervalSec=300",
        "StartLimitBurst=5",
        "",
        "[Service]",
        "Type=simple",
        "ExecStart=" + " ".join(quote_systemd(a) for a in args),
        "WorkingDirectory=" + workdir.replace("%", "%%"),
        *env_lines,
        "Restart=on-failure",
        f"RestartSec={RESTART_SECONDS}",
        # SIGTERM to the server only: it stops its child trainer itself, in order.
        "KillMode=mixed",
        "KillSignal=SIGTERM",
        f"TimeoutStopSec={STOP_TIMEOUT_SECONDS}",
        "",
        "[Install]",
        "WantedBy=default.target",
    ]
    return "\n".join(lines) + "\n"


def systemd_unit_path(environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CONFIG_HOME") or str(Path(environ.get("HOME") or "~") / ".config")
    return Path(base).expanduser() / "systemd" / "user" / UNIT_NAME


def verify_unit(path: Path) -> dict[str, Any]:
    """``systemd-analyze verify`` on a unit file: {"ok", "output"}; ok None without the
    tool. Tries the user manager first (in a scratch runtime dir when none is set)."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        return {"ok": None, "output": "systemd-analyze is not installed"}
    with tempfile.TemporaryDirectory() as runtime:
        env = dict(os.environ)
        env.setdefault("XDG_RUNTIME_DIR", runtime)
        attempts = ([tool, "--user", "verify", str(path)], [tool, "verify", str(path)])
        for argv in attempts:
            try:
                done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
            except (OSError, subprocess.TimeoutExpired) as exc:
                return {"ok": None, "output": f"systemd-analyze did not run: {exc}"}
            output = (done.stdout + done.stderr).strip()
            if "Failed to initialize manager" in output and argv[1] == "--user":
                continue  # no user manager here (containers): the system one checks syntax
            return {"ok": done.returncode == 0, "output": output}
    return {"ok": None, "output": output}


# --- launchd ---------------------------------------------------------------------------

def render_launchd_plist(config, exe_args: Sequence[str] | None = None) -> str:
    args = list(exe_args or default_exe_args())
    logs = data_dir(config) / "logs"
    plist = {
        "Label": LAUNCHD_LABEL,
        "ProgramArguments": args,
        "EnvironmentVariables": service_environment(config),
        "WorkingDirectory": str(data_dir(config)),
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},   # restart when it fails, not when stopped
        "ThrottleInterval": RESTART_SECONDS * 2,
        "ExitTimeOut": STOP_TIMEOUT_SECONDS,
        "StandardOutPath": str(logs / "launchd.out.log"),
        "StandardErrorPath": str(logs / "launchd.err.log"),
    }
    return plistlib.dumps(plist, sort_keys=False).decode("utf-8")


def launchd_plist_path(environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    home = Path(environ.get("HOME") or "~").expanduser()
    return home / "Library" / "LaunchAgents" / f"{LAUNCHD_LABEL}.plist"


# --- install / uninstall / status ------------------------------------------------------------

def get_manager(platform: str | None = None) -> str:
    platform = platform or sys.platform
    if platform.startswith("linux"):
        return "systemd"
    if platform == "darwin":
        return "launchd"
    raise NotAvailable(f"background services are supported on Linux (systemd) and macOS "
                       f"(launchd), not on {platform}",
                       fix="run `reinf serve` yourself, e.g. from your session's start-up")


def _spec(config, manager: str, environ, exe_args) -> tuple[Path, str]:
    if manager == "systemd":
        return systemd_unit_path(environ), render_systemd_unit(config, exe_args)
    return launchd_plist_path(environ), render_launchd_plist(config, exe_args)


def enable_commands(manager: str, path: Path) -> list[str]:
    if manager == "systemd":
        return ["systemctl --user daemon-reload",
                f"systemctl --user enable --now {UNIT_NAME}"]
    return [f"launchctl bootstrap gui/$(id -u) {path}"]


def disable_commands(manager: str, path: Path) -> list[str]:
    if manager == "systemd":
        return [f"systemctl --user disable --now {UNIT_NAME}"]
    return [f"launchctl bootout gui/$(id -u)/{LAUNCHD_LABEL}"]


def install_service(config, *, platform: str | None = None,
                    environ: Mapping[str, str] | None = None,
                    exe_args: Sequence[str] | None = None) -> dict[str, Any]:
    """Write the unit/plist (replacing an older one); say how to enable it."""
    manager = get_manager(platform)
    path, text = _spec(config, manager, environ, exe_args)
    previous = path.read_text(encoding="utf-8") if path.exists() else None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    (data_dir(config) / "logs").mkdir(parents=True, exist_ok=True)
    return {"manager": manager, "path": str(path), "changed": previous != text,
            "replaced": previous is not None and previous != text,
            "data_dir": str(data_dir(config)), "command": list(exe_args or default_exe_args()),
            "enable": enable_commands(manager, path),
            "note": ("to keep it running after you log out: loginctl enable-linger $USER"
                     if manager == "systemd" else None)}


def uninstall_service(config, *, platform: str | None = None,
                      environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    manager = get_manager(platform)
    path, _ = _spec(config, manager, environ, default_exe_args())
    existed = path.exists()
    if existed:
        path.unlink()
    return {"manager": manager, "path": str(path), "removed": existed,
            "disable_first": disable_commands(manager, path) if existed else [],
            "after": ["systemctl --user daemon-reload"] if existed and manager == "systemd"
            else []}


def service_status(config, *, platform: str | None = None,
                   environ: Mapping[str, str] | None = None,
                   exe_args: Sequence[str] | None = None) -> dict[str, Any]:
    """Installed? Up to date with this installation? What the service manager says."""
    from reinf.daemon.remote import locate_server

    manager = get_manager(platform)
    path, text = _spec(config, manager, environ, exe_args)
    installed = path.exists()
    current = path.read_text(encoding="utf-8") if installed else None
    out = {"manager": manager, "path": str(path), "installed": installed,
           "up_to_date": current == text if installed else None,
           "active": None, "enabled": None, "manager_error": None,
           "daemon": locate_server(config)}
    if installed:
        out.update(_ask_manager(manager))
    return out


# What systemctl prints without a user manager to talk to (a container, su, an SSH session
# without lingering): is-active cannot answer, is-enabled may still read the unit files.
NO_USER_BUS = ("failed to connect to bus", "dbus_session_bus_address", "xdg_runtime_dir",
               "no medium found")
USER_BUS_FIX = ("run it in your own login session (`loginctl enable-linger $USER` keeps "
                "a user manager running)")


def _ask_manager(manager: str) -> dict[str, Any]:
    """What systemctl / launchctl say; None where the tool is missing or cannot answer,
    and then ``manager_error`` says why."""
    if manager == "systemd":
        answers: dict[str, Any] = {"manager_error": None}
        for key, verb in (("active", "is-active"), ("enabled", "is-enabled")):
            done, why = _run(["systemctl", "--user", verb, UNIT_NAME])
            word = done.stdout.strip() if done is not None else ""
            answers[key] = word if word and " " not in word else None
            if answers[key] is None and answers["manager_error"] is None:
                answers["manager_error"] = why or _why_systemd(done)
        return answers
    done, why = _run(["launchctl", "print", f"gui/{os.getuid()}/{LAUNCHD_LABEL}"])
    loaded = None if done is None else done.returncode == 0
    return {"active": "loaded" if loaded else ("not loaded" if loaded is False else None),
            "enabled": None, "manager_error": why}


def _run(argv: list[str]) -> tuple[subprocess.CompletedProcess | None, str | None]:
    """The finished command, or None and why it could not run."""
    if shutil.which(argv[0]) is None:
        return None, f"{argv[0]} is not installed"
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=5), None
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{argv[0]} did not answer: {exc}"


def _why_systemd(done: subprocess.CompletedProcess | None) -> str | None:
    """Why systemctl gave no state: its first line of stderr, named when it is the usual
    case of no user session."""
    said = (done.stderr or "").strip().splitlines() if done is not None else []
    if not said:
        return None
    if any(mark in said[0].lower() for mark in NO_USER_BUS):
        return (f"systemd user session not available (no D-Bus user bus): {said[0]}; "
                + USER_BUS_FIX)
    return f"systemctl: {said[0]}"
