"""Per-stream state: the fused risk/hysteresis flags and the EWMA of gaps."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from edgemon.engine.headroom import below
from edgemon.engine.stream import Phase, Stream

from properties import examples

ints = st.integers(min_value=-500, max_value=3000)


def _live_stream(
    *, buffered: float, start: float, expected: float, margin: float, rebuffer: bool
) -> Stream:
    stream = Stream(
        "s",
        t_ms=0,
        rebuffer=rebuffer,
        margin=margin,
        margin_from_start=None,
        started_by_event=False,
        play_start_ms=start,
    )
    stream.phase = Phase.LIVE
    stream.buffered = buffered
    stream.expected = expected
    return stream


@settings(max_examples=examples(400), deadline=None)
@given(
    now=ints,
    margin=st.integers(min_value=0, max_value=300),
    hysteresis=st.integers(min_value=0, max_value=100),
    buffered=st.integers(min_value=1, max_value=2000),
    start=ints,
    expected=ints,
    rebuffer=st.booleans(),
)
def test_fused_flags_equal_two_separate_threshold_checks(
    now: int, margin: int, hysteresis: int, buffered: int, start: int, expected: int, rebuffer: bool
) -> None:
    """`flags_at` is `below(margin)` and `below(margin + hysteresis)`, with the earlier change."""
    stream = _live_stream(
        buffered=buffered, start=start, expected=expected, margin=margin, rebuffer=rebuffer
    )
    risk, risk_change = below(now, margin, buffered, start, expected, rebuffer=rebuffer)
    unsafe, unsafe_change = below(
        now, margin + hysteresis, buffered, start, expected, rebuffer=rebuffer
    )
    assert stream.flags_at(now, hysteresis) == (risk, unsafe, min(risk_change, unsafe_change))


def test_a_stream_without_audio_is_never_flagged() -> None:
    """A stream waiting for its first chunk is neither at risk nor in the hysteresis band."""
    stream = _live_stream(buffered=0, start=0, expected=10_000, margin=80, rebuffer=False)
    stream.phase = Phase.WAITING
    assert stream.flags_at(500, 20) == (False, False, float("inf"))
