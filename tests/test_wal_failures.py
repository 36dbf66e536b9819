"""The write-ahead log's failure paths, on real files (docs/reliability.md):
a failed write releases every acknowledgement waiting for it, a corrupt snapshot next to log
files, a torn line that is not UTF-8, replay across two generations, pruning after a durable
snapshot. The only fault injected is the one a disk cannot produce on demand: `fdatasync`
failing (a full disk), and a snapshot write failing."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import threading
from typing import TYPE_CHECKING, Any

import pytest

from edgemon.daemon.persistence import WAL_GENERATION
from edgemon.daemon.snapshot_file import SNAPSHOT_NAME, StateStore
from edgemon.daemon.wal import generations, wal_path

from daemons import logged
from wal_nodes import T0, Node, closed_log

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.asyncio


def log_bytes(directory: Path) -> int:
    """Bytes in the log files of `directory` now."""
    return sum(wal_path(directory, g).stat().st_size for g in generations(directory))


async def test_a_failed_write_releases_every_waiting_acknowledgement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, captured_logs: list[dict[str, Any]]
) -> None:
    """The disk fills up during a commit: `wal_failed` is logged once, the acknowledgements of
    the batch being written and of the one waiting behind it are both released (never held
    for ever), and from then on messages are acknowledged at once, without a log, still
    applied."""
    node = Node(tmp_path)
    node.persistence.restore(T0)
    entered, fail = threading.Event(), threading.Event()

    def full_disk(_fd: int) -> None:
        entered.set()
        fail.wait(10)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fdatasync", full_disk)  # what edgemon.daemon.wal calls
    loop = asyncio.get_running_loop()
    first, second = loop.create_future(), loop.create_future()
    node.receive(0, T0)
    node.persistence.when_durable(lambda: first.set_result(None))
    async with asyncio.timeout(10):  # the commit is on the worker, inside fdatasync
        while not entered.is_set():  # noqa: ASYNC110 - a thread's event
            await asyncio.sleep(0.005)
    node.receive(1, T0 + 100)  # waits for the next commit
    node.persistence.when_durable(lambda: second.set_result(None))
    assert not first.done()
    assert not second.done()
    fail.set()
    async with asyncio.timeout(10):
        await asyncio.gather(first, second)
    wal = node.persistence.wal
    assert wal is not None
    assert wal.failed
    (line,) = logged(captured_logs, "wal_failed")
    assert "No space left" in line["error"]
    assert line["effect"] == "messages are acknowledged once applied, without a log"
    size = wal.size
    node.receive(2, T0 + 200)
    called: list[bool] = []
    node.persistence.when_durable(lambda: called.append(True))
    assert called == [True]  # at once
    assert wal.size == size  # nothing more is logged
    assert node.chunks() == 3  # every message applied all the same
    assert len(logged(captured_logs, "wal_failed")) == 1
    await node.persistence.close()


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
