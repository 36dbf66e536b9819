"""The wire checks run in pydantic-core now (stream-id pattern, finite times): every verdict is
the one the Python predicates they replaced gave.

The reference below is the event definitions as they were, with `Predicate(valid_stream_id)`
and `Predicate(math.isfinite)`, validated by pydantic the same way (strict JSON, discriminated
on `type`). Each generated event object must be accepted by both with the same values, or
rejected by both (the detail of a rejection may be worded differently; its `result` label,
`invalid_event`, is the same).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from annotated_types import Ge, Gt, Le, MaxLen, Predicate
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import Field, TypeAdapter, ValidationError

from edgemon.engine.config import PlayerModel  # noqa: TC001 - pydantic reads the annotations
from edgemon.engine.events import MAX_TIME_MS
from edgemon.wire.decode import Problem, decode_events

_OLD_STREAM_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def valid_stream_id(text: str) -> bool:
    """The predicate as it was."""
    return _OLD_STREAM_ID.fullmatch(text) is not None


StreamId = Annotated[str, Predicate(valid_stream_id)]
TimeMs = Annotated[float, Predicate(math.isfinite), Ge(0), Le(MAX_TIME_MS)]
AudioMs = Annotated[float, Gt(0), Le(600_000)]
DelayMs = Annotated[float, Ge(0), Le(3_600_000)]
MarginMs = Annotated[float, Ge(0), Le(60_000)]
Seq = Annotated[int, Ge(0), Le(2**53)]
Reason = Annotated[str, MaxLen(64)]


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


OLD: TypeAdapter[Any] = TypeAdapter(
    Annotated[OldStart | OldChunk | OldEnd, Field(discriminator="type")]
)

STREAM_CHARS = st.sampled_from("aZ09._:-") | st.sampled_from([" ", "\n", "/", "é", "\u2028"])
STREAMS = st.text(STREAM_CHARS, max_size=130) | st.sampled_from(["a" * 128, "a" * 129, "a\n"])
NUMBERS = (
    st.floats(allow_nan=True, allow_infinity=True)
    | st.integers(-5, 2**54)
    | st.sampled_from([0, 0.0, -0.0, 2**53, 2**53 + 1, float(2**53), 1e308, 10**400, 600_000])
)
VALUES = NUMBERS | st.none() | st.booleans() | st.text(max_size=3)


def verdict(payload: bytes) -> tuple[str, dict[str, Any] | str]:
    """What edgemon makes of one event object now: its fields, or the result label."""
    decoded = decode_events(payload, max_bytes=1 << 20, max_batch=10)
    assert isinstance(decoded, list)
    (item,) = decoded
    if isinstance(item, Problem):
        return "rejected", item.reason
    return "accepted", dataclasses.asdict(item)


def old_verdict(payload: bytes) -> tuple[str, dict[str, Any] | str]:
    """What the Python predicates made of it."""
    try:
        event = OLD.validate_json(payload, strict=True)
    except ValidationError:
        return "rejected", "invalid_event"
    return "accepted", dataclasses.asdict(event)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(["chunk", "start", "end"]),
    stream=STREAMS | VALUES,
    t_ms=NUMBERS | VALUES,
    others=st.dictionaries(
        st.sampled_from(["seq", "audio_ms", "play_start_ms", "audio_total_ms", "eta_ms"]),
        NUMBERS | VALUES,
    ),
)
@example(kind="chunk", stream="s", t_ms=math.nan, others={"seq": 0, "audio_ms": 1})
@example(kind="end", stream="s\n", t_ms=1, others={})
def test_every_verdict_is_the_old_one(
    kind: str, stream: object, t_ms: object, others: dict[str, object]
) -> None:
    """Accepted by both with equal values, or rejected by both as `invalid_event`."""
    obj: dict[str, object] = {"type": kind, "stream": stream, "t_ms": t_ms}
    if kind == "chunk":
        obj |= {"seq": 0, "audio_ms": 10}
    obj |= others
    payload = json.dumps(obj).encode()  # NaN and ±Infinity as their JSON literals
    new, old = verdict(payload), old_verdict(payload)
    if new[0] == old[0] == "accepted":
        assert json.dumps(new[1]) == json.dumps(old[1])  # equal, NaN-free, same int/float
    assert new == old or (new[0] == old[0] == "accepted")
