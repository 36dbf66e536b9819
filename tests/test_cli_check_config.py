"""`edgemon check-config` run as a real process: effective settings, masking, every problem."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

#: Every test here runs `python -m edgemon ...` or another program as a process.
pytestmark = pytest.mark.integration


EXAMPLE = Path(__file__).parent.parent / "deploy" / "edgemon.toml"
SECRET = "pa55-word-from-file"


def check_config(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `python -m edgemon check-config ARGS` with no EDGEMON_ variables but those in `env`."""
    clean = {name: value for name, value in os.environ.items() if not name.startswith("EDGEMON_")}
    return subprocess.run(
        [sys.executable, "-m", "edgemon", "check-config", *args],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env={**clean, "PYTHONIOENCODING": "utf-8", **(env or {})},
        check=False,
        timeout=60,
    )


def good_config(directory: Path) -> Path:
    """A valid config whose MQTT password is in an owner-only file beside it."""
    password_file = directory / "mqtt-password"
    password_file.write_text(SECRET + "\n", encoding="utf-8")
    password_file.chmod(0o600)
    path = directory / "edgemon.toml"
    path.write_text(
        '[mqtt]\nurl = "mqtt://broker.lan"\nusername = "edge"\npassword_file = "mqtt-password"\n'
        '[slack]\ndefault_margin_ms = 90\n[devices."cam.1"]\nplayer = "rebuffer"\n',
        encoding="utf-8",
    )
    path.chmod(0o644)
    return path


def test_good_file_prints_effective_settings(tmp_path: Path) -> None:
    """A valid file exits 0 and prints its settings as TOML, the password file never read out."""
    path = good_config(tmp_path)
    path.chmod(0o640)  # readable by others would (rightly) be warned about
    result = check_config(str(path))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert 'url = "mqtt://broker.lan"' in result.stdout
    assert 'username = "edge"' in result.stdout
    assert f'password_file = "{tmp_path / "mqtt-password"}"' in result.stdout
    assert "default_margin_ms = 90.0" in result.stdout
    assert '[devices."cam.1"]' in result.stdout
    assert SECRET not in result.stdout + result.stderr
    shown = tomllib.loads(result.stdout)  # what it prints is TOML
    assert shown["slack"]["player"] == "conceal"


def test_json_output_masks_environment_secrets(tmp_path: Path) -> None:
    """--json prints the settings as JSON; a password from the environment shows as ***."""
    env = {"EDGEMON_MQTT__PASSWORD": "env-secret-value", "EDGEMON_SLACK__MIN_ON_MS": "300"}
    result = check_config(str(good_config(tmp_path)), "--json", env=env)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["mqtt"]["password"] == "***"
    assert data["slack"]["min_on_ms"] == 300
    assert data["devices"] == {"cam.1": {"margin_ms": None, "player": "rebuffer"}}
    assert "env-secret-value" not in result.stdout + result.stderr
    assert SECRET not in result.stdout + result.stderr


def test_bad_file_lists_every_problem(tmp_path: Path) -> None:
    """A bad file exits 2 with a count line then each problem on its own line; no traceback."""
    path = tmp_path / "bad.toml"
    path.write_text(
        '[mqtt]\npassword = "hunter2"\nqos = 5\n[slack]\ndefault_margin_ms = -5\n'
        '[limits]\nmax_devices = 0\n[devices."no spaces"]\nmargin_ms = 1\n[extra]\n',
        encoding="utf-8",
    )
    result = check_config(str(path))
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"edgemon check-config: 6 problems in {path}",
        (
            "  mqtt.password: secrets are not read from the config file; name a file in "
            "mqtt.password_file or set EDGEMON_MQTT__PASSWORD"
        ),
        "  mqtt.qos: must be 0 or 1 (got 5)",
        "  slack.default_margin_ms: must be ≥ 0 (got -5)",
        "  limits.max_devices: must be ≥ 1 (got 0)",
        '  devices."no spaces": invalid device id, must match ^[A-Za-z0-9._-]{1,64}$',
        "  extra: unknown section",
    ]
    assert "hunter2" not in result.stderr
    assert "Traceback" not in result.stderr


def test_syntax_error_and_missing_file_exit_2(tmp_path: Path) -> None:
    """A file that is not TOML, or that does not exist, is one problem and exit code 2."""
    path = tmp_path / "broken.toml"
    path.write_text("[slack\n", encoding="utf-8")
    result = check_config(str(path))
    assert result.returncode == 2
    assert result.stderr.splitlines()[0] == f"edgemon check-config: 1 problem in {path}"
    assert "line 1" in result.stderr
    missing = tmp_path / "missing.toml"
    result = check_config(str(missing))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"edgemon check-config: 1 problem in {missing}",
        f"  {missing}: no such file",
    ]
    assert "Traceback" not in result.stderr


def test_loose_permissions_are_warned_about(tmp_path: Path) -> None:
    """A password file others can read is still valid (exit 0) but warned about on stderr."""
    path = good_config(tmp_path)
    (tmp_path / "mqtt-password").chmod(0o644)
    result = check_config(str(path))
    assert result.returncode == 0
    assert result.stderr.startswith("edgemon check-config: warning: mqtt.password_file: ")
    assert "readable by group or others (mode 0644)" in result.stderr


def test_example_config_is_accepted() -> None:
    """The example deploy/edgemon.toml passes check-config."""
    result = check_config(str(EXAMPLE))
    assert result.returncode == 0, result.stderr
    assert "[devices.example-speaker-01]" in result.stdout
