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

A failed write (disk full, no file descriptor left) never switches the log off: no message
is acknowledged before it is durable, ever. The batches that could not be written are held,
in order, with their acknowledgements, and written again after `RETRY_FIRST_S`, doubling to
`RETRY_MAX_S`; meanwhile `failure` says why (`/readyz` answers 503 with it, and
`edgemon_wal_failing` is 1), new messages wait behind the held ones, and once too many wait
the intake stops reading, so the broker keeps the rest. The first failure of a spell is one
error (`wal_failed`), its end one line (`wal_recovered`). A snapshot made durable meanwhile
covers the held batches of the generations before it: they are released then
(`prune`). The files' side, which never leaves half a write behind, is `wal_files`.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgemon.daemon.wal_files import LogFiles, SkippedError, generations, wal_path
from edgemon.trace import TraceError, TraceRecord, encode_line, read_records

if TYPE_CHECKING:
    from collections.abc import Callable
    from concurrent.futures import Executor
    from pathlib import Path

#: The commit window: commits start at least this many seconds apart (the first after a
#: quiet spell at once), so the log costs at most 1 / COMMIT_WINDOW_S (50) commits a second
#: however many messages arrive; a message waits at most twice this long, plus one commit,
#: for its acknowledgement (under a steady flow, about once this long: the next message
#: after the window starts the commit). `benchmarks/wal_window.py` measures the trade.
COMMIT_WINDOW_S = 0.02
#: After a failed write the held batches are written again after this long, the wait
#: doubling after each failure up to `RETRY_MAX_S`.
RETRY_FIRST_S = 0.1
RETRY_MAX_S = 5.0

__all__ = ["COMMIT_WINDOW_S", "Recovered", "WriteAheadLog", "generations", "recover", "wal_path"]


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


@dataclass(slots=True)
class _Part:
    """Lines for one generation's file, and the callbacks waiting for them to be durable."""

    generation: int
    data: bytes
    callbacks: list[Callable[[], None]]


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
        retry_s: tuple[float, float] = (RETRY_FIRST_S, RETRY_MAX_S),
    ) -> None:
        self._directory = directory
        self._window_s = commit_window_s
        self.generation = generation
        self._executor = executor
        self._on_commit = on_commit
        self._log = log
        self._files = LogFiles(directory)
        self._pending: list[bytes] = []
        self._waiting: list[Callable[[], None]] = []
        #: The callbacks of the newest commit under way (None when none is).
        self._in_flight: list[Callable[[], None]] | None = None
        self._commits = 0
        #: The callback that will start the next commit (in this turn of the loop, or a
        #: `TimerHandle`), if armed.
        self._kick_handle: asyncio.Handle | None = None
        self._last_start = -float("inf")
        #: Batches whose write failed, oldest first, with their callbacks: written again
        #: (before anything newer) at `_retry_at`.
        self._held: list[_Part] = []
        self._retry_first_s, self._retry_max_s = retry_s
        self._retry_s = self._retry_first_s
        self._retry_at = 0.0
        #: Failures the loop has heard of (`LogFiles.attempt` on the worker's side).
        self._attempt = 0
        self._failed_since = 0.0
        #: Why the log cannot write now (None while it can): `/readyz`, `edgemon_wal_failing`.
        self.failure: str | None = None
        #: Writes that failed since the start (`edgemon_wal_write_failures_total`).
        self.failures = 0
        #: Bytes in the log files now (what a start would replay), `edgemon_wal_bytes`.
        self.size = size
        #: Bytes committed since this process started (`edgemon_wal_appended_bytes_total`):
        #: unlike `size`, never lowered by a snapshot's pruning.
        self.appended = 0

    # ------------------------------------------------------------------ on the loop
    def append(self, recv_ms: float, topic: str, payload: bytes) -> None:
        """Add one message received at `recv_ms`; it is committed with the next batch."""
        self._pending.append(encode_line(recv_ms, topic, payload))
        if not self._commits:
            self._arm()

    def when_durable(self, callback: Callable[[], None]) -> None:
        """Call `callback` once every message appended so far is on disk."""
        if self._pending:
            self._waiting.append(callback)  # the scheduled commit takes it
        elif self._in_flight is not None:
            self._in_flight.append(callback)
        elif self._held:
            self._held[-1].callbacks.append(callback)
        else:
            callback()

    @property
    def held_bytes(self) -> int:
        """Bytes appended but not durable: held after a failure, or pending."""
        return sum(len(part.data) for part in self._held) + sum(map(len, self._pending))

    def rotate(self) -> int:
        """Begin a new generation (at a snapshot); what is pending goes to the old one."""
        if self._pending:
            if self._held:  # waiting for a retry: in its turn, behind the held batches
                self._held.append(self._take_pending())
            else:
                self._commit()
        self.generation += 1
        return self.generation

    async def prune(self, covered: int) -> None:
        """Delete the files a durable snapshot covers (generation < `covered`); the held
        batches of those generations are covered too: their callbacks are called."""
        loop = asyncio.get_running_loop()
        freed = await loop.run_in_executor(self._executor, self._files.prune, covered)
        self.size -= freed
        released = [part for part in self._held if part.generation < covered]
        if released:
            self._held = [part for part in self._held if part.generation >= covered]
            for part in released:
                for callback in part.callbacks:
                    callback()

    async def close(self) -> None:
        """Commit what is pending or held (once more) and close the files (after the last
        snapshot); what still cannot be written is logged, never acknowledged."""
        if self._pending or self._held:
            done = self._commit()
            with contextlib.suppress(Exception):
                await done
            if self._held or self._pending:
                self._log.error(
                    "wal_unwritten",
                    dir=str(self._directory),
                    bytes=self.held_bytes,
                    error=self.failure,
                    effect="not acknowledged: the broker delivers them again to the next run",
                )
        await asyncio.get_running_loop().run_in_executor(self._executor, self._files.close)

    def _arm(self) -> None:
        """Make sure a commit starts for what is pending or held: in this turn of the loop if
        the window since the last start has passed (and no retry is awaited), else by a
        timer two windows after it, unless a message arriving after the window starts it
        first (no wake-up of its own)."""
        if not (self._pending or self._held):
            return
        handle = self._kick_handle
        if handle is not None and not isinstance(handle, asyncio.TimerHandle):
            return  # it starts in this turn already
        loop = asyncio.get_running_loop()
        if self._held:
            if handle is None:
                self._kick_handle = loop.call_at(self._retry_at, self._kick)
        elif loop.time() >= self._last_start + self._window_s:
            if handle is not None:
                handle.cancel()
            self._kick_handle = loop.call_soon(self._kick)
        elif handle is None:
            self._kick_handle = loop.call_at(self._last_start + 2 * self._window_s, self._kick)

    def _kick(self) -> None:
        self._kick_handle = None
        if self._commits:
            return  # its end arms the next one
        if self._held and asyncio.get_running_loop().time() < self._retry_at:
            self._arm()
        elif self._pending or self._held:
            self._commit()

    def _take_pending(self) -> _Part:
        part = _Part(self.generation, b"".join(self._pending), self._waiting)
        self._pending = []
        self._waiting = []
        return part

    def _commit(self) -> asyncio.Future[float]:
        """Write the held batches, then what is pending, as one commit."""
        if self._kick_handle is not None:
            self._kick_handle.cancel()
            self._kick_handle = None
        loop = asyncio.get_running_loop()
        self._last_start = loop.time()
        parts, self._held = self._held, []
        if self._pending:
            parts.append(self._take_pending())
        self._in_flight = parts[-1].callbacks if parts else None
        self._commits += 1
        future = loop.run_in_executor(
            self._executor,
            self._files.write,
            [(part.generation, part.data) for part in parts],
            self._attempt,
        )
        future.add_done_callback(lambda done: self._committed(done, parts))
        return future

    def _committed(self, done: asyncio.Future[float], parts: list[_Part]) -> None:
        self._commits -= 1
        if parts and self._in_flight is parts[-1].callbacks:
            self._in_flight = None
        error = None if done.cancelled() else done.exception()
        if error is None and not done.cancelled():
            size = sum(len(part.data) for part in parts)
            self.size += size
            self.appended += size
            self._on_commit(done.result())
            if self.failure is not None:
                self._recovered()
            for part in parts:
                for callback in part.callbacks:
                    callback()
        else:
            if not isinstance(error, SkippedError):
                self._failed(error)
            self._held.extend(parts)  # in order, ahead of what is pending
        if not self._commits:
            self._arm()

    def _failed(self, error: BaseException | None) -> None:
        """A write failed: held, retried after a wait that doubles; said once per spell."""
        loop = asyncio.get_running_loop()
        self._attempt += 1
        self.failures += 1
        self._retry_at = loop.time() + self._retry_s
        self._retry_s = min(self._retry_max_s, 2 * self._retry_s)
        if self.failure is None:
            self._failed_since = loop.time()
            self._log.error(
                "wal_failed",
                dir=str(self._directory),
                error=str(error),
                effect="messages are not acknowledged until the log can write them again; "
                "the broker keeps them meanwhile",
            )
        self.failure = f"the write-ahead log cannot write ({error})"

    def _recovered(self) -> None:
        loop = asyncio.get_running_loop()
        self._log.warning(
            "wal_recovered",
            dir=str(self._directory),
            failed_s=round(loop.time() - self._failed_since, 3),
            failures=self.failures,
        )
        self.failure = None
        self._retry_s = self._retry_first_s
