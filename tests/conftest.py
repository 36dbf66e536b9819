"""Shared fixtures. Each one is self-contained and says what it provides."""

from __future__ import annotations

import os
import subprocess
import time
from typing import TYPE_CHECKING

import pytest
import structlog
from structlog.testing import capture_logs

from ports import (
    MOSQUITTO,
    MOSQUITTO_START_S,
    MosquittoServer,
    Servers,
    accepts,
    end_process,
    free_port,
)

if TYPE_CHECKING:
    from collections.abc import Iterator, MutableMapping
    from pathlib import Path
    from typing import Any

    from structlog.typing import EventDict, WrappedLogger


# ------------------------------------------------------------------ logs and environment
def _monotonic_s(_logger: WrappedLogger, _method: str, line: EventDict) -> EventDict:
    line["monotonic_s"] = time.monotonic()
    return line


@pytest.fixture
def captured_logs() -> Iterator[list[MutableMapping[str, Any]]]:
    """Every line logged through structlog during the test, as a dict: `event`, `log_level`,
    `monotonic_s` (when, by `time.monotonic()`) and the fields (`daemons.logged()` picks them
    out). Loggers must be made (`structlog.get_logger()`, a `Daemon`) inside the test. Every
    level is captured: structlog's configuration is reset first (an in-process `edgemon demo`
    sets its own), and again after the test."""
    structlog.reset_defaults()
    try:
        with capture_logs(processors=[_monotonic_s]) as logs:
            yield logs
    finally:
        structlog.reset_defaults()


@pytest.fixture(autouse=True)
def own_xdg_state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A daemon started by a test without a state directory falls back to
    `$XDG_STATE_HOME/edgemon` (docs/reliability.md): each test gets its own, never the user's."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))


# ------------------------------------------------------------------ mosquitto_broker
_MOSQUITTO_TRIES = 3


@pytest.fixture
def mosquitto_broker(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A fresh Mosquitto on 127.0.0.1 and a free port: `(host, port)`.

    Anonymous, no persistence, so no retained message survives the test. Skips the test when
    Mosquitto is not installed; its log is in `tmp_path / "mosquitto.log"`.
    """
    if not os.access(MOSQUITTO, os.X_OK):
        pytest.skip("mosquitto is not installed")
    log = tmp_path / "mosquitto.log"
    for _ in range(_MOSQUITTO_TRIES):
        port = free_port()
        conf = tmp_path / "mosquitto.conf"
        conf.write_text(
            f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
            "log_dest stderr\n",
            encoding="utf-8",
        )
        with log.open("ab") as log_file:
            process = subprocess.Popen(
                [MOSQUITTO, "-c", str(conf)],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
            )
        deadline = time.monotonic() + MOSQUITTO_START_S
        while process.poll() is None and time.monotonic() < deadline:
            if accepts(port):
                break
            time.sleep(0.02)
        else:
            process.kill()
            process.wait()
            continue  # exited (port taken meanwhile?) or never listened: try another port
        try:
            yield "127.0.0.1", port
        finally:
            end_process(process)
        return
    text = log.read_text(encoding="utf-8") if log.exists() else "(no log)"
    pytest.fail(f"mosquitto did not start; its log:\n{text}")


# ------------------------------------------------------------------ mosquitto_server
@pytest.fixture
def mosquitto_server(tmp_path: Path) -> Iterator[MosquittoServer]:
    """A running Mosquitto (anonymous, no persistence) that the test may stop and restart."""
    if not os.access(MOSQUITTO, os.X_OK):
        pytest.skip("mosquitto is not installed")
    server = MosquittoServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


# ------------------------------------------------------------------ servers
@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    """A group of named processes the test starts (`servers.spawn(name, *argv)`), logging to
    `tmp_path / "<name>.log"`, all ended when the test ends. `NOTIFY_SOCKET` and `WATCHDOG_*`
    are left out of their environment (no child talks to a service manager it does not have)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_", "WATCHDOG_"))}
    group = Servers(tmp_path, env)
    try:
        yield group
    finally:
        group.stop_all()
