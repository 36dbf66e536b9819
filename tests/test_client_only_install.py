"""A client-only install (what a player or a vLLM environment gets from `pip install paho-mqtt
&& pip install --no-deps edgemon`): a fresh virtual environment holding paho-mqtt and edgemon's
package and nothing else. The client works there; a bare `edgemon` says in one line that the
daemon's dependencies are missing. Also: `edgemon run --broker` blames the flag."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

import paho.mqtt
import pytest

ROOT = Path(__file__).resolve().parent.parent


def client_only_python(directory: Path) -> Path:
    """The Python of a new virtual environment with only paho-mqtt and edgemon's package."""
    venv.create(directory, with_pip=False)
    (site,) = directory.glob("lib/python*/site-packages")
    shutil.copytree(Path(paho.mqtt.__file__).resolve().parents[1], site / "paho")
    (site / "edgemon.pth").write_text(f"{ROOT}\n", encoding="utf-8")
    return directory / "bin" / "python"


@pytest.mark.integration  # builds a venv, starts processes
def test_client_only_install(tmp_path: Path) -> None:
    """With only paho-mqtt beside it, `edgemon.client` imports and builds a Reporter and a gate
    (the wire contract module is standard library only), and `python -m edgemon` prints one
    line naming the missing dependency, no traceback, exit code 2."""
    python = client_only_python(tmp_path / "env")
    client = subprocess.run(
        [python, "-c", ("from edgemon.client import Reporter, ThrottleGate\n"
         "Reporter('mqtt://127.0.0.1:1', 'd'); ThrottleGate('mqtt://127.0.0.1:1', 'd')\n"
         "print('ok')")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (client.returncode, client.stdout, client.stderr) == (0, "ok\n", "")
    bare = subprocess.run(
        [python, "-m", "edgemon", "run"], capture_output=True, text=True, timeout=60, check=False
    )
    assert bare.returncode == 2
    assert bare.stdout == ""
    assert "Traceback" not in bare.stderr
    assert len(bare.stderr.splitlines()) == 1
    assert "the daemon's dependencies are missing" in bare.stderr


@pytest.mark.integration  # starts a process
def test_run_blames_a_bad_broker_flag_not_the_config_file(tmp_path: Path) -> None:
    """`edgemon run --broker tcp://…` with a valid config file: one line on stderr that names
    `--broker` and its value, not the config file; exit code 2."""
    config = tmp_path / "edgemon.toml"
    config.write_text('[mqtt]\nurl = "mqtt://127.0.0.1:1883"\n', encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "edgemon", "run", "--config", str(config),
         "--broker", "tcp://broker:1883"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.startswith("edgemon run: --broker tcp://broker:1883: must be mqtt://")
    assert str(config) not in result.stderr
    assert len(result.stderr.splitlines()) == 1
