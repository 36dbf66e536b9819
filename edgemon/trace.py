"""The trace file of README: JSON lines `{"recv_ms", "topic", "payload" | "payload_b64"}`,
and the marks `edgemon run --record` adds where its run broke off or resumed
`{"recv_ms", "mark", "since_ms"?}` (a line with `mark` and no `topic`)."""

from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import TYPE_CHECKING

from edgemon.errors import EdgemonError

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One received MQTT message: when (edgemon's wall clock, ms), where, and what."""

    recv_ms: float
    topic: str
    payload: bytes


#: What a mark says happened at its `recv_ms` (README, "`edgemon replay`"): the daemon
#: stopped cleanly and released every throttle; it restarted, its devices' clocks resuming
#: at `since_ms` (cut out: the downtime); it published the state as of now after catching
#: up; it stood still from `since_ms` (cut out: the stall).
MARKS = frozenset({"stop", "restart", "resumed", "stall"})


@dataclass(frozen=True, slots=True)
class TraceMark:
    """Not a message: where the recording daemon's run broke off or resumed (`MARKS`)."""

    recv_ms: float
    mark: str
    since_ms: float | None = None


class TraceError(EdgemonError, ValueError):
    """A trace line that is not a record; the message says which line and why."""


def encode_record(record: TraceRecord) -> str:
    """One trace line (without the newline); raw text when the payload is UTF-8."""
    try:
        body = {"payload": record.payload.decode("utf-8")}
    except UnicodeDecodeError:
        body = {"payload_b64": base64.b64encode(record.payload).decode("ascii")}
    return json.dumps(
        {"recv_ms": record.recv_ms, "topic": record.topic, **body},
        ensure_ascii=False,
        separators=(",", ":"),
    )


def encode_mark(mark: TraceMark) -> str:
    """One mark line (without the newline)."""
    body: dict[str, object] = {"recv_ms": mark.recv_ms, "mark": mark.mark}
    if mark.since_ms is not None:
        body["since_ms"] = mark.since_ms
    return json.dumps(body, separators=(",", ":"))


def encode_line(recv_ms: float, topic: str, payload: bytes) -> bytes:
    """`encode_record(TraceRecord(recv_ms, topic, payload)) + "\n"` as UTF-8, built directly
    (a third of the time: the write-ahead log encodes every message on the hot path)."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return (encode_record(TraceRecord(recv_ms, topic, payload)) + "\n").encode()
    line = (
        f'{{"recv_ms":{float(recv_ms)!r},"topic":{encode_basestring(topic)},'
        f'"payload":{encode_basestring(text)}}}\n'
    )
    return line.encode("utf-8", "surrogatepass")


def read_records(lines: Iterable[str], *, name: str = "trace") -> Iterator[TraceRecord]:
    """Records of a trace, in file order; blank lines are skipped; unknown keys are ignored.

    Raises TraceError naming `name:line` at the first line that is not a record (a mark is
    not: `read_trace` reads both).
    """
    for entry in read_trace(lines, name=name, marks=False):
        assert isinstance(entry, TraceRecord)
        yield entry


def read_trace(
    lines: Iterable[str], *, name: str = "trace", marks: bool = True
) -> Iterator[TraceRecord | TraceMark]:
    """Records and marks of a trace, in file order (`read_records`, marks included)."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield _entry(line, marks=marks)
        except TraceError as exc:
            raise TraceError(f"{name}:{number}: {exc}") from None


def _entry(line: str, *, marks: bool) -> TraceRecord | TraceMark:
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise TraceError(f"not JSON ({exc})") from None
    except RecursionError:
        raise TraceError("not JSON (nested too deeply)") from None
    if not isinstance(obj, dict):
        raise TraceError("a record must be a JSON object")
    if marks and "mark" in obj and "topic" not in obj:
        return _mark(obj)
    topic = obj.get("topic")
    if not isinstance(topic, str):
        raise TraceError("topic must be a string")
    return TraceRecord(_recv_ms(obj.get("recv_ms")), topic, _payload(obj))


def _mark(obj: dict[str, object]) -> TraceMark:
    mark = obj["mark"]
    if not isinstance(mark, str) or mark not in MARKS:
        raise TraceError(f"mark must be one of {', '.join(sorted(MARKS))}")
    since = obj.get("since_ms")
    if since is None and mark == "stall":
        raise TraceError("a stall mark needs since_ms")
    since_ms = None if since is None else _recv_ms(since, "since_ms")
    return TraceMark(_recv_ms(obj.get("recv_ms")), mark, since_ms)


def _recv_ms(value: object, key: str = "recv_ms") -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TraceError(f"{key} must be a finite number")
    try:
        recv_ms = float(value)
    except OverflowError:  # an integer beyond the float range
        recv_ms = math.inf
    if not math.isfinite(recv_ms):
        raise TraceError(f"{key} must be a finite number")
    return recv_ms


def _payload(obj: dict[str, object]) -> bytes:
    text, b64 = obj.get("payload"), obj.get("payload_b64")
    if (text is None) == (b64 is None):
        raise TraceError("exactly one of payload and payload_b64 is required")
    if text is not None:
        if not isinstance(text, str):
            raise TraceError("payload must be a string")
        return text.encode("utf-8", errors="surrogatepass")
    if not isinstance(b64, str):
        raise TraceError("payload_b64 must be a string")
    try:
        return base64.b64decode(b64, validate=True)
    except binascii.Error as exc:
        raise TraceError(f"payload_b64 is not base64 ({exc})") from None
