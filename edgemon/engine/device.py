"""One device: its streams, its clock, its timers and its throttle (SPEC §2).

Each stream keeps two right-limit flags, "at risk" (`headroom < margin`) and "unsafe"
(`headroom < margin + hysteresis`), and the device keeps how many of its live streams have
each. A flag only changes at an event or at an instant known in advance, so the device keeps
one timer per stream in a heap and never scans its streams on the hot path. The throttle is
decided from the two counts once per instant, after every change at that instant.
"""

from __future__ import annotations

import math
from heapq import heapify, heappop, heappush
from typing import TYPE_CHECKING, Final

from edgemon.engine.clock import DeviceClock
from edgemon.engine.events import ChunkEvent, EndEvent, StartEvent
from edgemon.engine.headroom import INF
from edgemon.engine.lateness import HoldEnd, LateDelivery, Lateness
from edgemon.engine.outputs import (
    StreamEnded,
    StreamSample,
    ThrottleChanged,
    UnderrunEnded,
)
from edgemon.engine.stats import DeviceStats, fold_reason
from edgemon.engine.stream import EWMA_ALPHA, Phase, Stream
from edgemon.engine.views import LiveIndex

if TYPE_CHECKING:
    from edgemon.engine.config import DeviceOverride, EngineConfig
    from edgemon.engine.events import Event
    from edgemon.engine.outputs import Output
    from edgemon.engine.tts import TtsEngineInfo

#: Most at-risk stream ids a throttle object lists (SPEC §1).
MAX_LISTED_STREAMS: Final = 16

# Timer kinds besides streams. At equal instants priority -1 (held chunks: messages) comes
# first, then 0 (timers), then 1 (samples).
_MIN_ON: Final = "min_on"
_SAMPLE: Final = "sample"


Timer = tuple[float, int, int, "Stream | str | Lateness | HoldEnd"]


class Device(LateDelivery):
    """Everything edgemon tracks for one device, driven at exact device-clock instants."""

    __slots__ = (
        "_compact_above",
        "_next_timer_id",
        "_risk_count",
        "_sample_due",
        "_unsafe_count",
        "base_margin",
        "clock",
        "config",
        "decision_pending",
        "dirty",
        "engine_info",
        "forget_due",
        "gap_ewma",
        "id",
        "last_message_wall_ms",
        "live",
        "live_index",
        "override",
        "sample_every_ms",
        "stats",
        "streams",
        "throttle_on",
        "throttle_since",
        "timers",
        "tombstones",
        "wall_due",
    )

    def __init__(
        self, device_id: str, config: EngineConfig, *, sample_every_ms: float | None = None
    ) -> None:
        super().__init__()
        self.id = device_id
        self.config = config
        self.override: DeviceOverride | None = config.devices.get(device_id)
        self.clock = DeviceClock(
            trust=config.slack.clock == "trust", window_ms=config.slack.clock_window_ms
        )
        self.streams: dict[str, Stream] = {}
        #: Recently removed stream ids and when: late redeliveries must not resurrect them.
        self.tombstones: dict[str, float] = {}
        self.timers: list[Timer] = []
        #: Live streams sorted for the adapters' reads (`edgemon.engine.views`).
        self.live_index = LiveIndex(2 * config.limits.max_streams_per_device + 64)
        self._compact_above = 64
        self._next_timer_id = 0
        self.live = 0
        self._risk_count = 0
        self._unsafe_count = 0
        self.dirty = False
        self.decision_pending = False
        self.throttle_on = False
        self.throttle_since = 0.0
        self.gap_ewma: float | None = None
        self.engine_info: TtsEngineInfo | None = None
        self.base_margin = config.slack.default_margin_ms
        self.stats = DeviceStats()
        self.sample_every_ms = sample_every_ms
        self._sample_due = INF
        self.wall_due = INF  # this device's entry in the engine's queue
        self.forget_due = INF  # this device's entry in the engine's queue of idle devices
        self.last_message_wall_ms = 0.0

    # ------------------------------------------------------------------ queries
    @property
    def margin(self) -> float:
        """The margin of this device's streams that did not ask for their own."""
        override = self.override
        if override is not None and override.margin_ms is not None:
            return override.margin_ms
        return self.base_margin

    @property
    def at_risk_count(self) -> int:
        """Live streams at risk just after the device's current instant."""
        return self._risk_count

    def live_streams(self) -> list[Stream]:
        """Streams that have audio and await a next chunk."""
        return [s for s in self.streams.values() if s.phase is Phase.LIVE]

    def next_timer(self) -> float:
        """The device-clock instant of the earliest pending timer (INF if none).

        Stale stream entries (superseded by a later push, or of a removed stream) are dropped
        from the top first, so the engine never schedules a wake-up that has nothing to do.
        """
        timers = self.timers
        while timers:
            due, _, _, what = timers[0]
            if type(what) is Stream and what.due != due:  # NaN once removed: never equal
                heappop(timers)
                continue
            return due
        return INF

    # ------------------------------------------------------------------ events
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
                self._retract(stream, at, out)  # ended before its buffer ran dry
            else:
                self._confirm(stream, at, out)
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
            self._chunk_in_underrun(stream, t, at, out, floor if in_order else self.horizon)
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
        ewma = stream.gap_ewma
        stream.gap_ewma = gap if ewma is None else EWMA_ALPHA * gap + (1 - EWMA_ALPHA) * ewma
        ewma = self.gap_ewma
        self.gap_ewma = gap if ewma is None else EWMA_ALPHA * gap + (1 - EWMA_ALPHA) * ewma
        stats.chunk_gap.observe(gap)

    # ------------------------------------------------------------------ timers
    def catch_up(self, at: float, out: list[Output]) -> None:
        """Fire every timer due strictly before `at` (messages at `at` come before its timers)."""
        while self.timers and self.timers[0][0] < at:
            self.fire(out)

    def fire(self, out: list[Output]) -> float:
        """Fire all timers at the earliest pending instant, decide the throttle, then sample."""
        timers = self.timers
        instant = timers[0][0]
        wall = instant + self.clock.offset_ms
        self.clock.reach(instant, wall)
        self.advance_horizon(instant, wall)
        while timers and timers[0][0] == instant and timers[0][1] <= 0:
            what = heappop(timers)[3]
            if type(what) is Stream:
                if what.due == instant:  # else superseded, or removed (due is NaN)
                    self._wake(what, instant, out)
            elif isinstance(what, str):
                self.dirty = True
            else:
                assert not isinstance(what, Stream)
                self._timer(what, instant, out)
        if self.dirty:
            self._decide_throttle(instant, out)
        if timers and timers[0][0] == instant and timers[0][3] == _SAMPLE:
            heappop(timers)
            self._sample(instant, out)
        return instant

    def settle(self, out: list[Output]) -> None:
        """Decide the throttle at the current instant, once its messages have all been applied."""
        instant = self.clock.floor_ms
        if self.timers and self.timers[0][0] <= instant:
            self.fire(out)  # timers at this very instant come first, then the decision
        elif self.dirty:
            self._decide_throttle(instant, out)

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
            self._set_flags(stream, risk=False, unsafe=False)
            due = stream.empties_at
        if due < now:
            due = now  # an instant already passed is handled now, never in the past
        if due != stream.due:
            # The entry at the old instant goes stale and is skipped when it comes up.
            stream.due = due
            self._push(due, 0, stream)

    def _live_due(self, stream: Stream, now: float, out: list[Output], *, timer: bool) -> float:
        """Update a live stream's flags and underrun at `now`; return its next instant."""
        empties = stream.start + stream.buffered
        risk, unsafe, due = stream.flags_at(now, self.config.slack.hysteresis_ms)
        if risk != stream.risk or unsafe != stream.unsafe:
            self._set_flags(stream, risk=risk, unsafe=unsafe)
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
            self._begin_underrun(stream, u, now, out)
        expiry = stream.expires_at(self.config.slack.stream_idle_timeout_ms)
        return expiry if expiry < due else due

    def _set_flags(self, stream: Stream, *, risk: bool, unsafe: bool) -> None:
        if risk != stream.risk:
            self._risk_count += 1 if risk else -1
            stream.risk = risk
            self.dirty = True
        if unsafe != stream.unsafe:
            self._unsafe_count += 1 if unsafe else -1
            stream.unsafe = unsafe
            self.dirty = True

    def _push(self, due: float, priority: int, what: Stream | str | Lateness | HoldEnd) -> None:
        self._next_timer_id += 1
        timers = self.timers
        heappush(timers, (due, priority, self._next_timer_id, what))
        if len(timers) > self._compact_above:
            self._compact()

    def _compact(self) -> None:
        """Drop superseded entries buried in the heap (in place: `fire` may hold the list).

        A healthy stream's next crossing lies far ahead and moves later with every chunk, so
        superseded entries would otherwise pile up until their instants came. Rebuilding
        when the heap doubles keeps it within twice its live entries, O(1) amortised.
        """
        timers = self.timers
        timers[:] = [e for e in timers if type(e[3]) is not Stream or e[3].due == e[0]]
        heapify(timers)
        self._compact_above = 2 * len(timers) + 64

    # ------------------------------------------------------------------ throttle
    def _decide_throttle(self, now: float, out: list[Output]) -> None:
        """SPEC §2.5 from the two counts: ON on any risk, OFF when none unsafe after min-on."""
        self.dirty = False
        if not self.throttle_on:
            if self._risk_count:
                self.throttle_on = True
                self.throttle_since = now
                self.stats.throttle_engagements += 1
                min_on = self.config.slack.min_on_ms
                if min_on > 0:
                    self._push(now + min_on, 0, _MIN_ON)
                out.append(self._throttle_change(now))
        elif not self._unsafe_count and now >= self.throttle_since + self.config.slack.min_on_ms:
            self.throttle_on = False
            self.stats.throttle_ms += now - self.throttle_since
            out.append(self._throttle_change(now))

    def release(self, now: float, out: list[Output]) -> None:
        """Turn the throttle off at `now` whatever the streams say (edgemon is stopping)."""
        if self.throttle_on:
            self.throttle_on = False
            self.stats.throttle_ms += now - self.throttle_since
            out.append(self._throttle_change(now))

    def _throttle_change(self, now: float) -> ThrottleChanged:
        ranked = sorted((s.headroom_at(now), s.id) for s in self.live_streams())
        at_risk = [sid for _, sid in ranked if self.streams[sid].risk] if self.throttle_on else []
        return ThrottleChanged(
            device=self.id,
            t_ms=now,
            active=self.throttle_on,
            streams=tuple(at_risk[:MAX_LISTED_STREAMS]),
            min_headroom_ms=ranked[0][0] if ranked else None,
            margin_ms=self.margin,
        )

    # ------------------------------------------------------------------ lifecycle
    def _new_stream(
        self, stream_id: str, t_ms: float, *, start: StartEvent | None
    ) -> Stream | None:
        if len(self.streams) >= self.config.limits.max_streams_per_device:
            return None
        self.tombstones.pop(stream_id, None)
        override = self.override
        player = (override.player if override else None) or (start.player if start else None)
        from_start = start.margin_ms if start else None
        stream = Stream(
            stream_id,
            t_ms=t_ms,
            rebuffer=(player or self.config.slack.player) == "rebuffer",
            margin=self._margin_for(from_start),
            margin_from_start=from_start,
            started_by_event=start is not None,
            play_start_ms=start.play_start_ms if start else None,
        )
        self.streams[stream_id] = stream
        self.stats.streams_started += 1
        return stream

    def _margin_for(self, from_start: float | None) -> float:
        """SPEC §2.4 order: device config, start event, engine object, hardware, default."""
        override = self.override
        if override is not None and override.margin_ms is not None:
            return override.margin_ms
        return self.base_margin if from_start is None else from_start

    def _end_underrun(self, stream: Stream, end: float, at: float, out: list[Output]) -> None:
        since = stream.underrun_since
        assert since is not None
        duration = max(0.0, end - since)
        stream.underrun_since = None
        self.open_underruns.pop(stream.id, None)
        stream.underrun_ms += duration
        self.stats.underrun_ms += duration
        out.append(UnderrunEnded(self.id, stream.id, at, duration))

    def _remove(self, stream: Stream, reason: str, now: float, out: list[Output]) -> None:
        stream.held = None
        if stream.underrun_provisional:
            self._confirm(stream, now, out)  # nothing can undo it once the stream is gone
        if stream.underrun_since is not None:
            self._end_underrun(stream, now, now, out)
        self._set_flags(stream, risk=False, unsafe=False)
        if stream.phase is Phase.LIVE:
            self.live -= 1
        self.dirty = True
        stream.due = math.nan  # its timer entries are stale from now on
        del self.streams[stream.id]
        self.live_index.note(stream)
        self._bury(stream.id, now)
        self.stats.finished[fold_reason(reason)] += 1
        out.append(
            StreamEnded(
                device=self.id,
                stream=stream.id,
                t_ms=now,
                reason=reason,
                chunks=stream.chunks,
                audio_ms=stream.buffered,
                underruns=stream.underruns,
                underrun_ms=stream.underrun_ms,
                min_slack_ms=stream.min_slack,
                time_to_first_audio_ms=stream.first_audio_ms,
            )
        )

    def _bury(self, stream_id: str, now: float) -> None:
        """Remember a removed id for one idle timeout, at most a few per allowed stream."""
        tombstones = self.tombstones
        tombstones[stream_id] = now
        horizon = now - self.config.slack.stream_idle_timeout_ms
        cap = 4 * self.config.limits.max_streams_per_device
        while tombstones:
            oldest, when = next(iter(tombstones.items()))
            if when >= horizon and len(tombstones) <= cap:
                break
            del tombstones[oldest]

    # ------------------------------------------------------------------ restore
    def adopt(self, stream: Stream) -> None:
        """Take a restored stream; its margin follows the configuration in force now."""
        stream.margin = self._margin_for(stream.margin_from_start)
        self.streams[stream.id] = stream
        if stream.phase is Phase.LIVE:
            self.live += 1
        if stream.underrun_since is not None and not stream.underrun_provisional:
            self.open_underruns[stream.id] = stream
        if stream.underrun_provisional and stream.underrun_since is not None:
            self.provisional[stream.id] = stream
            u = stream.underrun_since
            self._push(self._lateness_due(u), 0, Lateness(stream, u))
        if stream.held is not None:
            self._push(self._hold_due(stream.held), -1, HoldEnd(stream))

    def restore_timers(self, at: float) -> None:
        """Recompute flags, counts and timers of adopted streams from instant `at` on."""
        for stream in list(self.streams.values()):
            self._refresh(stream, at, [])
        min_on_until = self.throttle_since + self.config.slack.min_on_ms
        if self.throttle_on and min_on_until > at:
            self._push(min_on_until, 0, _MIN_ON)
        self.dirty = True

    # ------------------------------------------------------------------ engine object
    def set_engine_info(self, info: TtsEngineInfo, at: float) -> None:
        """Take a new engine object: margins of streams without their own may change."""
        self.engine_info = info
        margin = info.margin
        self.base_margin = self.config.slack.default_margin_ms if margin is None else margin
        self._remargin(at)

    def reconfigure(self, config: EngineConfig, at: float) -> None:
        """Take a reloaded configuration without losing any stream."""
        self.config = config
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
            self._push(at, 0, stream)
        self.dirty = True

    # ------------------------------------------------------------------ samples
    def _ensure_sampling(self, at: float) -> None:
        every = self.sample_every_ms
        if every is None or self._sample_due != INF:
            return
        self._sample_due = math.ceil(at / every) * every
        self._push(self._sample_due, 1, _SAMPLE)

    def _sample(self, now: float, out: list[Output]) -> None:
        self._sample_due = INF
        for stream in self.live_streams():
            head = stream.headroom_at(now)
            out.append(
                StreamSample(
                    device=self.id,
                    stream=stream.id,
                    t_ms=now,
                    slack_ms=stream.slack_at(now),
                    eta_ms=stream.eta_at(now),
                    headroom_ms=head,
                    at_risk=head < stream.margin,
                )
            )
        if self.live and self.sample_every_ms is not None:
            due = now + self.sample_every_ms
            # A period below the float resolution at `now` must still move time on.
            self._sample_due = due if due > now else math.nextafter(now, INF)
            self._push(self._sample_due, 1, _SAMPLE)
