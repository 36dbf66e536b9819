"""The events a device reports (docs/protocol.md, "Events"), as the engine consumes them.

They are msgspec `Struct`s tagged by `type`, and their annotations carry the wire constraints
(`msgspec.Meta`): the wire layer decodes JSON straight into these values, constraints checked
in msgspec's compiled code, one definition, parsed once. An event holds only numbers, strings
and booleans, so it is not tracked by the garbage collector (`gc=False`).

All but one: the stream id's pattern (`STREAM_ID_REGEX`). msgspec matches a pattern with a
call to Python's `re` per value, two thirds of the cost of decoding a chunk event, for a
stream that sends the same id with every chunk. So the engine's structs take any string, and
the wire layer matches each id it has not seen yet (`edgemon.wire.decode`). `CheckedEvent`
is the same events with the pattern in their annotations: what the wire layer decodes an
event with when it must say what is wrong with it, in msgspec's words.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from msgspec import Meta, Struct

from edgemon.engine.config import PlayerModel  # noqa: TC001 - msgspec reads the annotations
from edgemon.protocol import (
    MAX_AUDIO_MS,
    MAX_ETA_MS,
    MAX_MARGIN_MS,
    MAX_REASON,
    MAX_SEQ,
    MAX_TIME_MS,
    STREAM_ID_PATTERN,
)

# `\Z`, not `$`: msgspec matches with Python's `re`, where `$` also matches before a final "\n".
#: A whole stream id, as msgspec matches a pattern (`re.search`).
STREAM_ID_REGEX = rf"^{STREAM_ID_PATTERN}\Z"
StreamId = Annotated[str, Meta(pattern=STREAM_ID_REGEX)]
# The upper bounds also refuse ±Infinity (and a number that overflows); the lower ones NaN.
TimeMs = Annotated[float, Meta(ge=0, le=MAX_TIME_MS)]
AudioMs = Annotated[float, Meta(gt=0, le=MAX_AUDIO_MS)]
DelayMs = Annotated[float, Meta(ge=0, le=MAX_ETA_MS)]
MarginMs = Annotated[float, Meta(ge=0, le=MAX_MARGIN_MS)]
Seq = Annotated[int, Meta(ge=0, le=MAX_SEQ)]
Reason = Annotated[str, Meta(max_length=MAX_REASON)]


class StartEvent(Struct, tag_field="type", tag="start", frozen=True, kw_only=True, gc=False):
    """A stream begins; the player may start later (`play_start_ms`)."""

    type: ClassVar[Literal["start"]] = "start"
    stream: str  # matched against STREAM_ID_REGEX by the wire layer
    t_ms: TimeMs
    play_start_ms: TimeMs | None = None
    margin_ms: MarginMs | None = None
    player: PlayerModel | None = None


class ChunkEvent(Struct, tag_field="type", tag="chunk", frozen=True, kw_only=True, gc=False):
    """A chunk of `audio_ms` reached the player at `t_ms`."""

    type: ClassVar[Literal["chunk"]] = "chunk"
    stream: str  # matched against STREAM_ID_REGEX by the wire layer
    t_ms: TimeMs
    seq: Seq
    audio_ms: AudioMs
    eta_ms: DelayMs | None = None
    final: bool = False
    audio_total_ms: TimeMs | None = None
    play_start_ms: TimeMs | None = None


class EndEvent(Struct, tag_field="type", tag="end", frozen=True, kw_only=True, gc=False):
    """The stream ended (`completed`, `cancelled`, `error`, …)."""

    type: ClassVar[Literal["end"]] = "end"
    stream: str  # matched against STREAM_ID_REGEX by the wire layer
    t_ms: TimeMs
    reason: Reason | None = None


Event = StartEvent | ChunkEvent | EndEvent


class CheckedStart(StartEvent, tag="start", frozen=True):
    """A `start` whose stream id msgspec matches (for the verdict on an invalid one)."""

    stream: StreamId


class CheckedChunk(ChunkEvent, tag="chunk", frozen=True):
    """A chunk whose stream id msgspec matches (for the verdict on an invalid one)."""

    stream: StreamId


class CheckedEnd(EndEvent, tag="end", frozen=True):
    """An `end` whose stream id msgspec matches (for the verdict on an invalid one)."""

    stream: StreamId


CheckedEvent = CheckedStart | CheckedChunk | CheckedEnd
