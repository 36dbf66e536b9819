"""`edgemon run` stopped (SIGSTOP, as a VM pause) and continued while a device keeps
reporting: what queued up meanwhile is applied before the timers that came due during the
stall (docs/reliability.md, "A stalled daemon")."""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING

import pytest

from processes import edgemon_process, poll, samples

if TYPE_CHECKING:
    from pathlib import Path

    from brokers import Broker

pytestmark = pytest.mark.integration

DEVICE = "stalled"
STALL_S = 4.0
CONFIG = "[slack]\nstream_idle_timeout_ms = 2000\n"


def total(port: int, name: str, **labels: str) -> float:
    """The sum of `name` over the series whose labels include `labels`."""
    return sum(
        value
        for key, value in samples(port, name).items()
        if all((k, v) in key for k, v in labels.items())
    )


def test_a_stall_applies_what_queued_before_the_timers_it_delayed(
    mosquitto_broker: Broker, tmp_path: Path
) -> None:
    """A stream reports 300 ms chunks every 100 ms; edgemon is stopped for 4 s (twice the
    2 s idle timeout after the audio it had runs out) while the stream goes on and ends with
    a final chunk. Continued, edgemon applies the queued chunks first: the stream completes,
    nothing expires, no chunk is a duplicate, every chunk is counted."""
    broker = mosquitto_broker
    with (
        edgemon_process(broker, tmp_path, config=CONFIG) as edgemon,
        broker.reporter(DEVICE, "stalled-reporter") as reporter,
    ):
        http = edgemon.http_port
        reporter.start("s")
        sent = 0
        for _ in range(3):
            reporter.chunk("s", audio_ms=300, eta_ms=100)
            sent += 1
            time.sleep(0.1)
        assert poll(lambda: total(http, "edgemon_chunks_total", device=DEVICE) == sent)
        os.kill(edgemon.process.pid, signal.SIGSTOP)
        try:
            stopped = time.monotonic()
            while time.monotonic() - stopped < STALL_S:
                reporter.chunk("s", audio_ms=300, eta_ms=100)
                sent += 1
                time.sleep(0.1)
            reporter.chunk("s", audio_ms=300, final=True)
            sent += 1
            assert reporter.flush(15)
        finally:
            os.kill(edgemon.process.pid, signal.SIGCONT)
        assert poll(lambda: total(http, "edgemon_streams_finished_total", device=DEVICE) == 1)
        finished = {
            dict(key)["reason"]: value
            for key, value in samples(http, "edgemon_streams_finished_total").items()
            if value
        }
        messages = samples(http, "edgemon_messages_total")
        results = {dict(key)["result"]: value for key, value in messages.items() if value}
        assert finished == {"completed": 1}
        assert "duplicate" not in results, results
        assert total(http, "edgemon_chunks_total", device=DEVICE) == sent
