"""Mapping edgemon's wall clock onto a device's clock (docs/semantics.md, docs/semantics.md)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from edgemon.engine.device_clock import MAX_JUMP_MS, DeviceClock

#: Message histories: (wall time step, device times of its events): near the wall time, or
#: far ahead of it.
_MESSAGES = st.lists(
    st.tuples(
        st.sampled_from((0, 1, 500, 30_000)),
        st.lists(st.sampled_from((-200, -50, 0, 0, 10, 50, 700_000)), min_size=1, max_size=6),
    ),
    min_size=1,
    max_size=12,
)


def test_offset_is_the_smallest_delay_seen() -> None:
    """The offset is min(recv − t): the fastest delivery defines the device's clock."""
    clock = DeviceClock(trust=False, window_ms=60_000)
    clock.observe(1_000, 900)
    clock.observe(1_100, 1_030)
    clock.observe(1_200, 1_050)
    assert clock.offset_ms == 70
    assert clock.now(2_000) == 1_930


def test_old_minima_leave_the_window() -> None:
    """After the window, an old minimum no longer counts and the offset follows the drift."""
    clock = DeviceClock(trust=False, window_ms=60_000)
    clock.observe(0, -10)  # delay 10
    clock.observe(30_000, 29_950)  # delay 50
    assert clock.offset_ms == 10
    clock.observe(60_001, 59_951)  # the first sample is now older than 60 s
    assert clock.offset_ms == 50


def test_trust_mode_uses_edgemon_time_as_device_time() -> None:
    """With clock = "trust" the offset stays 0 whatever the events say."""
    clock = DeviceClock(trust=True, window_ms=60_000)
    clock.observe(1_000, 500)
    assert clock.offset_ms == 0
    assert clock.now(1_000) == 1_000


def test_device_time_never_runs_back() -> None:
    """Once reached, a device instant stays reached even if the offset grows."""
    clock = DeviceClock(trust=False, window_ms=1_000)
    clock.observe(0, 0)
    clock.reach(500, 500)
    clock.observe(2_000, 1_000)  # offset jumps from 0 to 1000
    assert clock.now(1_200) == 500
    assert clock.now(2_000) == 1_000


def test_to_wall_inverts_now_and_reports_reached_instants_at_their_wall_time() -> None:
    """A future device instant maps to wall = t + offset; a reached one to when it was reached."""
    clock = DeviceClock(trust=False, window_ms=60_000)
    clock.observe(1_050, 1_000)
    clock.reach(1_000, 1_050)
    assert clock.to_wall(1_200) == 1_250
    assert clock.to_wall(1_000) == 1_050
    assert clock.to_wall(900) == 1_050


def test_an_event_far_ahead_of_the_clock_is_refused() -> None:
    """An event claiming to be more than 10 minutes ahead of the device's estimated clock is
    refused; events within that are taken."""
    clock = DeviceClock(trust=False, window_ms=60_000)
    assert clock.admits(1_000, 1_000)
    clock.observe(1_000, 1_000)
    assert clock.admits(2_000, 2_000 + 600_000)
    assert not clock.admits(2_000, 2_000 + 3 * 365 * 86_400_000)


def test_a_clock_step_reported_for_a_whole_window_is_believed() -> None:
    """A device that keeps reporting a time far ahead for a whole window has stepped its
    clock: from then on its events are taken and the estimate starts afresh."""
    clock = DeviceClock(trust=False, window_ms=60_000)
    clock.observe(0, 0)
    step = 3_600_000.0
    assert not clock.admits(1_000, 1_000 + step)
    assert not clock.admits(30_000, 30_000 + step)
    assert clock.admits(61_000, 61_000 + step)
    clock.observe(61_000, 61_000 + step)
    assert clock.offset_ms == -step


def test_a_sane_event_ends_a_run_of_far_ahead_ones() -> None:
    """A single far-ahead event among sane ones never accumulates into a clock step."""
    clock = DeviceClock(trust=False, window_ms=60_000)
    clock.observe(0, 0)
    far = 10**12
    assert not clock.admits(1_000, far)
    assert clock.admits(50_000, 50_000)
    assert not clock.admits(70_000, far)


def test_trust_mode_refuses_times_far_ahead_of_edgemon() -> None:
    """With a trusted clock, "ahead" is measured against edgemon's own time."""
    clock = DeviceClock(trust=True, window_ms=60_000)
    assert clock.admits(1_000, 1_000 + 600_000)
    assert not clock.admits(1_000, 1_000 + 600_001)


def test_trust_mode_believes_a_real_clock_step_for_good() -> None:
    """With a trusted clock, a device whose clock really stepped an hour ahead (one event a
    second) is refused for one window only; then every event is taken, and its time runs on
    with edgemon's instead of standing still at the last admitted event (which would refuse
    59 events of every 60, time moving only with the one admitted)."""
    clock = DeviceClock(trust=True, window_ms=60_000)
    step = 3_600_000.0
    refused = 0
    for second in range(300):
        recv = 1_000.0 * second
        if clock.admits(recv, recv + step):
            clock.observe(recv, recv + step)
            clock.reach(recv + step, recv)
        else:
            refused += 1
    assert refused == 60
    assert clock.now(300_500.0) == 300_500.0 + step


def _fed(trust: bool, messages: list[tuple[int, list[int]]], *, whole: bool) -> list[object]:
    """What a clock says after each message, its events admitted and observed one by one or
    (`whole`) by the O(1) methods for a message."""
    clock = DeviceClock(trust=trust, window_ms=20_000)
    said: list[object] = []
    recv = 1_000.0
    for step, offsets in messages:
        recv += step
        times = [recv + offset for offset in offsets]
        newest = max(times)
        if whole:
            admitted = clock.admits_up_to(recv, newest) or all(clock.admits(recv, t) for t in times)
            clock.observe_all(recv, times, newest)
        else:
            admitted = all(clock.admits(recv, t) for t in times)
            for t in times:
                clock.observe(recv, t)
        said.append((admitted, clock.offset_ms, clock.now(recv + 5)))
    return said


@given(st.booleans(), _MESSAGES)
def test_a_message_observed_whole_is_observed_event_by_event(
    trust: bool, messages: list[tuple[int, list[int]]]
) -> None:
    """A message's events admitted and observed in O(1) (`admits_up_to`, `observe_all`) leave
    the clock as admitting and observing each in turn does: the same verdicts and offsets
    then and at every later message (the window's minima are the same)."""
    assert _fed(trust, messages, whole=True) == _fed(trust, messages, whole=False)


def test_admits_up_to_defers_to_admits_for_a_message_far_ahead() -> None:
    """`admits_up_to` only says yes in O(1): a message with an event far ahead is left to
    `admits` of each, which keeps the run of far-ahead events it has seen."""
    clock = DeviceClock(trust=False, window_ms=60_000)
    clock.observe(0, 0)
    far = 1_000 + MAX_JUMP_MS + 1
    assert clock.admits_up_to(1_000, 1_000)
    assert not clock.admits_up_to(1_000, far)
    assert not clock.admits(1_000, far)
    assert not clock.admits_up_to(61_000, 60_000 + far)
    assert clock.admits(61_000, 60_000 + far)  # believed after a whole window
