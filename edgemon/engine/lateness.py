"""Late and out-of-order delivery (docs/semantics.md): what a device does so that its record follows
its own times while its live decisions follow what edgemon knows.

Underruns begin provisional; the device's event time, `allowed_lateness_ms` or the removal of
the stream confirms them, and a chunk that reached the player before one retracts it. Chunks
that arrive ahead of a missing `seq` wait in their stream's reorder buffer. Both waits are
deadlines in the device's timer heap. `docs/semantics.md` states the rules.

The device's lateness **horizon** is the instant before which it no longer waits for late
chunks: `allowed_lateness_ms` behind the instant it has reached, frozen while edgemon's input
is interrupted and until the wait restarted afterwards has run out (the rule that confirms a
provisional underrun for want of late chunks). It never decreases. A confirmed underrun is
not ended before the horizon at the time its ending chunk arrived, so the time of an ongoing
confirmed underrun up to the horizon is settled: `DeviceView.underrun_ms` counts it, and that
count can never step back (a chunk later than the lateness cannot shorten what was counted).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgemon.engine.headroom import INF
from edgemon.engine.outputs import (
    UnderrunBegan,
    UnderrunConfirmed,
    UnderrunEnded,
    UnderrunRetracted,
)
from edgemon.engine.timers import ConfirmDeadline, HoldEnd

if TYPE_CHECKING:
    from collections.abc import Iterable

    from edgemon.engine.device_clock import DeviceClock
    from edgemon.engine.outputs import Output
    from edgemon.engine.reorder_buffer import Held
    from edgemon.engine.stats import DeviceStats
    from edgemon.engine.stream import Stream
    from edgemon.engine.timers import TimerHeap


class LatenessState:
    """A device's late delivery: a part a `Device` holds, owning its event time, its
    provisional and open underruns, its horizon and its waits for late chunks. It shares the
    device's clock, stats and timer heap; the device gives it `allowed_ms` (the configured
    `allowed_lateness_ms`). The reorder buffers' chunks are applied by the device's `Applier`
    (`edgemon.engine.reorder_release` says when)."""

    __slots__ = (
        "_clock",
        "_device_id",
        "_stats",
        "_timers",
        "allowed_ms",
        "confirm_held",
        "event_time",
        "horizon",
        "open_underruns",
        "patient_wall",
        "provisional",
    )

    def __init__(
        self,
        device_id: str,
        *,
        allowed_ms: float,
        clock: DeviceClock,
        stats: DeviceStats,
        timers: TimerHeap,
    ) -> None:
        self._device_id = device_id
        self._clock = clock
        self._stats = stats
        self._timers = timers
        #: How long the device waits for late chunks (`allowed_lateness_ms`).
        self.allowed_ms = allowed_ms
        #: The device's event time: the largest `t_ms` it has reported.
        self.event_time = -INF
        #: Streams whose current underrun is provisional, by id.
        self.provisional: dict[str, Stream] = {}
        #: Streams in a confirmed underrun still going on, by id.
        self.open_underruns: dict[str, Stream] = {}
        #: No underrun ends before this instant any more (see the module docstring).
        self.horizon = -INF
        #: While edgemon's input is interrupted, lateness confirms nothing (it waits), and
        #: after it, not before this wall time: the backlog gets its full lateness.
        self.confirm_held = False
        self.patient_wall = -INF

    def advance_horizon(self, reached: float, wall_ms: float) -> None:
        """The device's clock reached `reached` at wall time `wall_ms`: move the horizon on."""
        horizon = reached - self.allowed_ms
        if horizon > self.horizon and not self.confirm_held and wall_ms >= self.patient_wall:
            self.horizon = horizon

    def chunk_in_underrun(
        self, stream: Stream, t: float, at: float, out: list[Output], floor: float
    ) -> None:
        """A chunk reached the player at `t` while the stream was in underrun since `u`; it
        arrived when the horizon was at `floor`."""
        since = stream.underrun_since
        assert since is not None
        if stream.underrun_provisional:
            if t <= since:
                # It reached the player before `u` and moved `u` later: by the device's own
                # times there was no underrun at `u` (if the buffer is still empty, the
                # refresh that follows finds when it really ran dry).
                self.retract(stream, at, out)
                return
            self.confirm(stream, at, out)
        if stream.start + stream.buffered > t:
            # Later than the lateness: the time up to the horizon was settled, it stays.
            end = t if t > floor else floor
            self.end_underrun(stream, end if end > since else since, at, out)

    def begin_underrun(self, stream: Stream, u: float, now: float, out: list[Output]) -> None:
        """An underrun began at `u` (≤ `now`): announced if edgemon's clock is at `u` now."""
        stream.underrun_since = u
        stream.underrun_provisional = True
        stream.underrun_published = u == now
        if stream.underrun_published:
            out.append(UnderrunBegan(self._device_id, stream.id, u))
        self.provisional[stream.id] = stream
        if not self.recheck(stream, now, out):
            self._timers.push(self.lateness_due(u), 0, ConfirmDeadline(stream, u))

    def lateness_due(self, u: float) -> float:
        """When a provisional underrun at `u` stops waiting for late chunks."""
        return self.patient(u + self.allowed_ms)

    def hold_due(self, held: Held) -> float:
        """When the hole before the lowest held chunk is declared a gap."""
        return self.patient(held.first_arrival() + self.allowed_ms)

    def patient(self, due: float) -> float:
        """`due`, but not before the wait restarted after an interruption has run out."""
        patient = self.patient_wall - self._clock.offset_ms
        return due if due > patient else patient

    def recheck(self, stream: Stream, now: float, out: list[Output]) -> bool:
        """Confirm a provisional underrun whose instant the device's time has passed."""
        if not stream.underrun_provisional or stream.held is not None:
            return False
        u = stream.underrun_since
        assert u is not None
        if u < self.event_time or (self.lateness_due(u) <= now and not self.confirm_held):
            self.confirm(stream, now, out)
            return True
        return False

    def pass_event_time(self, now: float, out: list[Output]) -> None:
        """The device's event time moved on: provisional underruns before it are confirmed."""
        t_ms = self.event_time
        for stream in [s for s in self.provisional.values() if s.underrun_since < t_ms]:  # type: ignore[operator]
            self.recheck(stream, now, out)

    def confirm(self, stream: Stream, now: float, out: list[Output]) -> None:
        u = stream.underrun_since
        assert u is not None
        stream.underrun_provisional = False
        del self.provisional[stream.id]
        self.open_underruns[stream.id] = stream
        stream.underruns += 1
        self._stats.underruns += 1
        out.append(UnderrunConfirmed(self._device_id, stream.id, u, now, stream.underrun_published))

    def retract(self, stream: Stream, now: float, out: list[Output]) -> None:
        u = stream.underrun_since
        assert u is not None
        stream.underrun_since = None
        stream.underrun_provisional = False
        del self.provisional[stream.id]
        if stream.underrun_published:
            self._stats.underruns_retracted += 1
            out.append(UnderrunRetracted(self._device_id, stream.id, u, now))

    def end_underrun(self, stream: Stream, end: float, at: float, out: list[Output]) -> None:
        """A confirmed underrun ended at `end` (announced at `at`)."""
        since = stream.underrun_since
        assert since is not None
        duration = max(0.0, end - since)
        stream.underrun_since = None
        self.open_underruns.pop(stream.id, None)
        stream.underrun_ms += duration
        if duration > stream.longest_gap_ms:
            stream.longest_gap_ms = duration
        self._stats.underrun_ms += duration
        out.append(UnderrunEnded(self._device_id, stream.id, at, duration))

    def adopt(self, stream: Stream) -> None:
        """A stream restored from a snapshot: its underrun is tracked again, and the waits of
        a provisional one and of its held chunks are armed afresh."""
        u = stream.underrun_since
        if u is not None:
            if not stream.underrun_provisional:
                self.open_underruns[stream.id] = stream
            else:
                self.provisional[stream.id] = stream
                self._timers.push(self.lateness_due(u), 0, ConfirmDeadline(stream, u))
        if stream.held is not None:
            self._timers.push(self.hold_due(stream.held), -1, HoldEnd(stream))

    def hold_confirmations(self) -> None:
        """edgemon's input is interrupted: late chunks cannot arrive, so lateness waits."""
        self.confirm_held = True

    def resume_confirmations(self, now: float, wall_ms: float, streams: Iterable[Stream]) -> None:
        """Input flows again at `now` (wall time `wall_ms`): every wait for late chunks (of
        provisional underruns, and of the held chunks of `streams`) starts afresh from then."""
        self.confirm_held = False
        lateness = self.allowed_ms
        self.patient_wall = wall_ms + lateness
        for stream in self.provisional.values():
            assert stream.underrun_since is not None
            self._timers.push(now + lateness, 0, ConfirmDeadline(stream, stream.underrun_since))
        for stream in streams:
            if stream.held is not None:
                self._timers.push(self.hold_due(stream.held), -1, HoldEnd(stream))

    def deadline(self, what: ConfirmDeadline, now: float, out: list[Output]) -> None:
        """A provisional underrun's confirmation deadline came (its stream is the device's,
        and confirmations are not held)."""
        stream = what.stream
        if stream.underrun_provisional and stream.underrun_since == what.u:
            due = self.lateness_due(what.u)
            if due > now:  # the wait moved (a clock offset or a reload changed it)
                self._timers.push(due, 0, ConfirmDeadline(stream, what.u))
            elif stream.held is None:  # else confirmed once its held chunks are applied
                self.confirm(stream, now, out)
