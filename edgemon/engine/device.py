"""One device: its streams, its clock, its timers and its throttle (docs/semantics.md).

Each stream keeps two right-limit flags, "at risk" (`headroom < margin`) and "unsafe"
(`headroom < margin + hysteresis`), and the throttle state counts how many of the live
streams have each. A flag only changes at an event or at an instant known in advance, so
the device keeps one timer per stream in a heap and never scans its streams on the hot
path. The throttle is decided from the two counts once per instant, after every change at
that instant.

`Device` keeps its identity, configuration, clock, streams, live index and stats. It
receives messages, applies their events, fires its timers and decides the throttle,
orchestrating the parts it holds, each owning its state: the timer heap (`timers`), the
throttle state (`throttle`), the margins (`margins`), late delivery (`lateness`), the reorder
buffers' waits (`reordering`), the streams' lives (`lifecycle`: creation, next instants,
expiry, removal, tombstones) and the sampler (`sampler`). What a chunk tells about its
stream is `edgemon.engine.arrival`; rebuilding a device from a snapshot,
`edgemon.engine.restore`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgemon.engine.arrival import take_chunk
from edgemon.engine.clock import DeviceClock
from edgemon.engine.events import ChunkEvent, EndEvent, StartEvent
from edgemon.engine.headroom import INF
from edgemon.engine.lateness import LatenessState
from edgemon.engine.lifecycle import Lifecycle
from edgemon.engine.live_index import LiveIndex
from edgemon.engine.margins import Margins
from edgemon.engine.reordering import Reordering
from edgemon.engine.sampling import Sampler
from edgemon.engine.stats import DeviceStats
from edgemon.engine.stream import Phase, Stream
from edgemon.engine.throttle import ThrottleState, throttle_change
from edgemon.engine.timers import MIN_ON, SAMPLE, HoldEnd, TimerHeap

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from edgemon.engine.config import EngineConfig
    from edgemon.engine.events import Event
    from edgemon.engine.outputs import Output, ThrottleChanged
    from edgemon.engine.timers import ConfirmDeadline
    from edgemon.engine.tombstones import Tombstones
    from edgemon.engine.tts import TtsEngineInfo


class Device:
    """Everything edgemon tracks for one device, driven at exact device-clock instants."""

    __slots__ = (
        "clock",
        "config",
        "engine_info",
        "gap_ewma",
        "id",
        "last_message_wall_ms",
        "lateness",
        "lifecycle",
        "live_index",
        "margins",
        "reordering",
        "sampler",
        "stats",
        "streams",
        "throttle",
        "timers",
    )

    def __init__(
        self, device_id: str, config: EngineConfig, *, sample_every_ms: float | None = None
    ) -> None:
        self.id = device_id
        self.config = config
        self.clock = DeviceClock(
            trust=config.slack.clock == "trust", window_ms=config.slack.clock_window_ms
        )
        self.streams: dict[str, Stream] = {}
        #: Live streams sorted for the adapters' reads (`edgemon.engine.views`).
        self.live_index = LiveIndex(2 * config.limits.max_streams_per_device + 64)
        self.stats = DeviceStats()
        #: The gap between deliveries over all the device's streams (EWMA, ms).
        self.gap_ewma: float | None = None
        self.engine_info: TtsEngineInfo | None = None
        #: When the last message of the device was received (wall ms).
        self.last_message_wall_ms = 0.0
        timers = self.timers = TimerHeap()
        throttle = self.throttle = ThrottleState()
        margins = self.margins = Margins(device_id, config)
        lateness = self.lateness = LatenessState(
            device_id, allowed_ms=config.slack.allowed_lateness_ms, clock=self.clock,
            stats=self.stats, timers=timers,
        )  # fmt: skip
        self.reordering = Reordering(
            device_id, streams=self.streams, lateness=lateness, timers=timers
        )
        self.lifecycle = Lifecycle(
            device_id, config, streams=self.streams, live_index=self.live_index,
            margins=margins, stats=self.stats, throttle=throttle, lateness=lateness,
            timers=timers,
        )  # fmt: skip
        self.sampler = Sampler(sample_every_ms)

    # ------------------------------------------------------------------ queries
    @property
    def margin(self) -> float:
        """The margin of this device's streams that did not ask for their own."""
        return self.margins.for_stream(None)

    @property
    def live(self) -> int:
        """Streams in phase LIVE."""
        return self.lifecycle.live

    @property
    def tombstones(self) -> Tombstones:
        """Recently removed stream ids (read them, never write)."""
        return self.lifecycle.tombstones

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
                # Else superseded, or removed (due is NaN). Expiring with chunks held: not
                # idle, they are applied now (the holes declared gaps).
                if what.due == instant and self.lifecycle.wake(what, instant, out):
                    self._flush_held(what, instant, out)
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
        stream = self.lifecycle.new_stream(event.stream, event.t_ms, start=event)
        if stream is None:
            return "stream_limit"
        self.lifecycle.refresh(stream, at, out)
        return "accepted"

    def _end(self, event: EndEvent, at: float, out: list[Output]) -> str:
        stream = self.streams.get(event.stream)
        if stream is None:
            return "duplicate" if event.stream in self.lifecycle.tombstones else "unknown_stream"
        if stream.held is not None:
            self._flush_held(stream, at, out)  # the end comes after every chunk sent
        if stream.underrun_provisional:
            assert stream.underrun_since is not None
            if event.t_ms <= stream.underrun_since:
                self.lateness.retract(stream, at, out)  # ended before its buffer ran dry
            else:
                self.lateness.confirm(stream, at, out)
        self.lifecycle.remove(stream, event.reason or "completed", at, out)
        return "accepted"

    def _chunk(  # noqa: C901, PLR0912
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
        lifecycle = self.lifecycle
        if stream is None:
            if event.seq > 0 and event.stream in lifecycle.tombstones:
                return "duplicate"
            stream = lifecycle.new_stream(event.stream, event.t_ms, start=None)
            if stream is None:
                return "stream_limit"
        if event.seq <= stream.last_seq:
            return "duplicate"
        if stream.phase is Phase.DRAINING:
            return "after_final"
        gap = event.seq > stream.last_seq + 1
        if gap and not in_order and self.lateness.allowed_ms > 0.0:
            return self._hold(stream, event, at, out)
        self.gap_ewma = take_chunk(
            stream, event, gap=gap, stats=self.stats, device_gap=self.gap_ewma,
            default_gap_ms=self.config.slack.default_chunk_gap_ms,
        )  # fmt: skip
        if stream.underrun_since is not None:
            lateness = self.lateness
            lateness.chunk_in_underrun(
                stream, event.t_ms, at, out, floor if in_order else lateness.horizon
            )
        if stream.phase is Phase.LIVE:
            if event.final:
                stream.phase = Phase.DRAINING
                lifecycle.live -= 1
        elif event.final:
            stream.phase = Phase.DRAINING
        else:
            stream.phase = Phase.LIVE
            lifecycle.live += 1
            self._ensure_sampling(at)
        if stream.phase is Phase.DRAINING and stream.empties_at <= at:
            lifecycle.remove(stream, "completed", at, out)
        else:
            lifecycle.refresh(stream, at, out)
        if stream.held is not None and not in_order:
            self._release_held(stream, at, out)
        return "gap" if gap else "accepted"

    # ------------------------------------------------------------------ reorder buffers
    def _hold(self, stream: Stream, event: ChunkEvent, at: float, out: list[Output]) -> str:
        """Keep a chunk that arrived ahead of a missing `seq` (docs/semantics.md)."""
        result = self.reordering.hold(stream, event, at)
        if result == "full":
            self._flush_held(stream, at, out)  # too far ahead: the holes are gaps now
            return "accepted"
        return result

    def _release_held(self, stream: Stream, at: float, out: list[Output]) -> None:
        """Apply the held chunks that now follow in `seq` order."""
        self._apply_held(self.reordering.release(stream, at, out), at, out)

    def _flush_held(self, stream: Stream, at: float, out: list[Output]) -> None:
        """No more waiting: apply every held chunk, declaring the gaps."""
        self._apply_held(self.reordering.flush(stream, at, out), at, out)

    def _apply_held(
        self, due: Iterator[tuple[ChunkEvent, float]], at: float, out: list[Output]
    ) -> None:
        for event, floor in due:
            self._chunk(event, at, out, in_order=True, floor=floor)

    def _timer(self, what: ConfirmDeadline | HoldEnd, now: float, out: list[Output]) -> None:
        stream = what.stream
        if self.streams.get(stream.id) is not stream:
            return
        if self.lateness.confirm_held:
            return  # waits: `resume_confirmations` arms these afresh
        if isinstance(what, HoldEnd):
            if self.reordering.waited(stream, now):
                self._apply_held(self.reordering.expire(stream, now, out), now, out)
        else:
            self.lateness.deadline(what, now, out)

    # ------------------------------------------------------------------ margins
    def set_engine_info(self, info: TtsEngineInfo, at: float) -> None:
        """Take a new engine object: margins of streams without their own may change."""
        self.engine_info = info
        self.margins.configure(self.id, self.config, info)
        self.lifecycle.remargin(at)

    def reconfigure(self, config: EngineConfig, at: float) -> None:
        """Take a reloaded configuration without losing any stream."""
        self.config = config
        self.lateness.allowed_ms = config.slack.allowed_lateness_ms
        self.lifecycle.configure(config)
        self.margins.configure(self.id, config, self.engine_info)
        self.lifecycle.remargin(at)
