"""The write-ahead log in the state directory (docs/reliability.md "Crash").

Every received message is appended as one trace line (README, `edgemon/trace.py`) to
`wal.<generation>.jsonl`. Lines are committed in groups: one write and one `fdatasync` per
batch of messages received together (whatever arrived while the previous commit was under
way, or within `COMMIT_WINDOW_S` of its start, joins the next one), on one worker thread
that also writes the snapshots, so the file operations happen in the order they were asked
for. A batch's QoS 1 acknowledgements wait for its commit (`when_durable`).

A commit costs the process far more than its `fdatasync`: each wake-up of a thread that
was asleep (the worker for the commit, the event loop for its end, a timer) costs about
0.1-0.2 ms of CPU on a small VM, more than the few microseconds of work it wakes for. So
the next commit is started by the first message that arrives once the window has passed,
in the same turn of the loop; a timer starts it only when no message comes, two windows
after the last start. Under a steady flow no timer fires at all: a commit costs two
wake-ups (the worker's and the loop's), not three (`benchmarks/ingest.py` part 2).

Truncation without a window for double application: at a snapshot the log moves on to a new
generation, and the snapshot records that generation (`wal_generation`): it covers every
message in older files. The older files are deleted only once the snapshot is durable; a
crash in between leaves files that the next start deletes unread, because the snapshot says
it covers them. On start the snapshot is restored and the files of its generation and later
are replayed, in order. A line that is not a record (a write torn by the crash) is skipped
and counted, not fatal.

A failed write (disk full) is logged and switches the log off: messages are then
acknowledged once applied, as without a log, rather than never.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO

from edgemon.trace import TraceError, TraceRecord, encode_line, read_records

if TYPE_CHECKING:
    from collections.abc import Callable
    from concurrent.futures import Executor
    from pathlib import Path

_NAME = re.compile(r"^wal\.(\d{1,12})\.jsonl$")
#: The commit window: commits start at least this many seconds apart (the first after a
#: quiet spell at once), so the log costs at most 1 / COMMIT_WINDOW_S (50) commits a second
#: however many messages arrive; a message waits at most twice this long, plus one commit,
#: for its acknowledgement (under a steady flow, about once this long: the next message
#: after the window starts the commit). `benchmarks/wal_window.py` measures the trade.
COMMIT_WINDOW_S = 0.02


def wal_path(directory: Path, generation: int) -> Path:
    """The file of `generation`."""
    return directory / f"wal.{generation:012d}.jsonl"


def generations(directory: Path) -> list[int]:
    """The generations present in `directory`, oldest first."""
    found = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(directory):
            match = _NAME.match(entry.name)
            if match is not None:
                found.append(int(match.group(1)))
    return sorted(found)


@dataclass(slots=True)
class Recovered:
    """What the files from one generation on hold: the records in order, and what was
    skipped (`torn`: lines that are not records, e.g. the last one written at a crash)."""

    records: list[TraceRecord] = field(default_factory=list)
    torn: int = 0
    files: int = 0
    bytes: int = 0


def recover(directory: Path, covered: int) -> Recovered:
    """Read every file of generation ≥ `covered`, in order; delete older ones (a snapshot
    covers them)."""
    found = Recovered()
    for generation in generations(directory):
        path = wal_path(directory, generation)
        if generation < covered:
            path.unlink(missing_ok=True)
            continue
        data = path.read_bytes()
        found.files += 1
        found.bytes += len(data)
        for line in data.split(b"\n"):
            if not line.strip():
                continue
            try:
                found.records.extend(read_records([line.decode("utf-8")]))
            except (TraceError, UnicodeDecodeError):
                found.torn += 1
    return found


class WriteAheadLog:
    """Appends on the event loop, group commits on the worker, acknowledgements after."""

    def __init__(
        self,
        directory: Path,
        generation: int,
        *,
        executor: Executor,
        on_commit: Callable[[float], None],
        log: Any,
        size: int = 0,
        commit_window_s: float = COMMIT_WINDOW_S,
    ) -> None:
        self._directory = directory
        self._window_s = commit_window_s
        self.generation = generation
        self._executor = executor
        self._on_commit = on_commit
        self._log = log
        self._pending: list[bytes] = []
        self._waiting: list[Callable[[], None]] = []
        #: The callbacks of the newest commit under way (None when none is).
        self._in_flight: list[Callable[[], None]] | None = None
        self._commits = 0
        #: The callback that will start the next commit (in this turn of the loop, or a
        #: `TimerHandle`), if armed.
        self._kick_handle: asyncio.Handle | None = None
        self._last_start = -float("inf")
        self._files: dict[int, BinaryIO] = {}
        self.failed = False
        #: Bytes in the log files now (what a start would replay), `edgemon_wal_bytes`.
        self.size = size
        #: Bytes committed since this process started (`edgemon_wal_appended_bytes_total`):
        #: unlike `size`, never lowered by a snapshot's pruning.
        self.appended = 0

    # ------------------------------------------------------------------ on the loop
    def append(self, recv_ms: float, topic: str, payload: bytes) -> None:
        """Add one message received at `recv_ms`; it is committed with the next batch."""
        if self.failed:
            return
        self._pending.append(encode_line(recv_ms, topic, payload))
        if not self._commits:
            self._arm()

    def when_durable(self, callback: Callable[[], None]) -> None:
        """Call `callback` once every message appended so far is on disk."""
        if self._pending and not self.failed:
            self._waiting.append(callback)  # the scheduled commit takes it
        elif self._in_flight is not None:
            self._in_flight.append(callback)
        else:
            callback()

    def rotate(self) -> int:
        """Begin a new generation (at a snapshot); what is pending goes to the old one."""
        if self._pending:
            self._commit()
        self.generation += 1
        return self.generation

    async def prune(self, covered: int) -> None:
        """Delete the files a durable snapshot covers (generation < `covered`)."""
        loop = asyncio.get_running_loop()
        freed = await loop.run_in_executor(self._executor, self._prune, covered)
        self.size -= freed

    async def close(self) -> None:
        """Commit what is pending and close the files (after the last snapshot)."""
        if self._pending:
            self._commit()
        await asyncio.get_running_loop().run_in_executor(self._executor, self._close)

    def _arm(self) -> None:
        """Make sure a commit starts for what is pending: in this turn of the loop if the
        window since the last start has passed, else by a timer two windows after it,
        unless a message arriving after the window starts it first (no wake-up of its own).
        """
        handle = self._kick_handle
        if handle is not None and not isinstance(handle, asyncio.TimerHandle):
            return  # it starts in this turn already
        loop = asyncio.get_running_loop()
        if loop.time() >= self._last_start + self._window_s:
            if handle is not None:
                handle.cancel()
            self._kick_handle = loop.call_soon(self._kick)
        elif handle is None:
            self._kick_handle = loop.call_at(self._last_start + 2 * self._window_s, self._kick)

    def _kick(self) -> None:
        self._kick_handle = None
        if self._pending and not self._commits:
            self._commit()

    def _commit(self) -> None:
        if self._kick_handle is not None:
            self._kick_handle.cancel()
            self._kick_handle = None
        loop = asyncio.get_running_loop()
        self._last_start = loop.time()
        data = b"".join(self._pending)
        waiting = self._waiting
        self._pending = []
        self._waiting = []
        self._in_flight = waiting
        self._commits += 1
        future = loop.run_in_executor(self._executor, self._write, self.generation, data)
        future.add_done_callback(lambda done: self._committed(done, waiting, len(data)))

    def _committed(
        self, done: asyncio.Future[float], waiting: list[Callable[[], None]], size: int
    ) -> None:
        self._commits -= 1
        if self._in_flight is waiting:
            self._in_flight = None
        error = done.exception()
        if error is None:
            self.size += size
            self.appended += size
            self._on_commit(done.result())
        elif not self.failed:
            self.failed = True
            self._pending.clear()
            self._log.error(
                "wal_failed",
                dir=str(self._directory),
                error=str(error),
                effect="messages are acknowledged once applied, without a log",
            )
        for callback in waiting:
            callback()
        if self.failed:
            waiting, self._waiting = self._waiting, []
            for callback in waiting:
                callback()
        elif self._pending and not self._commits:
            self._arm()

    # ------------------------------------------------------------------ on the worker
    def _write(self, generation: int, data: bytes) -> float:
        began = time.perf_counter()
        file = self._files.get(generation)
        if file is None:
            for old in [g for g in self._files if g < generation]:
                self._files.pop(old).close()
            file = self._files[generation] = wal_path(self._directory, generation).open("ab")
            _sync_directory(self._directory)  # the new file's name survives a power loss
        file.write(data)
        file.flush()
        os.fdatasync(file.fileno())
        return time.perf_counter() - began

    def _prune(self, covered: int) -> int:
        freed = 0
        for generation in generations(self._directory):
            if generation >= covered:
                break
            file = self._files.pop(generation, None)
            if file is not None:
                file.close()
            path = wal_path(self._directory, generation)
            with contextlib.suppress(FileNotFoundError):
                freed += path.stat().st_size
                path.unlink()
        return freed

    def _close(self) -> None:
        for file in self._files.values():
            file.close()
        self._files.clear()


def _sync_directory(directory: Path) -> None:
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)
