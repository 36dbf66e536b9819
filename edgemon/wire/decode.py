"""Payload → validated values, one verdict per event (SPEC §1, §7).

A payload is parsed once. A batch is validated event by event, so one bad event does not
cost the others; what cannot be applied comes back as a `(reason, detail)` value, never as an
exception.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from edgemon.engine.events import ChunkEvent, EndEvent, Event, StartEvent
from edgemon.engine.kv import KVConfigError, verdict_from_engine_object
from edgemon.engine.tts import TtsEngineInfo

_ONE_EVENT = Annotated[StartEvent | ChunkEvent | EndEvent, Field(discriminator="type")]
# Whatever fails as an event is kept raw (left to right: try the event first), so one bad
# event of a batch costs only itself; only malformed JSON fails the whole payload.
_ITEM = Annotated[_ONE_EVENT | Any, Field(union_mode="left_to_right")]
_PAYLOAD: TypeAdapter[Any] = TypeAdapter(
    Annotated[_ONE_EVENT | list[_ITEM] | Any, Field(union_mode="left_to_right")]
)
_EVENT: TypeAdapter[Event] = TypeAdapter(_ONE_EVENT)
_EVENT_TYPES = (StartEvent, ChunkEvent, EndEvent)


@dataclass(frozen=True, slots=True)
class Problem:
    """Why a message or an event was not applied: a `result` label and a short detail."""

    reason: str
    detail: str


def decode_events(  # noqa: PLR0911 - one return per kind of payload
    payload: bytes, *, max_bytes: int, max_batch: int
) -> list[Event | Problem] | Problem:
    """Each event of an events payload (an object or an array of them), validated alone.

    The payload is parsed and validated in one pass, in strict JSON mode: `1.0` is not a
    `seq`, `"1"` is not a number, `1` is not `true`.
    """
    if len(payload) > max_bytes:
        return Problem("oversized", f"payload of {len(payload)} bytes > {max_bytes}")
    try:
        value = _PAYLOAD.validate_json(payload, strict=True)
    except ValidationError as exc:
        return Problem("invalid_json", _describe(exc))
    if isinstance(value, _EVENT_TYPES):
        return [value]
    if isinstance(value, list):
        if len(value) > max_batch:
            return Problem("oversized", f"batch of {len(value)} events > {max_batch}")
        if not value:
            return Problem("invalid_event", "empty batch")
        return [item if isinstance(item, _EVENT_TYPES) else _explain(item) for item in value]
    if isinstance(value, dict):
        return [_explain(value)]
    return Problem("invalid_event", f"expected an object or an array, got {_kind(value)}")


def _explain(item: Any) -> Problem:
    """Why a JSON value is not an event (the rare path: validated once more for the reason)."""
    if not isinstance(item, dict):
        return Problem("invalid_event", f"expected an event object, got {_kind(item)}")
    try:
        _EVENT.validate_json(json.dumps(item), strict=True)
    except ValidationError as exc:
        return Problem("invalid_event", _describe(exc))
    return Problem("invalid_event", "not an event")  # pragma: no cover - validated above


def parse_json(payload: bytes, *, max_bytes: int) -> Any | Problem:
    """The JSON value of a payload (for the rare engine objects), or the problem with it."""
    if len(payload) > max_bytes:
        return Problem("oversized", f"payload of {len(payload)} bytes > {max_bytes}")
    try:
        # Decoded first: SPEC §1 payloads are UTF-8, and json.loads(bytes) would guess UTF-16/32.
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
    """SPEC §1 engine object; everything optional, unknown fields ignored."""

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
