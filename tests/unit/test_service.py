"""Service files: exact content, quoting, install/uninstall/status into a temporary HOME."""
from __future__ import annotations

import json
import os
import plistlib
import shutil
import sys

import pytest

from reinf.config import load_config
from reinf.daemon.service import (install_service, quote_systemd, render_launchd_plist,
                                  render_systemd_unit, service_status, uninstall_service,
                                  verify_unit)
from reinf.errors import BadInput, NotAvailable


@pytest.fixture
def fake_home(tmp_path, monkeypatch):
    """HOME and XDG_CONFIG_HOME in tmp: nothing is ever written to the real ones."""
    home = tmp_path / "user home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    return home


@pytest.fixture
def spaced(tmp_path):
    data = tmp_path / "my data %h"
    return load_config(environ={"REINF_HOME": str(data)})


def test_systemd_unit_content_is_exact(config):
    exe = os.path.abspath(sys.executable)
    unit = render_systemd_unit(config)
    assert unit == "\n".join([
        "# Written by `reinf service install`; `reinf service uninstall` removes it.",
        "[Unit]",
        "Description=Reinf: local assistant that learns from your ratings (web UI, API, "
        "training)",
        "After=network.target",
        "StartLimitIntervalSec=300",
        "StartLimitBurst=5",
        "",
        "[Service]",
        "Type=simple",
        f"ExecStart={quote_systemd(exe)} -m reinf serve",
        f"WorkingDirectory={config.data_dir}",
        f'Environment="REINF_HOME={config.data_dir}"',
        'Environment="PYTHONUNBUFFERED=1"',
        "Restart=on-failure",
        "RestartSec=5",
        "KillMode=mixed",
        "KillSignal=SIGTERM",
        "TimeoutStopSec=60",
        "",
        "[Install]",
        "WantedBy=default.target",
        ""])


def test_exec_start_is_this_interpreter_unresolved(config, tmp_path):
    # A venv's python is a symlink; resolving it would start the system Python without
    # the environment's packages.
    venv_python = tmp_path / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.symlink_to(sys.executable)
    unit = render_systemd_unit(config, [str(venv_python), "-m", "reinf", "serve"])
    assert f"ExecStart={venv_python} -m reinf serve\n" in unit
    with pytest.raises(BadInput, match="absolute path"):
        render_systemd_unit(config, ["python", "-m", "reinf", "serve"])


def test_paths_with_spaces_percent_and_dollar_are_quoted(spaced):
    unit = render_systemd_unit(spaced, ["/opt/my tools/py$3", "-m", "reinf", "serve"])
    data = str(spaced.data_dir).replace("%", "%%")
    assert 'ExecStart="/opt/my tools/py$$3" -m reinf serve\n' in unit
    assert f'Environment="REINF_HOME={data}"\n' in unit
    assert f"WorkingDirectory={data}\n" in unit
    assert quote_systemd('a"b\\c') == '"a\\"b\\\\c"'
    assert quote_systemd("/plain/path-1.2") == "/plain/path-1.2"
    with pytest.raises(BadInput):
        quote_systemd("two\nlines")


def test_a_config_file_outside_the_data_dir_is_passed_on(tmp_path):
    cfg_file = tmp_path / "elsewhere.yaml"
    cfg_file.write_text("schedule:\n  train_after_ratings: 4\n")
    cfg = load_config(cfg_file, environ={"REINF_HOME": str(tmp_path / "data")})
    assert f'Environment="REINF_CONFIG={cfg_file}"\n' in render_systemd_unit(cfg)
    plist = plistlib.loads(render_launchd_plist(cfg).encode())
    assert plist["EnvironmentVariables"]["REINF_CONFIG"] == str(cfg_file)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze is not installed (the content test still runs)")
def test_systemd_analyze_accepts_the_unit(spaced, fake_home):
    spaced.data_dir.mkdir(parents=True)
    written = install_service(spaced, platform="linux")
    result = verify_unit(written["path"])
    assert result["ok"] is True, result["output"]
    bad = fake_home / "bad.service"
    bad.write_text(render_systemd_unit(spaced, ["/nonexistent/python", "-m", "reinf"]))
    assert verify_unit(bad)["ok"] is False


def test_launchd_plist(spaced):
    plist = plistlib.loads(render_launchd_plist(spaced).encode())
    assert plist["Label"] == "dev.reinf.serve"
    assert plist["ProgramArguments"] == [os.path.abspath(sys.executable), "-m", "reinf", "serve"]
    assert plist["EnvironmentVariables"]["REINF_HOME"] == str(spaced.data_dir)
    assert plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["RunAtLoad"] is True
    assert plist["StandardErrorPath"] == str(spaced.data_dir / "logs" / "launchd.err.log")


def test_install_status_uninstall_systemd(config, fake_home):
    path = fake_home / ".config" / "systemd" / "user" / "reinf.service"
    assert service_status(config, platform="linux")["installed"] is False
    first = install_service(config, platform="linux")
    assert first["path"] == str(path) and path.read_text() == render_systemd_unit(config)
    assert first["changed"] is True and first["replaced"] is False
    assert first["enable"] == ["systemctl --user daemon-reload",
                               "systemctl --user enable --now reinf.service"]
    again = install_service(config, platform="linux")
    assert again["changed"] is False
    status = service_status(config, platform="linux")
    assert status["installed"] is True and status["up_to_date"] is True
    assert status["daemon"]["running"] is False
    path.write_text(path.read_text().replace("RestartSec=5", "RestartSec=1"))
    assert service_status(config, platform="linux")["up_to_date"] is False
    assert install_service(config, platform="linux")["replaced"] is True
    gone = uninstall_service(config, platform="linux")
    assert gone["removed"] is True and not path.exists()
    assert gone["disable_first"] == ["systemctl --user disable --now reinf.service"]
    assert uninstall_service(config, platform="linux")["removed"] is False


def test_install_launchd_into_library(config, fake_home):
    out = install_service(config, platform="darwin")
    path = fake_home / "Library" / "LaunchAgents" / "dev.reinf.serve.plist"
    assert out["path"] == str(path) and path.exists()
    assert out["enable"] == [f"launchctl bootstrap gui/$(id -u) {path}"]
    assert uninstall_service(config, platform="darwin")["removed"] is True


def test_other_platforms_are_refused(config, fake_home):
    with pytest.raises(NotAvailable, match="Linux .systemd. and macOS"):
        install_service(config, platform="win32")


def test_cli_install_status_uninstall(invoke, fake_home):
    if not sys.platform.startswith(("linux", "darwin")):
        pytest.skip("service files exist for Linux and macOS only")
    out = invoke("service", "install")
    assert out.exit_code == 0
    assert "enable --now reinf.service" in out.output or "launchctl bootstrap" in out.output
    status = json.loads(invoke("service", "status", "--json").output)
    assert status["installed"] is True and status["up_to_date"] is True
    assert status["path"].startswith(str(fake_home))
    removed = json.loads(invoke("service", "uninstall", "--json").output)
    assert removed["removed"] is True
    assert "not installed" in invoke("service", "status").output


def fake_systemctl(tmp_path, monkeypatch, script: str) -> None:
    """A ``systemctl`` first on PATH: a shell script standing in for the real one."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "systemctl"
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_status_without_a_user_bus_says_why(invoke, config, fake_home, tmp_path, monkeypatch):
    """As systemctl answers in a container or an SSH session without lingering: is-active
    cannot reach the user manager, is-enabled still reads the unit files."""
    if not sys.platform.startswith("linux"):
        pytest.skip("systemd is Linux's")
    fake_systemctl(tmp_path, monkeypatch, 'if [ "$2" = is-enabled ]; then echo disabled; '
                   'exit 1; fi\necho "Failed to connect to bus: No medium found" >&2\nexit 1\n')
    install_service(config, platform="linux")
    status = service_status(config, platform="linux")
    assert (status["active"], status["enabled"]) == (None, "disabled")
    assert status["manager_error"].startswith(
        "systemd user session not available (no D-Bus user bus): Failed to connect to bus: "
        "No medium found; ")
    out = invoke("service", "status").output
    assert "systemd:    active unknown, enabled disabled\n" in out
    assert "            systemd user session not available (no D-Bus user bus)" in out
    assert "loginctl enable-linger" in out


def test_status_with_a_user_bus_has_no_error(config, fake_home, tmp_path, monkeypatch):
    fake_systemctl(tmp_path, monkeypatch, 'case "$2" in is-active) echo inactive; exit 3;; '
                   'is-enabled) echo enabled;; esac\n')
    install_service(config, platform="linux")
    status = service_status(config, platform="linux")
    assert (status["active"], status["enabled"], status["manager_error"]) == (
        "inactive", "enabled", None)
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert service_status(config, platform="linux")["manager_error"] == (
        "systemctl is not installed")
