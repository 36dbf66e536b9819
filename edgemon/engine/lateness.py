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
    GapDeclared,
    UnderrunBegan,
    UnderrunConfirmed,
    UnderrunRetracted,
)
from edgemon.engine.reorder import MAX_HELD, Held
from edgemon.engine.state import DeviceState
from edgemon.engine.stream import Phase

if TYPE_CHECKING:
    from edgemon.engine.events import ChunkEvent
    from edgemon.engine.outputs import Output
    from edgemon.engine.stream import Stream


class ConfirmDeadline:
    """The confirmation deadline of a stream's provisional underrun at `u`: when it is
    confirmed for want of late chunks."""

    __slots__ = ("stream", "u")

    def __init__(self, stream: Stream, u: float) -> None:
        self.stream = stream
        self.u = u


class HoldEnd:
    """When a stream's held chunks may have waited long enough (a gap is declared then)."""

    __slots__ = ("stream",)

    def __init__(self, stream: Stream) -> None:
        self.stream = stream


class LateDelivery(DeviceState):
    """The part of a `Device` that deals with late chunks (a base class of `Device`)."""

    __slots__ = ()

    if TYPE_CHECKING:

        def _end_underrun(
            self, stream: Stream, end: float, at: float, out: list[Output]
        ) -> None: ...

        def _chunk(
            self,
            event: ChunkEvent,
            at: float,
            out: list[Output],
            *,
            in_order: bool = False,
            floor: float = -INF,
        ) -> str: ...

    def __init__(self) -> None:
        #: The device's event time: the largest `t_ms` it has reported.
        self.event_time = -INF
        #: Streams whose current underrun is provisional, by id.
        self.provisional = {}
        #: Streams in a confirmed underrun still going on, by id.
        self.open_underruns = {}
        #: No underrun ends before this instant any more (see the module docstring).
        self.horizon = -INF
        #: While edgemon's input is interrupted, lateness confirms nothing (it waits), and
        #: after it, not before this wall time: the backlog gets its full lateness.
        self.confirm_held = False
        self.patient_wall = -INF

    def advance_horizon(self, reached: float, wall_ms: float) -> None:
        """The device's clock reached `reached` at wall time `wall_ms`: move the horizon on."""
        horizon = reached - self.config.slack.allowed_lateness_ms
        if horizon > self.horizon and not self.confirm_held and wall_ms >= self.patient_wall:
            self.horizon = horizon

    def _chunk_in_underrun(
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
                self._retract(stream, at, out)
                return
            self._confirm(stream, at, out)
        if stream.start + stream.buffered > t:
            # Later than the lateness: the time up to the horizon was settled, it stays.
            end = t if t > floor else floor
            self._end_underrun(stream, end if end > since else since, at, out)

    # ------------------------------------------------------------------ reorder buffer
    def _hold(self, stream: Stream, event: ChunkEvent, at: float, out: list[Output]) -> str:
        """Keep a chunk that arrived ahead of a missing `seq` (docs/semantics.md)."""
        held = stream.held
        if held is None:
            held = stream.held = Held()
        if not held.add(event, at, self.horizon):
            return "duplicate"
        if len(held) > MAX_HELD:
            self._flush_held(stream, at, out)  # too far ahead: the holes are gaps now
        else:
            self.timers.push(self._hold_due(held), -1, HoldEnd(stream))
        return "accepted"

    def _hold_due(self, held: Held) -> float:
        """When the hole before the lowest held chunk is declared a gap."""
        return self._patient(held.first_arrival() + self.config.slack.allowed_lateness_ms)

    def _patient(self, due: float) -> float:
        """`due`, but not before the wait restarted after an interruption has run out."""
        patient = self.patient_wall - self.clock.offset_ms
        return due if due > patient else patient

    def _release_held(self, stream: Stream, at: float, out: list[Output]) -> None:
        """Apply the held chunks that now follow in `seq` order."""
        held = stream.held
        assert held is not None
        while (pair := held.take(stream.last_seq + 1)) is not None:
            if stream.phase is Phase.DRAINING or stream.id not in self.streams:
                held.drain()
                break
            self._chunk(pair[0], at, out, in_order=True, floor=pair[1])
        self._held_left(stream, held, at, out)

    def _expire_held(self, stream: Stream, now: float, out: list[Output]) -> None:
        """Holes whose next chunk has waited `allowed_lateness_ms` are gaps: apply on."""
        held = stream.held
        assert held is not None
        while len(held) and self._hold_due(held) <= now:
            event, floor = held.take_first()
            out.append(GapDeclared(self.id, stream.id, now, stream.last_seq + 1, event.seq - 1))
            self._chunk(event, now, out, in_order=True, floor=floor)
            if stream.phase is Phase.DRAINING or stream.id not in self.streams:
                held.drain()
                break
            while (follows := held.take(stream.last_seq + 1)) is not None:
                self._chunk(follows[0], now, out, in_order=True, floor=follows[1])
        self._held_left(stream, held, now, out)

    def _held_left(self, stream: Stream, held: Held, now: float, out: list[Output]) -> None:
        """After applying held chunks: none left, the stream's underrun may be confirmed now;
        else the wait for the lowest one left is armed."""
        if not len(held):
            stream.held = None
            self._recheck(stream, now, out)
        else:
            self.timers.push(self._hold_due(held), -1, HoldEnd(stream))

    def _flush_held(self, stream: Stream, at: float, out: list[Output]) -> None:
        """No more waiting (an `end`, or too many held): apply them all, declaring the gaps."""
        held = stream.held
        assert held is not None
        for event, floor in held.drain():  # still held meanwhile: nothing confirmed half-way
            if stream.phase is Phase.DRAINING or stream.id not in self.streams:
                break
            if event.seq > stream.last_seq + 1:
                out.append(GapDeclared(self.id, stream.id, at, stream.last_seq + 1, event.seq - 1))
            self._chunk(event, at, out, in_order=True, floor=floor)
        stream.held = None
        self._recheck(stream, at, out)

    # ------------------------------------------------------------------ event time
    def _begin_underrun(self, stream: Stream, u: float, now: float, out: list[Output]) -> None:
        """An underrun began at `u` (≤ `now`): announced if edgemon's clock is at `u` now."""
        stream.underrun_since = u
        stream.underrun_provisional = True
        stream.underrun_published = u == now
        if stream.underrun_published:
            out.append(UnderrunBegan(self.id, stream.id, u))
        self.provisional[stream.id] = stream
        if not self._recheck(stream, now, out):
            self.timers.push(self._lateness_due(u), 0, ConfirmDeadline(stream, u))

    def _lateness_due(self, u: float) -> float:
        """When a provisional underrun at `u` stops waiting for late chunks."""
        return self._patient(u + self.config.slack.allowed_lateness_ms)

    def _recheck(self, stream: Stream, now: float, out: list[Output]) -> bool:
        """Confirm a provisional underrun whose instant the device's time has passed."""
        if not stream.underrun_provisional or stream.held is not None:
            return False
        u = stream.underrun_since
        assert u is not None
        if u < self.event_time or (self._lateness_due(u) <= now and not self.confirm_held):
            self._confirm(stream, now, out)
            return True
        return False

    def pass_event_time(self, now: float, out: list[Output]) -> None:
        """The device's event time moved on: provisional underruns before it are confirmed."""
        t_ms = self.event_time
        for stream in [s for s in self.provisional.values() if s.underrun_since < t_ms]:  # type: ignore[operator]
            self._recheck(stream, now, out)

    def _confirm(self, stream: Stream, now: float, out: list[Output]) -> None:
        u = stream.underrun_since
        assert u is not None
        stream.underrun_provisional = False
        del self.provisional[stream.id]
        self.open_underruns[stream.id] = stream
        stream.underruns += 1
        self.stats.underruns += 1
        out.append(UnderrunConfirmed(self.id, stream.id, u, now, stream.underrun_published))

    def _retract(self, stream: Stream, now: float, out: list[Output]) -> None:
        u = stream.underrun_since
        assert u is not None
        stream.underrun_since = None
        stream.underrun_provisional = False
        del self.provisional[stream.id]
        if stream.underrun_published:
            self.stats.underruns_retracted += 1
            out.append(UnderrunRetracted(self.id, stream.id, u, now))

    def hold_confirmations(self) -> None:
        """edgemon's input is interrupted: late chunks cannot arrive, so lateness waits."""
        self.confirm_held = True

    def resume_confirmations(self, now: float, wall_ms: float) -> None:
        """Input flows again at `now` (wall time `wall_ms`): every wait for late chunks starts
        afresh from then."""
        self.confirm_held = False
        lateness = self.config.slack.allowed_lateness_ms
        self.patient_wall = wall_ms + lateness
        for stream in self.provisional.values():
            assert stream.underrun_since is not None
            self.timers.push(now + lateness, 0, ConfirmDeadline(stream, stream.underrun_since))
        for stream in self.streams.values():
            if stream.held is not None:
                self.timers.push(self._hold_due(stream.held), -1, HoldEnd(stream))

    def _timer(self, what: ConfirmDeadline | HoldEnd, now: float, out: list[Output]) -> None:
        stream = what.stream
        if self.streams.get(stream.id) is not stream:
            return
        if self.confirm_held:
            return  # waits: `resume_confirmations` arms these afresh
        if isinstance(what, HoldEnd):
            held = stream.held
            if held is not None:
                due = self._hold_due(held)
                if due <= now:
                    self._expire_held(stream, now, out)
                else:  # the wait moved (a clock offset or a reload changed it)
                    self.timers.push(due, -1, HoldEnd(stream))
        elif stream.underrun_provisional and stream.underrun_since == what.u:
            due = self._lateness_due(what.u)
            if due > now:  # the wait moved (a clock offset or a reload changed it)
                self.timers.push(due, 0, ConfirmDeadline(stream, what.u))
            elif stream.held is None:  # else confirmed once its held chunks are applied
                self._confirm(stream, now, out)
