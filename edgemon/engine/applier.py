"""What each event does to a device's streams (docs/semantics.md), at the instant it takes effect.

A `start` creates its stream; an `end` applies what its stream still holds and removes it; a
chunk is applied in `seq` order: one ahead of a missing `seq` waits in its stream's reorder
buffer (`edgemon.engine.reorder_release`), and each chunk applied may let held ones follow. The
device decides the instant (`Device.receive`) and fires the timers; a timer of a held chunk
or of a provisional underrun comes back here (`Applier.timer`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgemon.engine.arrival import take_chunk
from edgemon.engine.events import ChunkEvent, EndEvent, StartEvent
from edgemon.engine.headroom import INF
from edgemon.engine.stream import DRAINING, LIVE
from edgemon.engine.timers import SAMPLE, HoldEnd

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from edgemon.engine.config import EngineConfig
    from edgemon.engine.events import Event
    from edgemon.engine.lateness import LatenessState
    from edgemon.engine.lifecycle import Lifecycle
    from edgemon.engine.outputs import Output
    from edgemon.engine.reorder_release import Reordering
    from edgemon.engine.sampling import Sampler
    from edgemon.engine.stats import DeviceStats
    from edgemon.engine.stream import Stream
    from edgemon.engine.timers import ConfirmDeadline, TimerHeap


class Applier:
    """A device's events applied to its streams: a part a `Device` holds, owning the gap
    estimate over all the device's streams. It shares the device's streams, stats, streams'
    lives, late delivery, reorder buffers' waits, sampler and timer heap; the device gives
    it the configuration in force (`configure`)."""

    __slots__ = (
        "_default_gap_ms",
        "_lateness",
        "_lifecycle",
        "_reordering",
        "_sampler",
        "_stats",
        "_streams",
        "_timers",
        "gap_ewma",
    )

    def __init__(
        self,
        config: EngineConfig,
        *,
        streams: dict[str, Stream],
        stats: DeviceStats,
        lifecycle: Lifecycle,
        lateness: LatenessState,
        reordering: Reordering,
        sampler: Sampler,
        timers: TimerHeap,
    ) -> None:
        self._streams = streams
        self._stats = stats
        self._lifecycle = lifecycle
        self._lateness = lateness
        self._reordering = reordering
        self._sampler = sampler
        self._timers = timers
        #: The gap between deliveries over all the device's streams (EWMA, ms): the ETA of a
        #: chunk that gives none, in a stream without a gap estimate of its own.
        self.gap_ewma: float | None = None
        self.configure(config)

    def configure(self, config: EngineConfig) -> None:
        """Take the configuration in force (at creation and on a reload)."""
        self._default_gap_ms = config.slack.default_chunk_gap_ms

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

    def apply_all(self, events: Sequence[Event], at: float, out: list[Output]) -> list[str]:
        """`apply` each of a message's events in turn at device instant `at`; their labels."""
        chunk = self._chunk
        results: list[str] = []
        append = results.append
        for event in events:
            append(
                chunk(event, at, out) if type(event) is ChunkEvent else self.apply(event, at, out)
            )
        return results

    def timer(self, what: ConfirmDeadline | HoldEnd, now: float, out: list[Output]) -> None:
        """A late-delivery wait came at `now`: held chunks that waited long enough are
        applied (the hole before each declared a gap), or a provisional underrun that
        waited long enough is confirmed."""
        stream = what.stream
        if self._streams.get(stream.id) is not stream:
            return
        if self._lateness.confirm_held:
            return  # waits: `resume_confirmations` arms these afresh
        if isinstance(what, HoldEnd):
            if self._reordering.waited(stream, now):
                self._apply_held(self._reordering.expire(stream, now, out), now, out)
        else:
            self._lateness.deadline(what, now, out)

    def flush_held(self, stream: Stream, at: float, out: list[Output]) -> None:
        """No more waiting (an `end`, an expiry, too many held): apply every held chunk,
        declaring the gaps."""
        self._apply_held(self._reordering.flush(stream, at, out), at, out)

    def _start(self, event: StartEvent, at: float, out: list[Output]) -> str:
        if event.stream in self._streams:
            return "duplicate"
        stream = self._lifecycle.new_stream(event.stream, event.t_ms, start=event)
        if stream is None:
            return "stream_limit"
        self._lifecycle.refresh(stream, at, out)
        return "accepted"

    def _end(self, event: EndEvent, at: float, out: list[Output]) -> str:
        stream = self._streams.get(event.stream)
        lifecycle = self._lifecycle
        if stream is None:
            return "duplicate" if event.stream in lifecycle.tombstones else "unknown_stream"
        if stream.held is not None:
            self.flush_held(stream, at, out)  # the end comes after every chunk sent
        if stream.underrun_provisional:
            assert stream.underrun_since is not None
            if event.t_ms <= stream.underrun_since:
                self._lateness.retract(stream, at, out)  # ended before its buffer ran dry
            else:
                self._lateness.confirm(stream, at, out)
        lifecycle.remove(stream, event.reason or "completed", at, out, ended_ms=event.t_ms)
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
        stream = self._streams.get(event.stream)
        lifecycle = self._lifecycle
        if stream is None:
            if event.seq > 0 and event.stream in lifecycle.tombstones:
                return "duplicate"
            stream = lifecycle.new_stream(event.stream, event.t_ms, start=None)
            if stream is None:
                return "stream_limit"
        if event.seq <= stream.last_seq:
            return "duplicate"
        if stream.phase is DRAINING:
            return "after_final"
        gap = event.seq > stream.last_seq + 1
        if gap and not in_order and self._lateness.allowed_ms > 0.0:
            return self._hold(stream, event, at, out)
        self.gap_ewma = take_chunk(
            stream, event, gap, self._stats, self.gap_ewma, self._default_gap_ms
        )
        if stream.underrun_since is not None:
            lateness = self._lateness
            lateness.chunk_in_underrun(
                stream, event.t_ms, at, out, floor if in_order else lateness.horizon
            )
        if stream.phase is LIVE:
            if event.final:
                stream.phase = DRAINING
                lifecycle.live -= 1
        elif event.final:
            stream.phase = DRAINING
        else:
            stream.phase = LIVE
            lifecycle.live += 1
            due = self._sampler.start(at)
            if due is not None:
                self._timers.push(due, 1, SAMPLE)
        if stream.phase is DRAINING and stream.empties_at <= at:
            lifecycle.remove(stream, "completed", at, out)
        else:
            lifecycle.refresh(stream, at, out)
        if stream.held is not None and not in_order:
            self._apply_held(self._reordering.release(stream, at, out), at, out)
        return "gap" if gap else "accepted"

    def _hold(self, stream: Stream, event: ChunkEvent, at: float, out: list[Output]) -> str:
        """Keep a chunk that arrived ahead of a missing `seq` (docs/semantics.md)."""
        result = self._reordering.hold(stream, event, at)
        if result == "full":
            self.flush_held(stream, at, out)  # too far ahead: the holes are gaps now
            return "accepted"
        return result

    def _apply_held(
        self, due: Iterator[tuple[ChunkEvent, float]], at: float, out: list[Output]
    ) -> None:
        """Apply held chunks in the order `due` gives them (it chooses each after the last
        one counted)."""
        for event, floor in due:
            self._chunk(event, at, out, in_order=True, floor=floor)
