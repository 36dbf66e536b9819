"""One device: its streams, its clock, its timers and its throttle (docs/semantics.md).

Each stream keeps two right-limit flags, "at risk" (`headroom < margin`) and "unsafe"
(`headroom < margin + hysteresis`), and the throttle state counts how many of the live
streams have each. A flag only changes at an event or at an instant known in advance, so
the device keeps one timer per stream in a heap and never scans its streams on the hot
path. The throttle is decided from the two counts once per instant, after every change at
that instant.

This module applies events, brings streams to an instant, fires the timers and orchestrates
the parts the device holds, each owning its state: the timer heap (`timers`), the throttle
state (`throttle`), late delivery (`lateness`; the device applies the chunks of the reorder
buffers itself), the removed stream ids (`tombstones`) and the sampler (`sampling`).
Creating and removing streams (`lifecycle`) and adopting restored ones (`restore`) are its
base classes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgemon.engine.clock import DeviceClock
from edgemon.engine.events import ChunkEvent, EndEvent, StartEvent
from edgemon.engine.headroom import INF
from edgemon.engine.lateness import LatenessState
from edgemon.engine.live_index import LiveIndex
from edgemon.engine.outputs import GapDeclared
from edgemon.engine.reorder import MAX_HELD, Held
from edgemon.engine.restore import Restore
from edgemon.engine.sampling import Sampler
from edgemon.engine.stats import DeviceStats
from edgemon.engine.stream import BURST_GAP_MS, EWMA_ALPHA, Phase, Stream
from edgemon.engine.throttle import ThrottleState, throttle_change
from edgemon.engine.timers import MIN_ON, SAMPLE, ConfirmDeadline, HoldEnd, TimerHeap
from edgemon.engine.tombstones import Tombstones

if TYPE_CHECKING:
    from collections.abc import Sequence

    from edgemon.engine.config import EngineConfig
    from edgemon.engine.events import Event
    from edgemon.engine.outputs import Output, ThrottleChanged
    from edgemon.engine.tts import TtsEngineInfo


class Device(Restore):
    """Everything edgemon tracks for one device, driven at exact device-clock instants."""

    __slots__ = ()

    def __init__(
        self, device_id: str, config: EngineConfig, *, sample_every_ms: float | None = None
    ) -> None:
        super().__init__()
        self.id = device_id
        self.config = config
        self.override = config.devices.get(device_id)
        self.clock = DeviceClock(
            trust=config.slack.clock == "trust", window_ms=config.slack.clock_window_ms
        )
        self.streams = {}
        self.tombstones = Tombstones()
        self.timers = TimerHeap()
        self.live_index = LiveIndex(2 * config.limits.max_streams_per_device + 64)
        self.live = 0
        self.throttle = ThrottleState()
        self.gap_ewma = None
        self.engine_info = None
        self.base_margin = config.slack.default_margin_ms
        self.stats = DeviceStats()
        self.lateness = LatenessState(
            device_id, allowed_ms=config.slack.allowed_lateness_ms, clock=self.clock,
            stats=self.stats, timers=self.timers,
        )  # fmt: skip
        self.sampler = Sampler(sample_every_ms)
        self.last_message_wall_ms = 0.0

    # ------------------------------------------------------------------ queries
    @property
    def margin(self) -> float:
        """The margin of this device's streams that did not ask for their own."""
        return self._margin_for(None)

    @property
    def throttle_on(self) -> bool:
        """Whether the device's throttle is on."""
        return self.throttle.on

    @property
    def throttle_since(self) -> float:
        """Since when the throttle is on (device-clock ms; the last onset once off)."""
        return self.throttle.since

    def live_streams(self) -> list[Stream]:
        """Streams that have audio and await a next chunk."""
        return [s for s in self.streams.values() if s.phase is Phase.LIVE]

    # ------------------------------------------------------------------ timers
    def catch_up(self, at: float, out: list[Output]) -> None:
        """Fire every timer due strictly before `at` (messages at `at` come before its timers)."""
        heap = self.timers.heap
        while heap and heap[0][0] < at:
            self.fire(out)

    def fire(self, out: list[Output]) -> float:
        """Fire all timers at the earliest pending instant, decide the throttle, then sample."""
        timers = self.timers
        heap = timers.heap
        instant = heap[0][0]
        wall = instant + self.clock.offset_ms
        self.clock.reach(instant, wall)
        self.lateness.advance_horizon(instant, wall)
        while heap and heap[0][0] == instant and heap[0][1] <= 0:
            what = timers.pop()
            if type(what) is Stream:
                if what.due == instant:  # else superseded, or removed (due is NaN)
                    self._wake(what, instant, out)
            elif isinstance(what, str):
                self.throttle.dirty = True  # the minimum on-time ran out
            else:
                assert not isinstance(what, Stream)
                self._timer(what, instant, out)
        if self.throttle.dirty:
            self._decide_throttle(instant, out)
        if heap and heap[0][0] == instant and heap[0][3] == SAMPLE:
            timers.pop()
            self._sample(instant, out)
        return instant

    def decide_now(self, out: list[Output]) -> None:
        """Decide the throttle at the current instant, once its messages have all been applied."""
        instant = self.clock.floor_ms
        heap = self.timers.heap
        if heap and heap[0][0] <= instant:
            self.fire(out)  # timers at this very instant come first, then the decision
        elif self.throttle.dirty:
            self._decide_throttle(instant, out)

    # ------------------------------------------------------------------ throttle
    def _decide_throttle(self, now: float, out: list[Output]) -> None:
        """The throttle decision at `now`, never at an instant before the one the device's
        clock has reached: a timer found overdue there (fired by `catch_up` after a late chunk
        moved the clock on) changes the throttle now, else a change dated earlier would lower
        the time already counted."""
        reached = self.clock.floor_ms
        if now < reached:
            now = reached
        throttle = self.throttle
        min_on = self.config.slack.min_on_ms
        if throttle.decide(now, min_on):
            if throttle.on:
                self.stats.throttle_engagements += 1
                if min_on > 0:
                    self.timers.push(now + min_on, 0, MIN_ON)
            else:
                self.stats.throttle_ms += now - throttle.since
            out.append(self._throttle_change(now))

    def release(self, now: float, out: list[Output]) -> None:
        """Turn the throttle off at `now` whatever the streams say (edgemon is stopping)."""
        if self.throttle.release():
            self.stats.throttle_ms += now - self.throttle.since
            out.append(self._throttle_change(now))

    def throttle_state(self, now: float) -> ThrottleChanged:
        """The throttle as it stands at `now` (the device's clock), as a change object: what a
        restarted daemon publishes once it has caught up (docs/reliability.md)."""
        return self._throttle_change(now)

    def _throttle_change(self, now: float) -> ThrottleChanged:
        return throttle_change(
            self.id, now, active=self.throttle.on, live=self.live_streams(), margin_ms=self.margin
        )

    # ------------------------------------------------------------------ samples
    def _ensure_sampling(self, at: float) -> None:
        due = self.sampler.start(at)
        if due is not None:
            self.timers.push(due, 1, SAMPLE)

    def _sample(self, now: float, out: list[Output]) -> None:
        due = self.sampler.sample(self.id, self.live_streams(), now, out)
        if due is not None:
            self.timers.push(due, 1, SAMPLE)

    # ------------------------------------------------------------------ events
    def receive(self, events: Sequence[Event], recv_ms: float, out: list[Output]) -> list[str]:
        """One message's valid events, received at wall time `recv_ms`: each event's
        `result` label. They take effect at one device instant: the device's clock at
        receipt (never behind what the device reported), after every timer due strictly
        before it."""
        clock = self.clock
        if not all(clock.admits(recv_ms, event.t_ms) for event in events):
            return self._receive_admitted(events, recv_ms, out)
        at = clock.floor_ms
        lateness = self.lateness
        latest = lateness.event_time
        for event in events:
            clock.observe(recv_ms, event.t_ms)
            if event.t_ms > latest:
                latest = event.t_ms
        if latest > at:
            at = latest  # a device's clock is never behind what it reported
        now = clock.now(recv_ms)
        if now > at:
            at = now
        heap = self.timers.heap
        if heap and heap[0][0] < at:
            self.catch_up(at, out)
        clock.reach(at, recv_ms)
        if len(events) == 1:
            results = [self.apply(events[0], at, out)]
        else:
            results = [self.apply(event, at, out) for event in events]
        if latest > lateness.event_time:
            lateness.event_time = latest
            if lateness.provisional:
                lateness.pass_event_time(at, out)
        lateness.advance_horizon(at, recv_ms)  # after the events: they ended under the old one
        return results

    def _receive_admitted(
        self, events: Sequence[Event], recv_ms: float, out: list[Output]
    ) -> list[str]:
        """The rare path: some events claim a time far ahead of the device's clock."""
        admitted = [e for e in events if self.clock.admits(recv_ms, e.t_ms)]
        results = iter(self.receive(admitted, recv_ms, out) if admitted else [])
        kept = {id(e) for e in admitted}
        return [next(results) if id(e) in kept else "clock_jump" for e in events]

    def apply(self, event: Event, at: float, out: list[Output]) -> str:
        """Apply one validated event at device instant `at`; return its `result` label."""
        if type(event) is ChunkEvent:
            result = self._chunk(event, at, out)
        elif type(event) is StartEvent:
            result = self._start(event, at, out)
        else:
            assert type(event) is EndEvent
            result = self._end(event, at, out)
        return result

    def _start(self, event: StartEvent, at: float, out: list[Output]) -> str:
        if event.stream in self.streams:
            return "duplicate"
        stream = self._new_stream(event.stream, event.t_ms, start=event)
        if stream is None:
            return "stream_limit"
        self._refresh(stream, at, out)
        return "accepted"

    def _end(self, event: EndEvent, at: float, out: list[Output]) -> str:
        stream = self.streams.get(event.stream)
        if stream is None:
            return "duplicate" if event.stream in self.tombstones else "unknown_stream"
        if stream.held is not None:
            self._flush_held(stream, at, out)  # the end comes after every chunk sent
        if stream.underrun_provisional:
            assert stream.underrun_since is not None
            if event.t_ms <= stream.underrun_since:
                self.lateness.retract(stream, at, out)  # ended before its buffer ran dry
            else:
                self.lateness.confirm(stream, at, out)
        self._remove(stream, event.reason or "completed", at, out)
        return "accepted"

    def _chunk(  # noqa: C901, PLR0912, PLR0915
        self,
        event: ChunkEvent,
        at: float,
        out: list[Output],
        *,
        in_order: bool = False,
        floor: float = -INF,
    ) -> str:
        """Apply a chunk; `in_order`: one taken from the reorder buffer, applied in `seq`
        order (the next one, or one after a declared gap), that arrived when the lateness
        horizon was at `floor`."""
        stream = self.streams.get(event.stream)
        if stream is None:
            if event.seq > 0 and event.stream in self.tombstones:
                return "duplicate"
            stream = self._new_stream(event.stream, event.t_ms, start=None)
            if stream is None:
                return "stream_limit"
        if event.seq <= stream.last_seq:
            return "duplicate"
        if stream.phase is Phase.DRAINING:
            return "after_final"
        if event.seq > stream.last_seq + 1:
            if not in_order and self.config.slack.allowed_lateness_ms > 0.0:
                return self._hold(stream, event, at, out)
            result = "gap"
        else:
            result = "accepted"
        stats = self.stats
        t = event.t_ms
        if stream.chunks:
            self._before_chunk(stream, t)
        else:
            if stream.start == INF:
                stream.start = t
            if stream.t_start_event is not None:
                stream.first_audio_ms = t - stream.t_start_event
                stats.time_to_first_audio.observe(stream.first_audio_ms)
        if event.play_start_ms is not None:
            stream.start = event.play_start_ms
        if stream.chunks == 0 and stream.t_start_event is not None:
            stats.start_silence.observe(max(0.0, stream.start - stream.t_start_event))
        if result == "gap" and event.audio_total_ms is not None:
            stream.buffered = event.audio_total_ms
        else:
            stream.buffered += event.audio_ms
        stream.chunks += 1
        stream.last_seq = event.seq
        stream.t_last_chunk = t
        if t > stream.t_last_event:
            stream.t_last_event = t
        stats.chunks += 1
        stats.audio_ms += event.audio_ms
        eta = event.eta_ms
        if eta is None:
            eta = stream.gap_ewma
            if eta is None:
                eta = self.gap_ewma
                if eta is None:
                    eta = self.config.slack.default_chunk_gap_ms
        stream.expected = t + eta
        if stream.underrun_since is not None:
            self.lateness.chunk_in_underrun(
                stream, t, at, out, floor if in_order else self.lateness.horizon
            )
        if stream.phase is Phase.LIVE:
            if event.final:
                stream.phase = Phase.DRAINING
                self.live -= 1
        elif event.final:
            stream.phase = Phase.DRAINING
        else:
            stream.phase = Phase.LIVE
            self.live += 1
            self._ensure_sampling(at)
        if stream.phase is Phase.DRAINING and stream.empties_at <= at:
            self._remove(stream, "completed", at, out)
        else:
            self._refresh(stream, at, out)
        if stream.held is not None and not in_order:
            self._release_held(stream, at, out)
        return result

    def _before_chunk(self, stream: Stream, t: float) -> None:
        """What a chunk at `t` tells before its audio counts: slack at arrival, the gap."""
        stats = self.stats
        played = t - stream.start
        before = stream.buffered - played if played > 0.0 else stream.buffered
        if stream.rebuffer and before < 0.0:
            before = 0.0
            stream.start = t - stream.buffered  # the stalled player resumes now
        lowest = stream.min_slack
        if lowest is None or before < lowest:
            stream.min_slack = before
        stats.slack_at_arrival.observe(before)
        gap = t - stream.t_last_chunk
        if gap < 0.0:
            gap = 0.0
        stats.chunk_gap.observe(gap)
        if gap < BURST_GAP_MS:  # a piece of the same delivery: no gap between deliveries
            return
        ewma = stream.gap_ewma
        stream.gap_ewma = gap if ewma is None else EWMA_ALPHA * gap + (1 - EWMA_ALPHA) * ewma
        ewma = self.gap_ewma
        self.gap_ewma = gap if ewma is None else EWMA_ALPHA * gap + (1 - EWMA_ALPHA) * ewma

    def _wake(self, stream: Stream, now: float, out: list[Output]) -> None:
        stream.due = INF
        if stream.phase is Phase.DRAINING:
            if now >= stream.empties_at:
                self._remove(stream, "completed", now, out)
                return
        elif now >= stream.expires_at(self.config.slack.stream_idle_timeout_ms):
            if stream.held is not None:
                # Not idle: chunks came and wait for a missing one. They are applied now
                # (the holes declared gaps), which moves the expiry on.
                self._flush_held(stream, now, out)
                return
            self._remove(stream, "expired", now, out)
            return
        self._refresh(stream, now, out, timer=True)

    def _refresh(
        self, stream: Stream, now: float, out: list[Output], *, timer: bool = False
    ) -> None:
        """Bring a stream's underrun state and flags to `now`, and (re)arm its timer."""
        self.live_index.note(stream)
        phase = stream.phase
        if phase is Phase.LIVE:
            due = self._live_due(stream, now, out, timer=timer)
        elif phase is Phase.WAITING:
            due = stream.expires_at(self.config.slack.stream_idle_timeout_ms)
        else:
            self.throttle.note(stream, risk=False, unsafe=False)
            due = stream.empties_at
        if due < now:
            due = now  # an instant already passed is handled now, never in the past
        if due != stream.due:
            # The entry at the old instant goes stale and is skipped when it comes up.
            stream.due = due
            self.timers.push(due, 0, stream)

    def _live_due(self, stream: Stream, now: float, out: list[Output], *, timer: bool) -> float:
        """Update a live stream's flags and underrun at `now`; return its next instant."""
        empties = stream.start + stream.buffered
        risk, unsafe, due = stream.flags_at(now, self.config.slack.hysteresis_ms)
        if risk != stream.risk or unsafe != stream.unsafe:
            self.throttle.note(stream, risk=risk, unsafe=unsafe)
        if stream.underrun_since is None and empties > now:
            # Expiry comes an idle timeout after the buffer empties: never first here.
            return empties if empties < due else due
        if stream.underrun_since is None:
            # Exactly when it ran dry by the device's times: `u`, or the chunk that left it
            # empty (late chunks can show that this was before edgemon's clock now).
            t_last = stream.t_last_chunk
            u = empties if empties > t_last else t_last
            if not timer and u >= now:
                # Empty from now on after a message: judged with this instant's timers, after
                # every message of the instant (a later one may refill the buffer).
                return now
            self.lateness.begin_underrun(stream, u, now, out)
        expiry = stream.expires_at(self.config.slack.stream_idle_timeout_ms)
        return expiry if expiry < due else due

    # ---------------------------------------------------------- reorder buffers (lateness)
    def _hold(self, stream: Stream, event: ChunkEvent, at: float, out: list[Output]) -> str:
        """Keep a chunk that arrived ahead of a missing `seq` (docs/semantics.md)."""
        held = stream.held
        if held is None:
            held = stream.held = Held()
        if not held.add(event, at, self.lateness.horizon):
            return "duplicate"
        if len(held) > MAX_HELD:
            self._flush_held(stream, at, out)  # too far ahead: the holes are gaps now
        else:
            self.timers.push(self.lateness.hold_due(held), -1, HoldEnd(stream))
        return "accepted"

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
        while len(held) and self.lateness.hold_due(held) <= now:
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
            self.lateness.recheck(stream, now, out)
        else:
            self.timers.push(self.lateness.hold_due(held), -1, HoldEnd(stream))

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
        self.lateness.recheck(stream, at, out)

    def _timer(self, what: ConfirmDeadline | HoldEnd, now: float, out: list[Output]) -> None:
        stream = what.stream
        if self.streams.get(stream.id) is not stream:
            return
        if self.lateness.confirm_held:
            return  # waits: `resume_confirmations` arms these afresh
        if isinstance(what, HoldEnd):
            held = stream.held
            if held is not None:
                due = self.lateness.hold_due(held)
                if due <= now:
                    self._expire_held(stream, now, out)
                else:  # the wait moved (a clock offset or a reload changed it)
                    self.timers.push(due, -1, HoldEnd(stream))
        else:
            self.lateness.deadline(what, now, out)

    def hold_confirmations(self) -> None:
        """edgemon's input is interrupted: late chunks cannot arrive, so lateness waits."""
        self.lateness.hold_confirmations()

    def resume_confirmations(self, now: float, wall_ms: float) -> None:
        """Input flows again at `now` (wall time `wall_ms`): every wait for late chunks starts
        afresh from then."""
        self.lateness.resume_confirmations(now, wall_ms, self.streams.values())

    # ------------------------------------------------------------------ restore
    def restore_timers(self, at: float) -> None:
        """Recompute flags, counts and timers of adopted streams from instant `at` on."""
        for stream in list(self.streams.values()):
            self._refresh(stream, at, [])
        min_on_until = self.throttle.since + self.config.slack.min_on_ms
        if self.throttle.on and min_on_until > at:
            self.timers.push(min_on_until, 0, MIN_ON)
        self.throttle.dirty = True

    # ------------------------------------------------------------------ margins
    def set_engine_info(self, info: TtsEngineInfo, at: float) -> None:
        """Take a new engine object: margins of streams without their own may change."""
        self.engine_info = info
        margin = info.margin
        self.base_margin = self.config.slack.default_margin_ms if margin is None else margin
        self._remargin(at)

    def reconfigure(self, config: EngineConfig, at: float) -> None:
        """Take a reloaded configuration without losing any stream."""
        self.config = config
        self.lateness.allowed_ms = config.slack.allowed_lateness_ms
        self.override = config.devices.get(self.id)
        info = self.engine_info
        margin = None if info is None else info.margin
        self.base_margin = config.slack.default_margin_ms if margin is None else margin
        self._remargin(at)

    def _remargin(self, at: float) -> None:
        for stream in list(self.streams.values()):
            stream.margin = self._margin_for(stream.margin_from_start)
            self.live_index.note(stream)
            stream.due = min(stream.due, at)
            self.timers.push(at, 0, stream)
        self.throttle.dirty = True
