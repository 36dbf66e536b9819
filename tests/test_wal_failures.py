"""The write-ahead log's failure paths, on real files (docs/reliability.md):
a failed write holds every acknowledgement waiting for it until it is written again, a
durable snapshot releases what it covers, a corrupt snapshot next to log files, a torn line
that is not UTF-8, replay across two generations, pruning after a durable snapshot. The only
fault injected is the one a disk cannot produce on demand: `fdatasync` failing (a full
disk), and a snapshot write failing."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import threading
from typing import TYPE_CHECKING, Any

import pytest

from edgemon.daemon import Daemon
from edgemon.daemon.persistence import WAL_GENERATION
from edgemon.daemon.snapshot_file import SNAPSHOT_NAME, StateStore
from edgemon.daemon.wal import generations, recover, wal_path
from edgemon.settings import StateSettings

from brokers import Broker
from clients import scrape, settings_for
from daemons import logged, running
from fake_broker import FakeBroker
from scrapes import samples
from wal_nodes import T0, Node, chunk, closed_log

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

pytestmark = pytest.mark.asyncio


def log_bytes(directory: Path) -> int:
    """Bytes in the log files of `directory` now."""
    return sum(wal_path(directory, g).stat().st_size for g in generations(directory))


class FullDisk:
    """`os.fdatasync` as edgemon.daemon.wal_files calls it, failing with ENOSPC while `full`
    (the fault a disk cannot produce on demand); each failure counted."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full = threading.Event()
        self.failed = 0
        real = os.fdatasync

        def fdatasync(fd: int) -> None:
            if self.full.is_set():
                self.failed += 1
                raise OSError(errno.ENOSPC, "No space left on device")
            real(fd)

        monkeypatch.setattr(os, "fdatasync", fdatasync)


async def until(condition: Callable[[], bool], within_s: float = 30.0) -> None:
    """Wait for `condition`, polling (a generous deadline: a loaded machine)."""
    async with asyncio.timeout(within_s):
        while not condition():  # noqa: ASYNC110 - state the worker thread changes
            await asyncio.sleep(0.005)


def recovered_seqs(directory: Path) -> list[int]:
    """The `seq` of every chunk the log files hold, in order."""
    return [json.loads(r.payload)["seq"] for r in recover(directory, 0).records]


async def test_a_failed_write_holds_every_acknowledgement_until_it_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, captured_logs: list[dict[str, Any]]
) -> None:
    """The disk fills up: `wal_failed` is logged once, `failure` says why (what `/readyz`
    answers), and no acknowledgement is released, neither the failed batch's nor the one
    behind it (before, both were released at once and the log switched off: acknowledged,
    never durable). Nothing half-written stays in the file. The write is tried again, with
    a growing wait, until the disk has room: then both batches are in the log once each, in
    order, their acknowledgements go, and `wal_recovered` says so."""
    disk = FullDisk(monkeypatch)
    node = Node(tmp_path)
    node.persistence.restore(T0)
    loop = asyncio.get_running_loop()
    first, second = loop.create_future(), loop.create_future()
    disk.full.set()
    node.receive(0, T0)
    node.persistence.when_durable(lambda: first.set_result(None))
    await until(lambda: node.persistence.failure is not None)
    node.receive(1, T0 + 100)
    node.persistence.when_durable(lambda: second.set_result(None))
    wal = node.persistence.wal
    assert wal is not None
    await until(lambda: wal.failures >= 3)  # tried again, and again
    assert not first.done()
    assert not second.done()
    failure = node.persistence.failure
    assert failure is not None
    assert "No space left" in failure
    assert log_bytes(tmp_path) == 0  # the lines written before fdatasync failed were cut
    (line,) = logged(captured_logs, "wal_failed")
    assert "not acknowledged" in line["effect"]
    assert node.chunks() == 2  # applied all the same
    disk.full.clear()
    async with asyncio.timeout(30):
        await asyncio.gather(first, second)
    assert node.persistence.failure is None
    assert recovered_seqs(tmp_path) == [0, 1]
    assert wal.appended == wal.size == log_bytes(tmp_path)
    assert len(logged(captured_logs, "wal_failed")) == 1
    (recovered,) = logged(captured_logs, "wal_recovered")
    assert recovered["failures"] == wal.failures
    node.receive(2, T0 + 200)
    await node.durable()
    assert recovered_seqs(tmp_path) == [0, 1, 2]
    await node.persistence.close()


async def test_a_durable_snapshot_releases_the_batches_it_covers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the log cannot write, a snapshot that can (it holds every message applied) covers
    the held batches: their acknowledgements go once it is durable, though the log is still
    failing; later messages wait for the log."""
    disk = FullDisk(monkeypatch)
    node = Node(tmp_path)
    node.persistence.restore(T0)
    loop = asyncio.get_running_loop()
    covered, later = loop.create_future(), loop.create_future()
    disk.full.set()
    node.receive(0, T0)
    node.persistence.when_durable(lambda: covered.set_result(None))
    await until(lambda: node.persistence.failure is not None)
    assert await node.persistence.snapshot(T0 + 50) is not None
    async with asyncio.timeout(30):
        await covered
    node.receive(1, T0 + 100)
    node.persistence.when_durable(lambda: later.set_result(None))
    await until(lambda: disk.failed >= 2)
    assert not later.done()
    assert node.persistence.failure is not None
    disk.full.clear()
    async with asyncio.timeout(30):
        await later
    assert recovered_seqs(tmp_path) == [1]  # seq 0 is in the snapshot
    await node.persistence.close()


async def test_a_log_that_cannot_write_at_the_end_is_said_and_not_acknowledged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, captured_logs: list[dict[str, Any]]
) -> None:
    """Closing while the disk is still full: one last try, then `wal_unwritten` with the bytes
    left; their acknowledgements are never called (the broker delivers them again)."""
    disk = FullDisk(monkeypatch)
    node = Node(tmp_path)
    node.persistence.restore(T0)
    released: list[bool] = []
    disk.full.set()
    node.receive(0, T0)
    node.persistence.when_durable(lambda: released.append(True))
    await until(lambda: node.persistence.failure is not None)
    await node.persistence.close()
    (line,) = logged(captured_logs, "wal_unwritten")
    assert line["bytes"] > 0
    assert released == []


async def test_a_corrupt_snapshot_next_to_log_files_is_set_aside_and_the_log_replayed(
    tmp_path: Path, captured_logs: list[dict[str, Any]]
) -> None:
    """A snapshot that is not JSON next to log files: the start logs `state_restore_failed`,
    moves it aside (`snapshot.json.bad`), and replays what the log files hold — the messages
    after that snapshot, applied once (after a declared gap: what the snapshot held is lost)
    — instead of failing; the next snapshot is good."""
    first = Node(tmp_path)
    first.persistence.restore(T0)
    for seq in range(3):
        first.receive(seq, T0 + seq * 100)
    await first.durable()
    assert await first.persistence.snapshot(T0 + 250) is not None
    for seq in range(3, 5):
        first.receive(seq, T0 + seq * 100)
    await first.durable()
    await first.persistence.close()
    snapshot = tmp_path / SNAPSHOT_NAME
    snapshot.write_text('{"engine": {"format": 1, "dev', encoding="utf-8")  # torn by hand
    second = Node(tmp_path)
    replayed = second.persistence.restore(T0 + 1_000)
    assert [json.loads(payload)["seq"] for _, payload in replayed] == [3, 4]
    (failed,) = logged(captured_logs, "state_restore_failed")
    assert failed["path"] == str(snapshot)
    assert (tmp_path / (SNAPSHOT_NAME + ".bad")).read_text(encoding="utf-8").startswith('{"engine')
    assert second.monitor.messages == 2  # the log's records, each once
    # What the bad snapshot held is lost: seq 3 and 4 wait for 0-2 (allowed lateness), then
    # are applied after a declared gap.
    second.monitor.advance(T0 + 5_000, second.out)
    assert second.chunks() == 2
    assert second.monitor.results["gap"] == 1
    assert second.monitor.results["duplicate"] == 0
    assert await second.persistence.snapshot(T0 + 1_100) is not None
    assert json.loads(snapshot.read_text(encoding="utf-8"))[WAL_GENERATION] >= 1
    await second.persistence.close()


async def test_a_torn_line_that_is_not_utf8_is_skipped_and_counted(
    tmp_path: Path, captured_logs: list[dict[str, Any]]
) -> None:
    """A crash can leave any bytes at the end of a log, not only the start of a record: a line
    that is not UTF-8 is skipped and counted like any torn line; the whole records before it
    are replayed."""
    path = await closed_log(tmp_path)
    with path.open("ab") as file:
        file.write(b'{"recv_ms":1700000000300.0,"topic":"edgemon/v1/d1/\xff\xfe\xc3')
    second = Node(tmp_path)
    replayed = second.persistence.restore(T0 + 1_000)
    assert [json.loads(payload)["seq"] for _, payload in replayed] == [0, 1, 2]
    assert second.chunks() == 3
    assert [line["lines"] for line in logged(captured_logs, "wal_torn_lines_skipped")] == [1]
    (summary,) = logged(captured_logs, "wal_replayed")
    assert summary["torn_lines"] == 1
    await second.persistence.close()


async def test_replay_runs_across_two_generations_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, captured_logs: list[dict[str, Any]]
) -> None:
    """A snapshot whose write fails (`snapshot_failed`) has already moved the log on to a new
    generation; the process then dies. The next start, with no snapshot, replays both
    generations in order: every chunk once, no gap, no duplicate, one stream."""
    first = Node(tmp_path)
    first.persistence.restore(T0)
    for seq in range(2):
        first.receive(seq, T0 + seq * 100)
    await first.durable()

    def disk_full(_self: StateStore, _body: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(StateStore, "write", disk_full)
    assert await first.persistence.snapshot(T0 + 150) is None
    monkeypatch.undo()
    assert len(logged(captured_logs, "snapshot_failed")) == 1
    for seq in range(2, 4):
        first.receive(seq, T0 + seq * 100)
    await first.durable()
    await first.persistence.close()
    assert len(generations(tmp_path)) == 2
    assert not (tmp_path / SNAPSHOT_NAME).exists()
    second = Node(tmp_path)
    replayed = second.persistence.restore(T0 + 1_000)
    assert [json.loads(payload)["seq"] for _, payload in replayed] == [0, 1, 2, 3]
    assert second.chunks() == 4
    assert second.monitor.results["accepted"] == 4
    assert second.monitor.results["gap"] == second.monitor.results["duplicate"] == 0
    device = second.monitor.engine.device("d1")
    assert device is not None
    assert device.stats.streams_started == 1
    (summary,) = logged(captured_logs, "wal_replayed")
    assert summary["files"] == 2
    await second.persistence.close()


async def test_a_durable_snapshot_prunes_the_generations_it_covers(tmp_path: Path) -> None:
    """Once a snapshot is durable, the log files of the generations it covers are deleted and
    `size` (`edgemon_wal_bytes`) drops to what the remaining files hold, while `appended`
    (`edgemon_wal_appended_bytes_total`) keeps every byte ever committed; a start then replays
    only what came after the snapshot."""
    node = Node(tmp_path)
    node.persistence.restore(T0)
    for seq in range(3):
        node.receive(seq, T0 + seq * 100)
    await node.durable()
    wal = node.persistence.wal
    assert wal is not None
    before = generations(tmp_path)
    logged_bytes = log_bytes(tmp_path)
    assert wal.size == wal.appended == logged_bytes > 0
    assert await node.persistence.snapshot(T0 + 250) is not None
    covered = json.loads((tmp_path / SNAPSHOT_NAME).read_text(encoding="utf-8"))[WAL_GENERATION]
    assert all(g >= covered for g in generations(tmp_path))
    assert not set(before) & set(generations(tmp_path))
    assert wal.size == log_bytes(tmp_path) == 0
    assert wal.appended == logged_bytes
    node.receive(3, T0 + 300)
    await node.durable()
    assert wal.size == log_bytes(tmp_path) > 0
    assert wal.appended == logged_bytes + wal.size
    await node.persistence.close()
    second = Node(tmp_path)
    replayed = second.persistence.restore(T0 + 1_000)
    assert [json.loads(payload)["seq"] for _, payload in replayed] == [3]
    assert second.chunks() == 4
    await second.persistence.close()


async def test_the_daemon_acknowledges_nothing_and_says_not_ready_while_its_log_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, captured_logs: list[dict[str, Any]]
) -> None:
    """A daemon whose log cannot write: it applies what the broker sends but sends no PUBACK
    (the broker keeps the messages), `/readyz` answers 503 saying why, and
    `edgemon_wal_failing` is 1; once the disk has room every message is acknowledged, each
    once, `/readyz` is 200 again and the gauge 0. Before, the log switched itself off and
    every later message was acknowledged without being durable."""
    disk = FullDisk(monkeypatch)
    broker = FakeBroker()
    settings = settings_for(Broker("127.0.0.1", broker.port), state=StateSettings(dir=tmp_path))
    daemon = Daemon(settings, environ={}, install_signal_handlers=False)
    topic = "edgemon/v1/d1/events"
    try:
        async with running(daemon, logs=captured_logs):
            http = daemon.http_port
            assert http is not None
            disk.full.set()
            broker.publish([(topic, chunk(seq, T0 + seq * 100), seq + 1) for seq in range(5)])
            await until(lambda: daemon.monitor.results["accepted"] == 5)
            await until(lambda: disk.failed >= 2)
            assert broker.pubacks() == []
            status, text = await scrape(http, "/readyz")
            assert status == 503
            assert "write-ahead log cannot write" in text
            assert "No space left" in text
            metrics = (await scrape(http, "/metrics"))[1]
            assert samples(metrics, "edgemon_wal_failing") == {(): 1.0}
            assert samples(metrics, "edgemon_wal_write_failures_total")[()] >= 2
            assert broker.pubacks() == []
            disk.full.clear()
            await until(lambda: len(broker.pubacks()) == 5)
            assert sorted(ack.mid for ack in broker.pubacks()) == [1, 2, 3, 4, 5]
            assert (await scrape(http, "/readyz"))[0] == 200
            metrics = (await scrape(http, "/metrics"))[1]
            assert samples(metrics, "edgemon_wal_failing") == {(): 0.0}
    finally:
        broker.close()
    assert len(logged(captured_logs, "wal_failed")) == 1
