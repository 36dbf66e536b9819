"""The device's late-delivery part on its own: provisional underruns, the horizon, waits."""

from __future__ import annotations

from edgemon.engine.device_clock import DeviceClock
from edgemon.engine.lateness import LatenessState
from edgemon.engine.outputs import (
    Output,
    UnderrunBegan,
    UnderrunConfirmed,
    UnderrunEnded,
    UnderrunRetracted,
)
from edgemon.engine.stats import DeviceStats
from edgemon.engine.stream import Stream
from edgemon.engine.timers import ConfirmDeadline, TimerHeap


def a_stream(stream_id: str) -> Stream:
    """A bare stream, whose underrun the part follows."""
    return Stream(
        stream_id, t_ms=0.0, rebuffer=False, margin=0.0, margin_from_start=None,
        started_by_event=False, play_start_ms=None,
    )  # fmt: skip


def a_part(allowed_ms: float) -> tuple[LatenessState, DeviceStats, TimerHeap]:
    """A lateness part with its own stats and timer heap, on a clock at offset 0."""
    stats, timers = DeviceStats(), TimerHeap()
    clock = DeviceClock(trust=True, window_ms=60_000.0)
    part = LatenessState("d", allowed_ms=allowed_ms, clock=clock, stats=stats, timers=timers)
    return part, stats, timers


def test_an_underrun_waits_for_late_chunks_then_is_confirmed_at_its_deadline() -> None:
    """An underrun at 100 is provisional and announced; its deadline is armed at 100 + the
    allowed lateness, and at that deadline it is confirmed and counted."""
    part, stats, timers = a_part(50.0)
    stream, out = a_stream("s"), list[Output]()
    part.begin_underrun(stream, 100.0, 100.0, out)
    assert out == [UnderrunBegan("d", "s", 100.0)]
    assert part.provisional == {"s": stream}
    assert timers.next_due() == 150.0
    deadline = timers.pop()
    assert isinstance(deadline, ConfirmDeadline)
    part.deadline(deadline, 150.0, out)
    assert out[1] == UnderrunConfirmed("d", "s", 100.0, 150.0, True)
    assert (part.provisional, part.open_underruns, stats.underruns) == ({}, {"s": stream}, 1)
    part.end_underrun(stream, 170.0, 180.0, out)
    assert out[2] == UnderrunEnded("d", "s", 180.0, 70.0)
    assert (part.open_underruns, stats.underrun_ms) == ({}, 70.0)


def test_a_chunk_that_reached_the_player_in_time_retracts_the_underrun() -> None:
    """A chunk played at or before the underrun's instant retracts it (counted as such, no
    underrun); the event time passing an underrun confirms it at once."""
    part, stats, _ = a_part(50.0)
    early, late, out = a_stream("early"), a_stream("late"), list[Output]()
    part.begin_underrun(early, 100.0, 100.0, out)
    part.chunk_in_underrun(early, 90.0, 110.0, out, floor=0.0)
    assert out[1] == UnderrunRetracted("d", "early", 100.0, 110.0)
    assert (early.underrun_since, stats.underruns, stats.underruns_retracted) == (None, 0, 1)
    part.begin_underrun(late, 200.0, 200.0, out)
    part.event_time = 201.0
    part.pass_event_time(205.0, out)
    assert out[3] == UnderrunConfirmed("d", "late", 200.0, 205.0, True)


def test_the_horizon_follows_the_clock_but_waits_while_input_is_held() -> None:
    """The horizon trails the instant reached by the allowed lateness and never goes back;
    held confirmations freeze it, and after a resume it waits out the lateness again."""
    part, _, _ = a_part(50.0)
    part.advance_horizon(100.0, 100.0)
    assert part.horizon == 50.0
    part.advance_horizon(80.0, 80.0)
    assert part.horizon == 50.0
    part.hold_confirmations()
    part.advance_horizon(300.0, 300.0)
    assert part.horizon == 50.0
    part.resume_confirmations(300.0, 300.0, [])
    part.advance_horizon(320.0, 320.0)
    assert part.horizon == 50.0
    part.advance_horizon(350.0, 350.0)
    assert part.horizon == 300.0
