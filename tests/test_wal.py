"""The write-ahead log and the state directory on real files, without a broker (docs/reliability.md
"Crash"): group commit before acknowledgement, replay after the snapshot through the same
engine path, crash-safe truncation, torn lines, the XDG fallback, unique temporary files."""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pytest

from edgemon.daemon.persistence import WAL_GENERATION
from edgemon.daemon.snapshot_file import SNAPSHOT_NAME, StateStore, resolve_state_dir
from edgemon.daemon.wal import WriteAheadLog, generations
from edgemon.settings import DEFAULT_STATE_DIR

from wal_nodes import T0, Node, closed_log

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


@pytest.mark.asyncio
async def test_what_was_logged_after_the_snapshot_is_replayed_exactly_once(
    tmp_path: Path, captured_logs: list[dict[str, Any]]
) -> None:
    """A process applies 5 chunks, snapshots, applies 5 more (logged, group-committed: the
    acknowledgement callback runs only after the commit), then dies without a word. The next
    start restores the snapshot and replays the 5 from the log: 10 chunks, no gap, no
    duplicate, the stream live; the commit histogram saw each batch."""
    first = Node(tmp_path)
    assert first.persistence.restore(T0) == []
    for seq in range(5):
        first.receive(seq, T0 + seq * 100)
    await first.durable()
    assert await first.persistence.snapshot(T0 + 450) is not None
    for seq in range(5, 10):
        first.receive(seq, T0 + seq * 100)
    acknowledged = asyncio.Event()
    first.persistence.when_durable(acknowledged.set)
    assert not acknowledged.is_set()  # not before the log is on disk
    await acknowledged.wait()
    assert first.commits  # observed for edgemon_wal_commit_seconds
    # -- SIGKILL: nothing more runs. A new process on the same directory:
    second = Node(tmp_path)
    replayed = second.persistence.restore(T0 + 2_000)
    assert [json.loads(payload)["seq"] for _, payload in replayed] == [5, 6, 7, 8, 9]
    assert second.chunks() == 10
    assert second.monitor.results["accepted"] == 10
    assert second.monitor.results["gap"] == second.monitor.results["duplicate"] == 0
    device = second.monitor.engine.device("d1")
    assert device is not None
    assert list(device.streams) == ["s"]
    assert next(e for e in captured_logs if e["event"] == "wal_replayed")["records"] == 5
    await first.persistence.close()
    await second.persistence.close()


@pytest.mark.asyncio
async def test_a_crash_between_snapshot_and_truncation_applies_nothing_twice(
    tmp_path: Path,
) -> None:
    """The snapshot records the log generation it covers; if the process dies after writing
    it but before deleting the older log files, the next start deletes them unread: the
    chunks they hold are in the snapshot, counted once."""
    first = Node(tmp_path)
    first.persistence.restore(T0)
    for seq in range(4):
        first.receive(seq, T0 + seq * 100)
    await first.durable()
    old = generations(tmp_path)
    snapshot = first.monitor.snapshot(T0 + 350)
    snapshot[WAL_GENERATION] = first.persistence.wal.rotate()  # type: ignore[union-attr]
    StateStore(tmp_path).save(snapshot)  # ... and killed before the old files go
    assert generations(tmp_path) == old
    second = Node(tmp_path)
    assert second.persistence.restore(T0 + 1_000) == []
    assert second.chunks() == 4
    assert second.monitor.results["accepted"] == 4
    assert all(g >= snapshot[WAL_GENERATION] for g in generations(tmp_path))
    await first.persistence.close()
    await second.persistence.close()


@pytest.mark.asyncio
async def test_a_torn_last_line_is_skipped_and_counted_not_fatal(
    tmp_path: Path, captured_logs: list[dict[str, Any]]
) -> None:
    """A crash in the middle of a write leaves half a line at the end of the log: the next
    start replays every whole record, skips the torn one, and logs how many it skipped."""
    path = await closed_log(tmp_path)
    with path.open("ab") as file:
        file.write(b'{"recv_ms":1700000000300.0,"topic":"edgemon/v1/d1/ev')
    second = Node(tmp_path)
    second.persistence.restore(T0 + 1_000)
    assert second.chunks() == 3
    skipped = [e for e in captured_logs if e["event"] == "wal_torn_lines_skipped"]
    assert [e["lines"] for e in skipped] == [1]
    await second.persistence.close()


@pytest.mark.asyncio
async def test_without_the_log_nothing_is_written_and_acks_are_immediate(tmp_path: Path) -> None:
    """`[state] wal = false`: no log file, and the acknowledgement callback runs at once."""
    node = Node(tmp_path, wal=False)
    node.persistence.restore(T0)
    node.receive(0, T0)
    called: list[bool] = []
    node.persistence.when_durable(lambda: called.append(True))
    assert called == [True]
    assert generations(tmp_path) == []
    await node.persistence.close()


def test_a_hand_started_daemon_gets_the_xdg_state_directory(tmp_path: Path) -> None:
    """Without /var/lib/edgemon the default state directory is `$XDG_STATE_HOME/edgemon`,
    else `~/.local/state/edgemon`, created; a configured one is created too; with neither
    variable there is none, and the reason says so."""
    if DEFAULT_STATE_DIR.is_dir():
        pytest.skip(f"{DEFAULT_STATE_DIR} exists here")
    xdg = tmp_path / "xdg"
    assert resolve_state_dir(DEFAULT_STATE_DIR, {"XDG_STATE_HOME": str(xdg)}) == (
        xdg / "edgemon",
        "XDG_STATE_HOME",
    )
    assert (xdg / "edgemon").is_dir()
    home = tmp_path / "home"
    found, _ = resolve_state_dir(DEFAULT_STATE_DIR, {"HOME": str(home)})
    assert found == home / ".local" / "state" / "edgemon"
    assert found.is_dir()
    configured = tmp_path / "configured" / "state"
    assert resolve_state_dir(configured, {})[0] == configured
    assert configured.is_dir()
    missing, reason = resolve_state_dir(DEFAULT_STATE_DIR, {})
    assert missing is None
    assert "XDG_STATE_HOME" in reason


def test_two_snapshots_written_at_once_do_not_share_a_temporary_file(tmp_path: Path) -> None:
    """The periodic snapshot and the final one may be written at the same moment: each has a
    temporary file of its own, so both writes succeed and the file is one of them, whole."""
    store = StateStore(tmp_path)
    bodies = [{"n": n, "pad": "x" * 2_000_000} for n in range(2)]
    for _ in range(10):
        errors: list[BaseException] = []
        start = threading.Barrier(2)

        def write(
            body: dict[str, Any],
            errors: list[BaseException] = errors,
            start: threading.Barrier = start,
        ) -> None:
            start.wait()
            try:
                store.save(body)
            except BaseException as exc:  # noqa: BLE001 - collected for the assertion
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(body,)) for body in bodies]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert store.load() in bodies
    assert [p.name for p in tmp_path.iterdir()] == [SNAPSHOT_NAME]


@pytest.mark.asyncio
async def test_the_state_worker_only_writes_what_the_loop_encoded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot is taken and encoded on the event loop's thread; the state worker gets the
    bytes and only writes them (a worker encoding held the GIL against the loop for tens of
    milliseconds at 10,000 streams). What it writes reads back as the state taken."""
    node = Node(tmp_path)
    node.persistence.restore(T0)
    for seq in range(3):
        node.receive(seq, T0 + seq * 100)
    written: list[tuple[str, type]] = []

    class Recording(StateStore):
        def write(self, body: bytes) -> int:
            written.append((threading.current_thread().name, type(body)))
            return super().write(body)

    monkeypatch.setattr(node.persistence, "store", Recording(tmp_path))
    assert await node.persistence.snapshot(T0 + 250) is not None
    ((thread, kind),) = written
    assert thread.startswith("edgemon-state")
    assert thread != threading.current_thread().name
    assert kind is bytes
    assert node.persistence.capture_ms > 0.0
    loaded = StateStore(tmp_path).load()
    assert loaded is not None
    assert loaded["engine"] == node.monitor.snapshot(T0 + 250)["engine"]
    await node.persistence.close()


class _RecordingExecutor(ThreadPoolExecutor):
    """The log's worker, recording each commit's lines and the loop time it was handed over."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.commits: list[tuple[float, int]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        if len(args) == 2 and isinstance(args[0], list):  # `LogFiles.write(parts, attempt)`
            lines = sum(data.count(b"\n") for _, data in args[0])
            self.commits.append((asyncio.get_running_loop().time(), lines))
        return super().submit(fn, *args, **kwargs)


async def _durable(wal: WriteAheadLog) -> None:
    done = asyncio.get_running_loop().create_future()
    wal.when_durable(lambda: done.set_result(None))
    await asyncio.wait_for(done, 30)


@pytest.mark.asyncio
async def test_a_message_after_the_window_starts_the_commit_no_timer_does(tmp_path: Path) -> None:
    """Under a steady flow no timer starts a commit (a wake-up costs more CPU than the commit's
    work): a message that arrives within the window waits for the next one arriving after it,
    and both go in one commit; alone, it is committed two windows after the last start."""
    window = 1.0
    executor = _RecordingExecutor()
    wal = WriteAheadLog(
        tmp_path, 1, executor=executor, on_commit=lambda _s: None, log=None, commit_window_s=window
    )
    loop = asyncio.get_running_loop()
    wal.append(T0, "edgemon/v1/d1/events", b"{}")  # after a quiet spell: committed at once
    await _durable(wal)
    first = executor.commits[0][0]
    wal.append(T0 + 1, "edgemon/v1/d1/events", b"{}")  # within the window: waits
    await asyncio.sleep(max(0.0, first + 1.1 * window - loop.time()))  # timers never fire early
    assert len(executor.commits) == 1  # no timer at the window's end
    wal.append(T0 + 2, "edgemon/v1/d1/events", b"{}")  # after it: starts the commit, with both
    await _durable(wal)
    assert [lines for _, lines in executor.commits] == [1, 2]
    second = executor.commits[1][0]
    wal.append(T0 + 3, "edgemon/v1/d1/events", b"{}")  # then nothing more arrives
    await _durable(wal)
    assert [lines for _, lines in executor.commits] == [1, 2, 1]
    assert executor.commits[2][0] >= second + 2 * window  # the timer, two windows later
    await wal.close()
    executor.shutdown()
