"""`edgemon run --record FILE`: every message as it came, and marks where the run broke off
or resumed, as trace lines that `edgemon replay` reads (docs/trace-format.md)."""

from __future__ import annotations

from typing import Any, TextIO

from edgemon.trace import TraceMark, TraceRecord, encode_mark, encode_record


class TraceRecorder:
    """Writes trace lines to `out` (None: recording is off). A write that fails (a full disk)
    stops the recording, with one error line, never the daemon."""

    __slots__ = ("_log", "_out")

    def __init__(self, out: TextIO | None, log: Any) -> None:
        self._out = out
        self._log = log

    @property
    def on(self) -> bool:
        """Whether messages are being recorded."""
        return self._out is not None

    def record(self, record: TraceRecord) -> None:
        """One message as it came."""
        if self._out is not None:
            self._write(encode_record(record))

    def mark(self, mark: TraceMark) -> None:
        """Where this run broke off or resumed (replay does the same there)."""
        if self._out is not None:
            self._write(encode_mark(mark))

    def _write(self, line: str) -> None:
        assert self._out is not None
        try:
            self._out.write(line + "\n")
        except OSError as exc:
            self._log.error("record_failed", error=str(exc))
            self._out = None
