"""Payload → validated values, one verdict per event (docs/protocol.md, docs/reliability.md).

A payload is parsed once. A batch is validated event by event, so one bad event does not
cost the others; what cannot be applied comes back as a `(reason, detail)` value, never as an
exception.

Events are decoded by msgspec straight into the engine's event structs (2.7–2.8× pydantic-core's
rate for the same verdicts, `benchmarks/decode.py`). Its parser takes standard JSON only, so a
payload it cannot parse is parsed once more by pydantic-core's, which also reads `NaN` and
`±Infinity`: those are refused per event, as protocol.md (finite numbers) and the old decoder did.
Engine objects (rare) are still validated by pydantic; capacity objects (once a second per
device at most) as every reader of them does (`edgemon.capacity_object`).

Stream ids are matched against their pattern here, each id once (`_StreamIds`), not by msgspec
with every event (`edgemon.engine.events`). A payload with an id that does not match takes the
path of any other invalid event: each event decoded alone, and an invalid one decoded once
more with the pattern in its struct (`CheckedEvent`), for msgspec's words on what is wrong.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Annotated, Any, Literal, cast

import msgspec
import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edgemon.capacity_object import Capacity, Unreadable, read_capacity
from edgemon.engine.events import STREAM_ID_REGEX, CheckedEvent, Event
from edgemon.engine.kv import KVConfigError, verdict_from_engine_object
from edgemon.engine.tts import TtsEngineInfo

if TYPE_CHECKING:
    from collections.abc import Callable

_PAYLOAD = msgspec.json.Decoder(Event | list[Event])
_EVENT = msgspec.json.Decoder(Event)
_CHECKED = msgspec.json.Decoder(CheckedEvent)
_ITEMS = msgspec.json.Decoder(list[msgspec.Raw])
#: How msgspec matches a `Meta(pattern=...)`.
_MATCH = re.compile(STREAM_ID_REGEX).search
_STREAM_OF = attrgetter("stream")
#: Most stream ids remembered as matching (a few hundred kB at most).
MAX_KNOWN_IDS = 4096


@dataclass(frozen=True, slots=True)
class Problem:
    """Why a message or an event was not applied: a `result` label and a short detail."""

    reason: str
    detail: str


def decode_events(
    payload: bytes, *, max_bytes: int, max_batch: int
) -> list[Event | Problem] | Problem:
    """Each event of an events payload (an object or an array of them), validated alone.

    Strict JSON types: `1.0` is not a `seq`, `"1"` is not a number, `1` is not `true`.
    """
    if len(payload) > max_bytes:
        return _oversized(payload, max_bytes)
    whole = _whole(payload, max_batch)
    if whole is None:
        return _one_by_one(payload, max_batch)
    return whole if isinstance(whole, Problem) else cast("list[Event | Problem]", whole)


def parted_events(
    payload: bytes, *, max_bytes: int, max_batch: int
) -> tuple[list[Event], list[Problem]] | Problem:
    """`decode_events`, its verdicts parted: the valid events and the problems, each in their
    order (a payload decoded in one go is not looked through again)."""
    if len(payload) > max_bytes:
        return _oversized(payload, max_bytes)
    whole = _whole(payload, max_batch)
    if whole is not None:
        return whole if isinstance(whole, Problem) else (whole, [])
    verdicts = _one_by_one(payload, max_batch)
    if isinstance(verdicts, Problem):
        return verdicts
    events: list[Event] = []
    problems: list[Problem] = []
    for item in verdicts:
        if isinstance(item, Problem):
            problems.append(item)
        else:
            events.append(item)
    return events, problems


def _oversized(payload: bytes, max_bytes: int) -> Problem:
    return Problem("oversized", f"payload of {len(payload)} bytes > {max_bytes}")


def _whole(payload: bytes, max_batch: int) -> list[Event] | Problem | None:
    """Every event of a payload decoded in one go (each one valid), what is wrong with the
    batch as a whole, or None: some event is invalid, each must be decoded alone."""
    try:
        value = _PAYLOAD.decode(payload)
    except (msgspec.MsgspecError, RecursionError):
        return None
    if type(value) is list:
        problem = _batch(value, max_batch)
        if problem is not None or _IDS.all_match(value):
            return problem or value
    elif _IDS.match(value.stream):
        return [value]
    return None


class _StreamIds:
    """Stream ids known to match `STREAM_ID_REGEX`: a stream's id is matched once, not with
    every event of the stream. Bounded: forgotten all at once when full (ids come and go
    with the requests they name), then matched again as they come."""

    __slots__ = ("_known",)

    def __init__(self) -> None:
        self._known: set[str] = set()

    def all_match(self, events: list[Event]) -> bool:
        """Whether every event's stream id matches."""
        if self._known.issuperset(map(_STREAM_OF, events)):
            return True
        return all(self.match(event.stream) for event in events)

    def match(self, stream: str) -> bool:
        """Whether `stream` matches."""
        known = self._known
        if stream in known:
            return True
        if _MATCH(stream) is None:
            return False
        if len(known) >= MAX_KNOWN_IDS:
            known.clear()
        known.add(stream)
        return True


_IDS = _StreamIds()


def _batch(items: list[Any], max_batch: int) -> Problem | None:
    """What is wrong with a batch as a whole, if anything."""
    if len(items) > max_batch:
        return Problem("oversized", f"batch of {len(items)} events > {max_batch}")
    if not items:
        return Problem("invalid_event", "empty batch")
    return None


def _one_by_one(payload: bytes, max_batch: int) -> list[Event | Problem] | Problem:
    """Some event is invalid (the rare path): each one decoded alone, for its own verdict."""
    try:
        items = _ITEMS.decode(payload)
    except (msgspec.MsgspecError, RecursionError):  # not an array of standard JSON
        return _values(_parse(payload), max_batch)
    return _batch(items, max_batch) or [
        _verdict(_EVENT.decode, _CHECKED.decode, item) for item in items
    ]


def _parse(payload: bytes) -> Any:
    """The payload as JSON values. What msgspec's parser refuses (non-standard literals,
    numbers out of its range) is parsed by pydantic-core's, or is invalid JSON."""
    try:
        return msgspec.json.decode(payload)
    except (msgspec.MsgspecError, RecursionError):
        try:
            return pydantic_core.from_json(payload)
        except ValueError as exc:
            return Problem("invalid_json", _first_line(str(exc)))


def _values(value: Any, max_batch: int) -> list[Event | Problem] | Problem:
    if type(value) is list:
        return _batch(value, max_batch) or [
            _verdict(_to_event, _to_checked, item) for item in value
        ]
    if type(value) is dict:
        return [_verdict(_to_event, _to_checked, value)]
    if type(value) is Problem:
        return value
    return Problem("invalid_event", f"expected an object or an array, got {_kind(value)}")


def _to_event(value: Any) -> Event:
    event: Event = msgspec.convert(value, Event)
    return event


def _to_checked(value: Any) -> None:
    msgspec.convert(value, CheckedEvent)


def _verdict(
    decode: Callable[[Any], Event], check: Callable[[Any], object], item: Any
) -> Event | Problem:
    """The event, or what `check` (the pattern of its stream id included) says is wrong."""
    try:
        event = decode(item)
    except msgspec.ValidationError:
        pass  # msgspec's words on it come from `check`: the stream id may come first
    else:
        if _IDS.match(event.stream):
            return event
    try:
        check(item)
    except msgspec.ValidationError as exc:
        return Problem("invalid_event", _first_line(str(exc)))
    raise AssertionError(f"valid only with its stream id checked: {item!r}")


def parse_json(payload: bytes, *, max_bytes: int) -> Any | Problem:
    """The JSON value of a payload (for the rare engine objects), or the problem with it."""
    if len(payload) > max_bytes:
        return Problem("oversized", f"payload of {len(payload)} bytes > {max_bytes}")
    try:
        # Decoded first: payloads are UTF-8 (docs/protocol.md), and json.loads(bytes) would
        # guess UTF-16/32.
        return json.loads(payload.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        # UnicodeDecodeError is a ValueError; RecursionError is deeply nested JSON.
        return Problem("invalid_json", _first_line(str(exc) or type(exc).__name__))


class _Geometry(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)
    num_layers: int
    num_kv_heads: int
    head_dim: int


class _EngineObject(BaseModel):
    """docs/protocol.md engine object; everything optional, unknown fields ignored."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)
    kv_cache_bytes: int | None = None
    max_num_seqs: int | None = None
    max_model_len: int | None = None
    block_size: int | None = None
    dtype: str | None = None
    kv_cache_dtype: str | None = None
    geometry: _Geometry | None = None
    hf_config: dict[str, Any] | None = None
    hardware_class: Literal["cuda", "jetson", "x86", "arm64", "npu"] | None = None
    margin_ms: Annotated[float, Field(ge=0, le=60_000)] | None = None


_KV_KEYS = ("kv_cache_bytes", "max_num_seqs", "max_model_len", "geometry", "hf_config")


def decode_engine(value: Any) -> TtsEngineInfo | Problem:
    """An engine object as the engine uses it; a KV part that cannot be judged is kept as text."""
    if not isinstance(value, dict):
        return Problem("invalid_event", f"expected an engine object, got {_kind(value)}")
    try:
        parsed = _EngineObject.model_validate(value)
    except ValidationError as exc:
        return Problem("invalid_event", _describe(exc))
    verdict = error = None
    if any(value.get(key) is not None for key in _KV_KEYS):
        try:
            verdict = verdict_from_engine_object(value)
        except KVConfigError as exc:
            error = str(exc)
    return TtsEngineInfo(
        margin_ms=parsed.margin_ms,
        hardware_class=parsed.hardware_class,
        kv=verdict,
        kv_error=error,
    )


def decode_capacity(payload: bytes, *, max_bytes: int) -> Capacity | Problem:
    """A capacity object (`edgemon.capacity_object.read_capacity`: the one reading of it, the
    engine's middleware's too), or the problem with it."""
    if len(payload) > max_bytes:
        return _oversized(payload, max_bytes)
    read = read_capacity(payload)
    if isinstance(read, Unreadable):
        return Problem(read.reason, read.detail)
    return read


def _describe(exc: ValidationError) -> str:
    first = exc.errors(include_url=False, include_context=False, include_input=False)[0]
    where = ".".join(str(part) for part in first["loc"])
    more = exc.error_count() - 1
    text = f"{where}: {first['msg']}" if where else first["msg"]
    return _first_line(text + (f" (+{more} more)" if more else ""))


def _kind(value: Any) -> str:
    return type(value).__name__ if value is not None else "null"


def _first_line(text: str) -> str:
    return text.splitlines()[0][:200] if text else text
