"""How the gate says that its broker cannot be reached: one WARNING naming the broker, however
many attempts fail, `wait_connected` False meanwhile and True once a broker is there."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import pytest

from edgemon.client import ThrottleGate

from ports import MosquittoServer

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.integration


def test_an_unreachable_broker_is_said_once_by_the_gate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The gate's first failed attempt is a WARNING naming the broker; the next ones are debug
    lines; when the broker comes, `wait_connected` says True and the gate is connected."""
    caplog.set_level(logging.DEBUG, logger="edgemon.client")
    server = MosquittoServer(tmp_path)
    gate = ThrottleGate(server.url, "dev1").open()
    try:
        assert not gate.wait_connected(2.5)
        deadline = time.monotonic() + 30
        while sum("failed again" in r.message for r in caplog.records) < 1:
            assert time.monotonic() < deadline, [r.message for r in caplog.records]
            time.sleep(0.05)
        server.start()
        assert gate.wait_connected(30)
    finally:
        gate.close()
        server.stop()
    warnings = [r.message for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert f"{server.host}:{server.port}" in warnings[0]
