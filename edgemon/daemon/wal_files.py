"""The write-ahead log's files, as its worker thread writes them (`edgemon.daemon.wal`).

One file per generation, `wal.<generation>.jsonl`, in the state directory. A write hands over
one or more parts (generation, bytes) and makes them durable in order: write, flush,
`fdatasync`. What is known durable of each file is kept (`_good`): a write that fails leaves
no half of itself behind, because every file it touched is cut back to that size, at once if
possible, else before the next write to it. So a retried write never repeats lines (a replay
would apply them twice) and never leaves a torn one in the middle of the log.

Writes queued behind one that failed do not run (`SkippedError`): they go back to the log in
order, behind the failed one, for the retry. `attempt` tells them apart: each failure ends
an attempt, and a write made before the loop heard of it belongs to the old one.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from typing import TYPE_CHECKING, BinaryIO

from edgemon.errors import EdgemonError

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

__all__ = ["LogFiles", "SkippedError", "generations", "wal_path"]

_NAME = re.compile(r"^wal\.(\d{1,12})\.jsonl$")


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


class SkippedError(EdgemonError):
    """A write queued behind one that failed: not tried (it is retried after that one)."""


class LogFiles:
    """The open files of the log and how much of each is durable (worker thread only)."""

    __slots__ = ("_directory", "_files", "_good", "attempt")

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._files: dict[int, BinaryIO] = {}
        #: Bytes of each generation's file known durable (what a failed write is cut back to).
        self._good: dict[int, int] = {}
        #: Writes of another attempt are skipped (one failure ends an attempt).
        self.attempt = 0

    def write(self, parts: Sequence[tuple[int, bytes]], attempt: int) -> float:
        """Make `parts` durable, in order: seconds taken. On failure every file touched is cut
        back to what was durable before, the attempt ends, and the error is raised."""
        if attempt != self.attempt:
            raise SkippedError
        began = time.perf_counter()
        done: dict[int, int] = {}
        try:
            for generation, data in parts:
                file = self._open(generation)
                file.write(data)
                file.flush()
                os.fdatasync(file.fileno())
                done[generation] = done.get(generation, self._good[generation]) + len(data)
        except BaseException:
            self.attempt += 1
            for generation, _ in parts:
                self._cut_back(generation)
            raise
        self._good.update(done)
        return time.perf_counter() - began

    def _open(self, generation: int) -> BinaryIO:
        """The file of `generation`, open for appending, holding exactly its durable bytes."""
        file = self._files.get(generation)
        if file is None:
            for old in [g for g in self._files if g < generation]:
                self._files.pop(old).close()
            file = wal_path(self._directory, generation).open("ab")
            self._files[generation] = file
            size = os.fstat(file.fileno()).st_size
            good = self._good.setdefault(generation, size)
            if size != good:  # what a failed write left
                os.ftruncate(file.fileno(), good)
            _sync_directory(self._directory)  # the new file's name survives a power loss
        return file

    def _cut_back(self, generation: int) -> None:
        """After a failure: the file closed (opened afresh by the next write), cut back to its
        durable size now if possible (else by `_open` before the next write)."""
        file = self._files.pop(generation, None)
        if file is None or generation not in self._good:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(file.fileno(), self._good[generation])
        with contextlib.suppress(OSError):
            file.close()

    def prune(self, covered: int) -> int:
        """Delete the files of generations before `covered`: the bytes freed."""
        freed = 0
        for generation in generations(self._directory):
            if generation >= covered:
                break
            file = self._files.pop(generation, None)
            if file is not None:
                file.close()
            self._good.pop(generation, None)
            path = wal_path(self._directory, generation)
            with contextlib.suppress(FileNotFoundError):
                freed += path.stat().st_size
                path.unlink()
        return freed

    def close(self) -> None:
        """Close every file."""
        for file in self._files.values():
            with contextlib.suppress(OSError):
                file.close()
        self._files.clear()


def _sync_directory(directory: Path) -> None:
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)
