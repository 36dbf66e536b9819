"""Events are decoded by msgspec now (its constraints, its parser, pydantic-core's parser for
NaN and ±Infinity): every verdict is the one the pydantic-core decoder it replaced gave.

The reference (`pydantic_events`) is that decoder, the event definitions validated by
pydantic-core in strict JSON mode, discriminated on `type`. Each generated event object must
be accepted by both with the same values, or rejected by both (the detail of a rejection is
worded differently; its `result` label, `invalid_event`, is the same). Through JSON text, as
the wire carries it: NaN and ±Infinity as their (non-standard) literals.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import msgspec
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from edgemon.wire.decode import Problem, decode_events

from properties import examples
from pydantic_events import OLD

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
    return "accepted", msgspec.to_builtins(item)


def old_verdict(payload: bytes) -> tuple[str, dict[str, Any] | str]:
    """What the Python predicates made of it."""
    try:
        event = OLD.validate_json(payload, strict=True)
    except ValidationError:
        return "rejected", "invalid_event"
    return "accepted", dataclasses.asdict(event)


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
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
