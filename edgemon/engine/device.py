"""One device: its streams, its clock, its timers and its throttle (docs/semantics.md).

Each stream keeps two right-limit flags, "at risk" (`headroom < margin`) and "unsafe"
(`headroom < margin + hysteresis`), and the throttle state counts how many of the live
streams have each. A flag only changes at an event or at an instant known in advance, so
the device keeps one timer per stream in a heap and never scans its streams on the hot
path. The throttle is decided from the two counts once per instant, after every change at
that instant.

`Device` keeps its identity, configuration, clock, streams, live index and stats. It
receives messages and decides the instant their events take effect at, fires its timers in
order and decides the throttle, orchestrating the parts it holds, each owning its state:
the timer heap (`timers`), the throttle state (`throttle`), the margins (`margins`), late
delivery (`lateness`), the streams' lives (`lifecycle`: creation, next instants, expiry,
removal, tombstones), what each event does to the streams (`applier`, with the reorder
buffers' waits) and the sampler (`sampler`).
"""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING

from edgemon.engine.applier import Applier
from edgemon.engine.device_clock import DeviceClock
from edgemon.engine.lateness import LatenessState
from edgemon.engine.lifecycle import Lifecycle
from edgemon.engine.live_index import LiveIndex
from edgemon.engine.margins import Margins
from edgemon.engine.reorder_release import Reordering
from edgemon.engine.sampling import Sampler
from edgemon.engine.stats import DeviceStats
from edgemon.engine.stream import LIVE, Stream
from edgemon.engine.throttle import ThrottleState, throttle_change
from edgemon.engine.timers import MIN_ON, SAMPLE, TimerHeap

if TYPE_CHECKING:
    from collections.abc import Sequence

    from edgemon.engine.capacity import CapacityRecord
    from edgemon.engine.config import EngineConfig
    from edgemon.engine.events import Event
    from edgemon.engine.outputs import Output, ThrottleChanged
    from edgemon.engine.tombstones import Tombstones
    from edgemon.engine.tts import TtsEngineInfo

_T_MS = attrgetter("t_ms")


class Device:
    """Everything edgemon tracks for one device, driven at exact device-clock instants."""

    __slots__ = (
        "applier",
        "capacity",
        "clock",
        "config",
        "engine_info",
        "id",
        "last_message_wall_ms",
        "lateness",
        "lifecycle",
        "live_index",
        "margins",
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
        clock = self.clock = DeviceClock(
            trust=config.slack.clock == "trust", window_ms=config.slack.clock_window_ms
        )
        streams: dict[str, Stream] = {}
        self.streams = streams
        #: Live streams sorted for the adapters' reads (`edgemon.engine.views`).
        self.live_index = LiveIndex(2 * config.limits.max_streams_per_device + 64)
        stats = self.stats = DeviceStats()
        self.engine_info: TtsEngineInfo | None = None
        #: The engine's last capacity object (docs/protocol.md), once one was received.
        self.capacity: CapacityRecord | None = None
        #: When the last message of the device was received (wall ms).
        self.last_message_wall_ms = 0.0
        timers = self.timers = TimerHeap()
        throttle = self.throttle = ThrottleState()
        margins = self.margins = Margins(device_id, config)
        self.sampler = Sampler(sample_every_ms)
        lateness = self.lateness = LatenessState(
            device_id, allowed_ms=config.slack.allowed_lateness_ms, clock=clock, stats=stats,
            timers=timers,
        )  # fmt: skip
        lifecycle = self.lifecycle = Lifecycle(
            device_id, config, streams=streams, live_index=self.live_index, margins=margins,
            stats=stats, throttle=throttle, lateness=lateness, timers=timers,
        )  # fmt: skip
        self.applier = Applier(
            config, streams=streams, stats=stats, lifecycle=lifecycle, lateness=lateness,
            reordering=Reordering(device_id, streams=streams, lateness=lateness, timers=timers),
            sampler=self.sampler, timers=timers,
        )  # fmt: skip

    # ------------------------------------------------------------------ queries
    @property
    def margin(self) -> float:
        """The margin of this device's streams that did not ask for their own."""
        return self.margins.for_stream(None)

    @property
    def gap_ewma(self) -> float | None:
        """The gap between deliveries over all the device's streams (EWMA, ms)."""
        return self.applier.gap_ewma

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
        return [s for s in self.streams.values() if s.phase is LIVE]

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
                    self.applier.flush_held(what, instant, out)
            elif isinstance(what, str):
                self.throttle.dirty = True  # the minimum on-time ran out
            else:
                assert not isinstance(what, Stream)
                self.applier.timer(what, instant, out)
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
        if len(events) == 1:  # a message of one event (the usual message of a player)
            newest = events[0].t_ms
            if not clock.admits(recv_ms, newest):
                return self._receive_admitted(events, recv_ms, out)
            clock.observe(recv_ms, newest)
        else:
            times = list(map(_T_MS, events))
            newest = max(times)
            if not (
                clock.admits_up_to(recv_ms, newest) or all(clock.admits(recv_ms, t) for t in times)
            ):
                return self._receive_admitted(events, recv_ms, out)
            clock.observe_all(recv_ms, times, newest)
        at = clock.floor_ms
        lateness = self.lateness
        latest = lateness.event_time
        if newest > latest:
            latest = newest
        if latest > at:
            at = latest  # a device's clock is never behind what it reported
        now = clock.now(recv_ms)
        if now > at:
            at = now
        heap = self.timers.heap
        if heap and heap[0][0] < at:
            self.catch_up(at, out)
        clock.reach(at, recv_ms)
        results = self.applier.apply_all(events, at, out)
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

    # ------------------------------------------------------------------ margins
    def set_engine_info(self, info: TtsEngineInfo | None, at: float) -> None:
        """Take a new engine object (None: the last one no longer applies): margins of
        streams without their own may change."""
        self.engine_info = info
        self.margins.configure(self.id, self.config, info)
        self.lifecycle.remargin(at)

    def reconfigure(self, config: EngineConfig, at: float) -> None:
        """Take a reloaded configuration without losing any stream."""
        self.config = config
        self.lateness.allowed_ms = config.slack.allowed_lateness_ms
        self.lifecycle.configure(config)
        self.applier.configure(config)
        self.margins.configure(self.id, config, self.engine_info)
        self.lifecycle.remargin(at)
