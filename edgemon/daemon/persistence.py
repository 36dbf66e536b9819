"""What survives the process: snapshots and the write-ahead log in the state directory.

On start (at the first CONNACK, before any message of the session is read): restore the
last snapshot at the wall time it was taken, replay the log written after it through the
same Monitor path as live messages (at each record's `recv_ms`), then cut the downtime out
of the devices' timelines as a plain restore does (snapshot at the last replayed instant,
restored now). Every few seconds and at stop: a snapshot, which moves the log on to a new
generation and lets the older files go (`edgemon/daemon/wal.py`).

All file operations run on one worker thread, in the order they are asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from prometheus_client import Gauge, Histogram

from edgemon.adapters.metrics import CallbackCounter
from edgemon.daemon.snapshot_file import StateStore, encode, resolve_state_dir
from edgemon.daemon.wal import WriteAheadLog, generations, recover, wal_path

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path

    from prometheus_client import CollectorRegistry

    from edgemon.monitor import Monitor
    from edgemon.settings import StateSettings
    from edgemon.trace import TraceRecord

#: The key of a snapshot that says which log generations it covers (all older ones).
WAL_GENERATION = "wal_generation"
#: `edgemon_wal_commit_seconds` buckets: a page-cache write is ~10 µs, a disk flush ms.
WAL_COMMIT_BUCKETS_S = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)


def open_persistence(
    settings: StateSettings,
    *,
    environ: Mapping[str, str],
    monitor: Monitor,
    replay: Callable[[TraceRecord], None],
    registry: CollectorRegistry,
    log: Any,
) -> Persistence | None:
    """The daemon's state directory (`resolve_state_dir`, logged) and its metrics:
    `edgemon_wal_commit_seconds`, `edgemon_wal_bytes`, `edgemon_wal_appended_bytes_total`,
    `edgemon_wal_failing`, `edgemon_wal_write_failures_total`. None (and a warning) when
    there is no usable directory."""
    directory, chosen = resolve_state_dir(settings.dir, environ)
    if directory is None:
        log.warning("state_disabled", reason=chosen, dir=str(settings.dir))
        return None
    log.info("state_dir", dir=str(directory), chosen=chosen)
    commit = Histogram(
        "edgemon_wal_commit_seconds",
        "Time to write and fdatasync one group of messages to the write-ahead log.",
        buckets=WAL_COMMIT_BUCKETS_S,
        registry=registry,
    )
    persistence = Persistence(
        directory,
        monitor=monitor,
        replay=replay,
        wal=settings.wal,
        log=log,
        on_commit=commit.observe,
    )
    Gauge(
        "edgemon_wal_bytes",
        "Bytes in the write-ahead log now: what a start would replay.",
        registry=registry,
    ).set_function(lambda: 0 if persistence.wal is None else persistence.wal.size)
    registry.register(
        CallbackCounter(
            "edgemon_wal_appended_bytes",
            "Bytes committed to the write-ahead log since the start (never truncated).",
            lambda: 0 if persistence.wal is None else persistence.wal.appended,
        )
    )
    Gauge(
        "edgemon_wal_failing",
        "1 while the write-ahead log cannot write: messages are not acknowledged meanwhile.",
        registry=registry,
    ).set_function(lambda: 0 if persistence.failure is None else 1)
    registry.register(
        CallbackCounter(
            "edgemon_wal_write_failures",
            "Writes to the write-ahead log that failed (each is tried again).",
            lambda: 0 if persistence.wal is None else persistence.wal.failures,
        )
    )
    return persistence


class Persistence:
    """The state directory of one daemon: restore once, then log, snapshot, prune."""

    def __init__(
        self,
        directory: Path,
        *,
        monitor: Monitor,
        replay: Callable[[TraceRecord], None],
        wal: bool,
        log: Any,
        on_commit: Callable[[float], None] = lambda _seconds: None,
    ) -> None:
        self.directory = directory
        self.store = StateStore(directory)
        self._monitor = monitor
        self._replay = replay
        self._wal_enabled = wal
        self._log = log
        self._on_commit = on_commit
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgemon-state")
        #: The log, once restored (None before, or when `[state] wal = false`).
        self.wal: WriteAheadLog | None = None
        self.restored = False
        #: Whether the restore found what an earlier run left (a snapshot or log files), and
        #: the wall time the state restored was taken at (None: none was restored).
        self.resumed = False
        self.resumed_from_ms: float | None = None
        self._generation = 0
        #: How long the last snapshot held the event loop to take and encode the state (ms).
        self.capture_ms = 0.0

    # ------------------------------------------------------------------ start
    def restore(self, now_ms: float) -> list[tuple[str, bytes]]:
        """Snapshot, then log; the messages replayed (the broker may deliver them again)."""
        self.restored = True
        data = self._load()
        covered = _covered(data)
        found = recover(self.directory, covered)
        self.resumed = data is not None or found.files > 0
        monitor = self._monitor
        if found.records:  # on top of the snapshot, restored at its own wall time
            first = found.records[0].recv_ms
            resumed = float(data["engine"]["wall_ms"]) if data is not None else first
            for record in found.records:
                self._replay(record)
            data = monitor.snapshot(max(resumed, found.records[-1].recv_ms))
        if data is not None:
            self.resumed_from_ms = float(data["engine"]["wall_ms"])
            monitor.restore(data, now_ms)  # the device clocks resume now
            devices = list(monitor.engine.devices())
            self._log.info(
                "state_restored",
                devices=len(devices),
                streams=sum(len(device.streams) for device in devices),
            )
        if found.files:
            self._log.info(
                "wal_replayed",
                records=len(found.records),
                files=found.files,
                bytes=found.bytes,
                torn_lines=found.torn,
            )
        if found.torn:
            self._log.warning("wal_torn_lines_skipped", lines=found.torn, dir=str(self.directory))
        existing = generations(self.directory)
        self._generation = max([covered, *existing]) + 1
        if self._wal_enabled:
            # The file from the start, not from the first commit: a run killed before it
            # committed anything still left a trace of itself (`resumed` for the next start).
            with contextlib.suppress(OSError):  # a write failing later says so (`wal_failed`)
                wal_path(self.directory, self._generation).touch()
            self.wal = WriteAheadLog(
                self.directory,
                self._generation,
                executor=self._executor,
                on_commit=self._on_commit,
                log=self._log,
                size=found.bytes,
            )
        return [(record.topic, record.payload) for record in found.records]

    def _load(self) -> dict[str, Any] | None:
        try:
            data = self.store.load()
            if data is not None:
                _covered(data)  # a malformed generation is a bad snapshot
                self._monitor.restore(data, float(data["engine"]["wall_ms"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:  # SnapshotError: ValueError
            self._log.error("state_restore_failed", path=str(self.store.path), error=str(exc))
            return None
        return data

    # ------------------------------------------------------------------ running
    @property
    def failure(self) -> str | None:
        """Why messages cannot be made durable now (None while they can): `/readyz`."""
        return None if self.wal is None else self.wal.failure

    def append(self, recv_ms: float, topic: str, payload: bytes) -> None:
        """Log one received message (before it is applied)."""
        if self.wal is not None:
            self.wal.append(recv_ms, topic, payload)

    def when_durable(self, callback: Callable[[], None]) -> None:
        """Call `callback` once what was logged so far is on disk (at once without a log)."""
        if self.wal is not None:
            self.wal.when_durable(callback)
        else:
            callback()

    async def snapshot(self, now_ms: float) -> int | None:
        """Take and encode the state on the loop, write it on the worker, then drop the log
        files it covers; the bytes written (None when not restored yet: an empty state must
        not overwrite the last snapshot, or when the write failed)."""
        if not self.restored:
            return None
        wal = self.wal
        if wal is not None:
            self._generation = wal.rotate()
        else:
            self._generation += 1
        started = time.perf_counter()
        data = self._monitor.snapshot(now_ms)
        data[WAL_GENERATION] = covered = self._generation
        body = encode(data)  # on the loop: a worker encoding would hold the GIL (`encode`)
        self.capture_ms = (time.perf_counter() - started) * 1000.0
        loop = asyncio.get_running_loop()
        try:
            size = await loop.run_in_executor(self._executor, self.store.write, body)
        except OSError as exc:
            self._log.error("snapshot_failed", path=str(self.store.path), error=str(exc))
            return None
        if wal is not None:
            await wal.prune(covered)
        return size

    async def close(self) -> None:
        """After the last snapshot: close the log and end the worker."""
        if self.wal is not None:
            await self.wal.close()
        self._executor.shutdown(wait=True)


def _covered(data: dict[str, Any] | None) -> int:
    """The generation from which the log is newer than the snapshot (0: all of it)."""
    if data is None:
        return 0
    value = data.get(WAL_GENERATION, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{WAL_GENERATION} must be an integer ≥ 0")
    return value
