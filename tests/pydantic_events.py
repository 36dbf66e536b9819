"""The event decoder edgemon ran before msgspec: pydantic-core, from annotated dataclasses.

It is the oracle of `test_decode_equivalence.py` (msgspec's verdicts must be these) and the
baseline of `benchmarks/decode.py` (msgspec's rate is measured against it, on the same
payloads). As edgemon had it: the events discriminated on `type`, validated in strict JSON
mode with every check in pydantic-core's compiled code (the stream-id pattern by its Rust
regex, where `$` is the end of the text; NaN and ±Infinity refused), a batch validated item by
item (a union with an `Any` fallback, left to right).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints, TypeAdapter, ValidationError

from edgemon.engine.config import PlayerModel  # noqa: TC001 - pydantic reads the annotations
from edgemon.protocol import MAX_TIME_MS

StreamId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._:-]{1,128}$")]
TimeMs = Annotated[float, Field(ge=0, le=MAX_TIME_MS, allow_inf_nan=False)]
AudioMs = Annotated[float, Field(gt=0, le=600_000)]
DelayMs = Annotated[float, Field(ge=0, le=3_600_000)]
MarginMs = Annotated[float, Field(ge=0, le=60_000)]
Seq = Annotated[int, Field(ge=0, le=2**53)]
Reason = Annotated[str, Field(max_length=64)]


@dataclass(frozen=True, slots=True, kw_only=True)
class OldStart:
    type: Literal["start"]
    stream: StreamId
    t_ms: TimeMs
    play_start_ms: TimeMs | None = None
    margin_ms: MarginMs | None = None
    player: PlayerModel | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class OldChunk:
    type: Literal["chunk"]
    stream: StreamId
    t_ms: TimeMs
    seq: Seq
    audio_ms: AudioMs
    eta_ms: DelayMs | None = None
    final: bool = False
    audio_total_ms: TimeMs | None = None
    play_start_ms: TimeMs | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class OldEnd:
    type: Literal["end"]
    stream: StreamId
    t_ms: TimeMs
    reason: Reason | None = None


OldEvent = Annotated[OldStart | OldChunk | OldEnd, Field(discriminator="type")]
OLD: TypeAdapter[OldStart | OldChunk | OldEnd] = TypeAdapter(OldEvent)
_ITEM = Annotated[OldEvent | Any, Field(union_mode="left_to_right")]
_PAYLOAD: TypeAdapter[Any] = TypeAdapter(
    Annotated[OldEvent | list[_ITEM] | Any, Field(union_mode="left_to_right")]
)
_EVENTS = (OldStart, OldChunk, OldEnd)


def old_decode(payload: bytes) -> list[OldStart | OldChunk | OldEnd | None] | None:
    """Each event of a payload, or None where it is not an event; None for invalid JSON."""
    try:
        value = _PAYLOAD.validate_json(payload, strict=True)
    except ValidationError:
        return None
    items = value if isinstance(value, list) else [value]
    return [item if isinstance(item, _EVENTS) else None for item in items]
