"""The events a device reports (SPEC §1), as the engine consumes them.

The annotations carry the wire constraints (annotated-types, understood by pydantic), so the
wire layer validates JSON straight into these values: one definition, parsed once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from annotated_types import Ge, Gt, Le, MaxLen

from edgemon.engine.config import PlayerModel  # noqa: TC001 - pydantic reads the annotations

if TYPE_CHECKING:
    from collections.abc import Callable

_STREAM_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"
_STREAM_ID = re.compile(_STREAM_ID_PATTERN.removeprefix("^").removesuffix("$"))

#: Largest time the wire accepts: beyond 2**53 float milliseconds stop being exact.
MAX_TIME_MS = float(2**53)


def valid_stream_id(text: str) -> bool:
    """`[A-Za-z0-9._:-]{1,128}` (SPEC §1)."""
    return _STREAM_ID.fullmatch(text) is not None


class _Checked:
    """Annotation metadata that a validator built from these annotations (pydantic, in the
    wire layer) runs in its own compiled code: no Python call per event. It only adds keys
    to the schema the validator built for the annotated type; the engine does not need it.

    `pattern`: the whole string matches (`$` is the end of the text, not before a newline);
    `finite`: NaN and ±Infinity are refused (a JSON literal, or a number that overflows).
    """

    __slots__ = ("_keys",)

    def __init__(self, **keys: object) -> None:
        self._keys = keys

    def __get_pydantic_core_schema__(
        self, source: Any, handler: Callable[[Any], dict[str, Any]]
    ) -> dict[str, Any]:
        return {**handler(source), **self._keys}


StreamId = Annotated[str, _Checked(pattern=_STREAM_ID_PATTERN)]
TimeMs = Annotated[float, Ge(0), Le(MAX_TIME_MS), _Checked(allow_inf_nan=False)]
AudioMs = Annotated[float, Gt(0), Le(600_000)]
DelayMs = Annotated[float, Ge(0), Le(3_600_000)]
MarginMs = Annotated[float, Ge(0), Le(60_000)]
Seq = Annotated[int, Ge(0), Le(2**53)]
Reason = Annotated[str, MaxLen(64)]


@dataclass(frozen=True, slots=True, kw_only=True)
class StartEvent:
    """A stream begins; the player may start later (`play_start_ms`)."""

    type: Literal["start"]
    stream: StreamId
    t_ms: TimeMs
    play_start_ms: TimeMs | None = None
    margin_ms: MarginMs | None = None
    player: PlayerModel | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkEvent:
    """A chunk of `audio_ms` reached the player at `t_ms`."""

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
class EndEvent:
    """The stream ended (`completed`, `cancelled`, `error`, …)."""

    type: Literal["end"]
    stream: StreamId
    t_ms: TimeMs
    reason: Reason | None = None


Event = StartEvent | ChunkEvent | EndEvent
