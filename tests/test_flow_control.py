"""Flow control, not shedding (docs/reliability.md): a QoS 1 flood through a real
Mosquitto whose queue for edgemon is unbounded (`max_queued_messages 0`), so the only thing
between the publisher and the engine is edgemon itself. Nothing the broker delivered may be
dropped: edgemon reads the socket only as fast as it applies (TCP backpressure)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from edgemon.daemon import Daemon
from edgemon.settings import StateSettings

from clients import scrape, settings_for
from daemons import running
from flood_publisher import SCRIPT as FLOOD
from ports import MosquittoServer
from scrapes import sample

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

#: Far more than a bounded incoming queue of 4096 messages holds (one would shed thousands
#: here, and count the next chunk of each affected stream as a gap).
MESSAGES = 20_000
STREAMS = 1_000
DEVICES = 10


@pytest.fixture
def unbounded_mosquitto(tmp_path: Path) -> Iterator[MosquittoServer]:
    """A Mosquitto that queues without limit for each client."""
    server = MosquittoServer(tmp_path, options="max_queued_messages 0\n")
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def test_a_qos1_flood_is_applied_whole_nothing_shed(
    unbounded_mosquitto: MosquittoServer, tmp_path: Path
) -> None:
    """20,000 QoS 1 single-chunk messages over 1,000 streams, published as fast as paho can
    against an unbounded broker queue: edgemon applies every one of them — `accepted` and
    `edgemon_chunks_total` are exactly 20,000, no `overloaded`, no `gap` — with the
    write-ahead log on (so each acknowledgement also waited for its group commit), whose
    metrics show fewer commits than messages and the bytes appended (a counter: the log's
    size now may have been pruned by a snapshot meanwhile)."""
    port = unbounded_mosquitto.port
    # Snapshots every 0.2 s: the log is pruned while the flood goes on and after it, so what
    # it holds at the end says nothing about what was logged.
    state = StateSettings(dir=tmp_path / "state", snapshot_interval_s=0.2)
    settings = settings_for(unbounded_mosquitto.broker, "edgemon-flow", state=state)
    daemon = Daemon(settings, environ={}, install_signal_handlers=False)
    async with running(daemon):
        publisher = await asyncio.create_subprocess_exec(
            sys.executable, FLOOD, str(port), "count", str(MESSAGES), str(STREAMS),
            str(DEVICES), "flow-publisher", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        async with asyncio.timeout(120):
            out, err = await publisher.communicate()
            assert publisher.returncode == 0, err.decode()
            assert json.loads(out)["acked"] == MESSAGES
            while daemon.monitor.messages < MESSAGES:  # noqa: ASYNC110 - polling a counter
                await asyncio.sleep(0.05)
        assert daemon.http_port is not None
        async with asyncio.timeout(60):
            while True:  # a snapshot after the last message covers the whole log
                _, text = await scrape(daemon.http_port, "/metrics")
                if sample(text, "edgemon_wal_bytes", {}) == 0:
                    break
                await asyncio.sleep(0.05)
        print(f"\nflow control: {MESSAGES} messages, results {dict(daemon.monitor.results)}")
    results = daemon.monitor.results
    assert results["overloaded"] == 0
    assert results["gap"] == 0
    assert results["accepted"] == MESSAGES
    assert daemon.monitor.messages == MESSAGES
    chunks = sum(
        sample(text, "edgemon_chunks_total", {"device": f"d{d}"}) or 0.0 for d in range(DEVICES)
    )
    assert chunks == MESSAGES
    commits = sample(text, "edgemon_wal_commit_seconds_count", {})
    assert commits is not None
    assert 0 < commits < MESSAGES  # group commit: many messages per fdatasync
    # Every message was logged: at least one trace line of at least its payload each. (Not
    # `edgemon_wal_bytes`: a periodic snapshot meanwhile may have pruned the log to nothing.)
    appended = sample(text, "edgemon_wal_appended_bytes_total", {})
    assert appended is not None
    assert appended >= MESSAGES * len('{"type": "chunk", "stream": "s0", "seq": 0}')


async def test_a_broker_restart_mid_backlog_counts_nothing_twice(tmp_path: Path) -> None:
    """10,000 messages are queued by the broker (persistence on, unbounded queue) for
    edgemon's persistent session while it is stopped; it starts again, and while it works
    through that backlog the broker is stopped and started again. What edgemon had applied
    but not yet acknowledged is delivered again (DUP) to the next session and recognised;
    the rest comes from the broker's queue. Every message is applied exactly once:
    `accepted` = 10,000, no `duplicate`, no `gap` (messages of the lost session's queue
    applied without an acknowledgement would be delivered again, each reconnect adding them
    to `duplicate`)."""
    broker = MosquittoServer(tmp_path, persistence=True, options="max_queued_messages 0\n")
    broker.start()
    messages, streams = 10_000, 500
    settings = settings_for(
        broker.broker, "edgemon-backlog", state=StateSettings(dir=tmp_path / "state")
    )
    try:
        async with running(Daemon(settings, environ={}, install_signal_handlers=False)):
            pass  # the persistent session exists from now on
        publisher = await asyncio.create_subprocess_exec(
            sys.executable, FLOOD, str(broker.port), "count", str(messages), str(streams),
            str(DEVICES), "flow-publisher", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        out, err = await publisher.communicate()
        assert json.loads(out)["acked"] == messages, err.decode()
        daemon = Daemon(settings, environ={}, install_signal_handlers=False)
        async with running(daemon):
            async with asyncio.timeout(120):
                while daemon.monitor.messages < messages // 4:  # noqa: ASYNC110
                    await asyncio.sleep(0.005)
                broker.stop()  # mid-backlog
                stopped_at = daemon.monitor.messages
                broker.start()
                while daemon.monitor.messages < messages:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            # No wait for a "late" redelivery: the broker redelivers what was unacknowledged
            # at the new session's start, before the rest of its queue, all counted by now.
            print(
                f"\nbroker restart after {stopped_at} messages: {dict(daemon.monitor.results)}, "
                f"redeliveries recognised {daemon.link.intake.redelivered}"
            )
    finally:
        broker.stop()
    results = daemon.monitor.results
    assert stopped_at < messages
    assert results["duplicate"] == 0
    assert results["gap"] == 0
    assert results["accepted"] == messages
    assert daemon.monitor.messages == messages
