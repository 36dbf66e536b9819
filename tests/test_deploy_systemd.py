"""The shipped systemd unit and install script (`deploy/systemd/`, `deploy/install.sh`).

`systemd-analyze` checks the unit as systemd reads it; the unit's timings are checked against
the daemon's own constants; the install script is linted and dry-run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgemon.daemon.app import SHUTDOWN_TIMEOUT_S, STATUS_EVERY_S
from edgemon.daemon.systemd import Notifier
from edgemon.settings import DEFAULT_CONFIG_PATH, StateSettings

from tools import require_tool

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
UNIT = DEPLOY / "systemd" / "edgemon.service"
INSTALL = DEPLOY / "install.sh"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
MAX_EXPOSURE = 2.0

_SPAN = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|sec|min|m|h)?")
_SECONDS = {"ms": 0.001, "s": 1.0, "sec": 1.0, None: 1.0, "min": 60.0, "m": 60.0, "h": 3600.0}


def _unit(text: str) -> dict[str, list[str]]:
    """`Section.Key` → its values in order (systemd keys may repeat)."""
    settings: dict[str, list[str]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        settings.setdefault(f"{section}.{key}", []).append(value)
    return settings


def _seconds(span: str) -> float:
    """A systemd time span such as `10s`, `1min 30s` or `500ms`, in seconds."""
    parts = _SPAN.findall(span)
    assert parts, f"not a time span: {span!r}"
    assert _SPAN.sub("", span).strip() == "", f"unsupported time span: {span!r}"
    return sum(float(number) * _SECONDS[unit or None] for number, unit in parts)


def _one(settings: dict[str, list[str]], key: str) -> str:
    values = settings.get(key, [])
    assert len(values) == 1, f"{key}: {values}"
    return values[0]


def _runnable_unit(directory: Path) -> Path:
    """The unit with ExecStart pointing at this environment's `edgemon`, for verify."""
    edgemon = Path(sys.executable).parent / "edgemon"
    if not os.access(edgemon, os.X_OK):
        pytest.skip(f"no edgemon console script next to {sys.executable}")
    text = UNIT.read_text()
    shipped = "ExecStart=/opt/edgemon/venv/bin/edgemon "
    assert shipped in text
    path = directory / "edgemon.service"
    path.write_text(text.replace(shipped, f"ExecStart={edgemon} "))
    return path


def _analyze(*args: str) -> subprocess.CompletedProcess[str]:
    if SYSTEMD_ANALYZE is None:
        pytest.skip("systemd-analyze is not installed")
    return subprocess.run(
        [SYSTEMD_ANALYZE, *args], capture_output=True, text=True, timeout=60, check=False
    )


def _complaints(result: subprocess.CompletedProcess[str], unit: Path) -> list[str]:
    """Lines of `verify` output about our unit (verify exits 0 even on unknown keys)."""
    output = (result.stdout + result.stderr).splitlines()
    return [line for line in output if unit.name in line or str(unit) in line]


# ------------------------------------------------------------------ the real tool
@pytest.mark.integration  # starts a process
def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    """`systemd-analyze verify` loads the unit without a single complaint about it."""
    unit = _runnable_unit(tmp_path)
    result = _analyze("verify", "--man=no", str(unit))
    assert _complaints(result, unit) == []
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.integration  # starts a process
def test_verify_check_catches_a_broken_unit(tmp_path: Path) -> None:
    """The verify check is not vacuous: a typo in the unit is reported and caught."""
    unit = _runnable_unit(tmp_path)
    unit.write_text(unit.read_text().replace("Restart=on-failure", "Restart=sometimes"))
    assert _complaints(_analyze("verify", "--man=no", str(unit)), unit)


#: Every unit edgemon ships (edgemon's own, and the fleet's vmalert).
SHIPPED_UNITS = sorted(DEPLOY.rglob("*.service"))


def test_every_shipped_unit_is_rated() -> None:
    """The exposure test below covers every unit under deploy/, both known ones included."""
    names = {unit.name for unit in SHIPPED_UNITS}
    assert {"edgemon.service", "vmalert.service"} <= names


@pytest.mark.integration  # starts a process
@pytest.mark.parametrize("shipped", SHIPPED_UNITS, ids=lambda unit: unit.name)
def test_security_exposure_is_at_most_2(shipped: Path, tmp_path: Path) -> None:
    """`systemd-analyze security --offline=yes` rates each shipped unit's exposure 2.0 or
    lower (vmalert's was 3.7 before its sandbox matched edgemon's)."""
    if shipped == UNIT:
        unit = _runnable_unit(tmp_path)
    else:
        unit = tmp_path / shipped.name
        unit.write_text(shipped.read_text(encoding="utf-8"), encoding="utf-8")
    result = _analyze("security", "--offline=yes", "--no-pager", str(unit))
    if "--offline" in result.stderr and "unrecognized" in result.stderr:
        pytest.skip("this systemd-analyze has no --offline (systemd < 250)")
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE, result.stdout


# ------------------------------------------------------------------ unit ↔ daemon
def test_stop_timeout_leaves_room_for_the_clean_shutdown() -> None:
    """systemd waits at least twice the daemon's own shutdown timeout before SIGKILL."""
    settings = _unit(UNIT.read_text())
    assert _seconds(_one(settings, "Service.TimeoutStopSec")) >= 2 * SHUTDOWN_TIMEOUT_S


def test_watchdog_is_pinged_at_least_twice_per_period() -> None:
    """With the unit's WatchdogSec the daemon pings at most every half period (one may slip)."""
    watchdog_s = _seconds(_one(_unit(UNIT.read_text()), "Service.WatchdogSec"))
    environ = {"NOTIFY_SOCKET": "@edgemon-test", "WATCHDOG_USEC": str(int(watchdog_s * 1e6))}
    interval = Notifier(environ).watchdog_interval_s
    assert interval is not None
    period = min(interval, STATUS_EVERY_S)  # what Daemon._watchdog sleeps between pings
    assert 2 * period <= watchdog_s
    assert watchdog_s >= 5, "shorter periods kill the daemon on an ordinary hiccup"


def test_unit_runs_the_daemon_the_way_it_expects() -> None:
    """notify protocol, SIGHUP reload, default config path and state dir, sd_notify socket."""
    settings = _unit(UNIT.read_text())
    assert _one(settings, "Service.Type") == "notify"
    assert _one(settings, "Service.NotifyAccess") == "main"
    assert _one(settings, "Service.Restart") == "on-failure"
    assert _one(settings, "Service.ExecReload") == "/bin/kill -HUP $MAINPID"
    exec_start = _one(settings, "Service.ExecStart").split()
    assert exec_start[1:] == ["run", "--config", str(DEFAULT_CONFIG_PATH)]
    config_dir = _one(settings, "Service.ConfigurationDirectory")
    assert DEFAULT_CONFIG_PATH.parent == Path("/etc") / config_dir
    state_dir = _one(settings, "Service.StateDirectory")
    assert StateSettings().dir == Path("/var/lib") / state_dir
    assert "AF_UNIX" in _one(settings, "Service.RestrictAddressFamilies").split()  # sd_notify
    assert _one(settings, "Service.CapabilityBoundingSet") == ""
    # libffi (ctypes, cffi) needs writable+executable memory for callbacks.
    assert "Service.MemoryDenyWriteExecute" not in settings


# ------------------------------------------------------------------ install.sh
@pytest.mark.integration  # starts a process
def test_install_script_passes_shellcheck() -> None:
    """shellcheck finds nothing in install.sh."""
    shellcheck = require_tool("shellcheck")
    result = subprocess.run(
        [shellcheck, str(INSTALL)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout


def _recording_shims(directory: Path, log: Path, python: str) -> dict[str, str]:
    """PATH shims for every command the script may change the box with, logging each call.

    `systemctl is-active` answers "inactive"; the Python shim runs the real one for the
    script's `-c` checks only.
    """
    directory.mkdir()
    for name in ("useradd", "install", "runuser", "systemctl"):
        shim = directory / name
        shim.write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\nexit 3\n')
        shim.chmod(0o755)
    shim = directory / "python3"
    shim.write_text(
        f'#!/bin/sh\n[ "$1" = -c ] && exec {python} "$@"\necho "python3 $*" >> {log}\nexit 3\n'
    )
    shim.chmod(0o755)
    return {**os.environ, "PATH": f"{directory}:{os.environ['PATH']}"}


@pytest.mark.integration  # starts a process
def test_install_dry_run_prints_the_plan_and_changes_nothing(tmp_path: Path) -> None:
    """--dry-run prints the venv, pip, config, unit and systemctl steps and runs none of them."""
    python = "/usr/bin/python3"
    probe = [python, "-c", "import ensurepip, sys; sys.exit(sys.version_info < (3, 11))"]
    if not os.access(python, os.X_OK) or subprocess.run(probe, check=False).returncode:
        pytest.skip("needs a system Python 3.11+ with venv at /usr/bin/python3")
    log = tmp_path / "calls.log"
    environ = _recording_shims(tmp_path / "bin", log, python)
    wheel = tmp_path / "edgemon-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    shim_python = str(tmp_path / "bin" / "python3")
    result = subprocess.run(
        ["bash", str(INSTALL), "--dry-run", "--python", shim_python, str(wheel)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=environ,
    )
    assert result.returncode == 0, result.stderr
    calls = log.read_text().splitlines() if log.exists() else []
    assert calls == ["systemctl is-active --quiet edgemon.service"]
    plan = [line for line in result.stdout.splitlines() if line.startswith("+ ")]
    expected = [
        f"/opt/edgemon/venv/bin/pip install --quiet --disable-pip-version-check --upgrade {wheel}",
        "edgemon check-config /etc/edgemon/edgemon.toml",
        "systemctl daemon-reload",
        "systemctl enable --now edgemon.service",
    ]
    for step in expected:
        assert any(step in line for line in plan), (step, plan)


@pytest.mark.integration  # starts a process
def test_install_refuses_a_bad_source(tmp_path: Path) -> None:
    """A source that is neither a wheel nor a project directory is a usage error (exit 2)."""
    result = subprocess.run(
        ["bash", str(INSTALL), "--dry-run", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "neither a wheel" in result.stderr
