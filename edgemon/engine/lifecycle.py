"""A device's streams coming and going, and each one's next instant (docs/semantics.md).

A stream begins at a `start` or its first chunk (within the device's stream limit) and ends by
an `end`, by playing out its `final` chunk, or by expiry; its removal settles any underrun it
is in, judges its service level and emits its `StreamEnded` summary. Its id is then buried
for a while (`edgemon.engine.tombstones`) so that late redeliveries do not bring it back.

Between events each stream has one next instant, armed in the device's timer heap: when a
flag of a live stream changes or its buffer runs dry, when it expires, or when a draining
stream has played out. `Lifecycle.refresh` brings a stream's flags and underrun to an instant
and arms that timer; `Lifecycle.wake` handles it when it comes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from edgemon.engine.headroom import INF
from edgemon.engine.outputs import StreamEnded
from edgemon.engine.service_level import outcome
from edgemon.engine.stats import fold_reason
from edgemon.engine.stream import DRAINING, LIVE, WAITING, Stream
from edgemon.engine.tombstones import Tombstones

if TYPE_CHECKING:
    from edgemon.engine.config import EngineConfig
    from edgemon.engine.events import StartEvent
    from edgemon.engine.lateness import LatenessState
    from edgemon.engine.live_index import LiveIndex
    from edgemon.engine.margins import Margins
    from edgemon.engine.outputs import Output
    from edgemon.engine.stats import DeviceStats
    from edgemon.engine.throttle import ThrottleState
    from edgemon.engine.timers import TimerHeap


class Lifecycle:
    """The lives of a device's streams: a part a `Device` holds, owning the count of live
    streams and the tombstones. It shares the device's streams, live index, margins, stats,
    throttle state (the flags it counts), late delivery (underruns) and timer heap; the
    device gives it the configuration in force (`configure`)."""

    __slots__ = (
        "_config",
        "_device_id",
        "_hysteresis_ms",
        "_idle_ms",
        "_lateness",
        "_live_index",
        "_margins",
        "_stats",
        "_streams",
        "_throttle",
        "_timers",
        "live",
        "tombstones",
    )

    def __init__(  # noqa: PLR0913 - keyword-only, the device's parts it shares
        self,
        device_id: str,
        config: EngineConfig,
        *,
        streams: dict[str, Stream],
        live_index: LiveIndex,
        margins: Margins,
        stats: DeviceStats,
        throttle: ThrottleState,
        lateness: LatenessState,
        timers: TimerHeap,
    ) -> None:
        self._device_id = device_id
        self._streams = streams
        self._live_index = live_index
        self._margins = margins
        self._stats = stats
        self._throttle = throttle
        self._lateness = lateness
        self._timers = timers
        #: Streams in phase LIVE.
        self.live = 0
        #: Recently removed stream ids and when: late redeliveries must not resurrect them.
        self.tombstones = Tombstones()
        self.configure(config)

    def configure(self, config: EngineConfig) -> None:
        """Take the configuration in force (at creation and on a reload)."""
        self._config = config
        self._idle_ms = config.slack.stream_idle_timeout_ms
        self._hysteresis_ms = config.slack.hysteresis_ms

    # ------------------------------------------------------------------ coming and going
    def new_stream(self, stream_id: str, t_ms: float, *, start: StartEvent | None) -> Stream | None:
        """A stream begun at `t_ms` by its `start` event (None: by its first chunk); None
        beyond the device's stream limit."""
        config = self._config
        if len(self._streams) >= config.limits.max_streams_per_device:
            return None
        self.tombstones.unbury(stream_id)
        override = self._margins.override
        player = (override.player if override else None) or (start.player if start else None)
        from_start = start.margin_ms if start else None
        stream = Stream(
            stream_id,
            t_ms=t_ms,
            rebuffer=(player or config.slack.player) == "rebuffer",
            margin=self._margins.for_stream(from_start),
            margin_from_start=from_start,
            started_by_event=start is not None,
            play_start_ms=start.play_start_ms if start else None,
        )
        self._streams[stream_id] = stream
        self._stats.streams_started += 1
        return stream

    def remove(
        self,
        stream: Stream,
        reason: str,
        now: float,
        out: list[Output],
        *,
        ended_ms: float | None = None,
    ) -> None:
        """Remove a stream at `now` for `reason`, settling its underrun, with its summary and
        its service level; `ended_ms`: when an `end` event says it ended (else `now`)."""
        stream.held = None
        lateness = self._lateness
        if stream.underrun_provisional:
            lateness.confirm(stream, now, out)  # nothing can undo it once the stream is gone
        if stream.underrun_since is not None:
            lateness.end_underrun(stream, now, now, out)
        self._throttle.note(stream, risk=False, unsafe=False)
        if stream.phase is LIVE:
            self.live -= 1
        self._throttle.dirty = True
        stream.due = math.nan  # its timer entries are stale from now on
        del self._streams[stream.id]
        self._live_index.note(stream)
        self.tombstones.bury(
            stream.id, now, keep_ms=self._idle_ms,
            cap=4 * self._config.limits.max_streams_per_device,
        )  # fmt: skip
        stats = self._stats
        stats.finished[fold_reason(reason)] += 1
        judged = outcome(stream, reason, now if ended_ms is None else ended_ms, self._config.slo)
        stats.slo[judged] += 1
        if stream.chunks:
            stats.longest_gap.observe(stream.longest_gap_ms)
        out.append(
            StreamEnded(
                device=self._device_id,
                stream=stream.id,
                t_ms=now,
                reason=reason,
                chunks=stream.chunks,
                audio_ms=stream.buffered,
                underruns=stream.underruns,
                underrun_ms=stream.underrun_ms,
                min_slack_ms=stream.min_slack,
                time_to_first_audio_ms=stream.first_audio_ms,
                start_silence_ms=stream.start_silence_ms,
                longest_gap_ms=stream.longest_gap_ms,
                outcome=judged,
            )
        )

    def adopt(self, stream: Stream) -> None:
        """Take a stream restored from a snapshot; its margin follows the configuration in
        force now (its flags and timer: `restore_timers`)."""
        stream.margin = self._margins.for_stream(stream.margin_from_start)
        self._streams[stream.id] = stream
        if stream.phase is LIVE:
            self.live += 1
        self._lateness.adopt(stream)

    # ------------------------------------------------------------------ next instants
    def refresh(
        self, stream: Stream, now: float, out: list[Output], *, timer: bool = False
    ) -> None:
        """Bring a stream's underrun state and flags to `now`, and (re)arm its timer
        (`timer`: this is its timer firing)."""
        live_index = self._live_index
        if stream not in live_index.changed:  # else noted already: noting it again does nothing
            live_index.note(stream)
        phase = stream.phase
        if phase is LIVE:
            # A live stream's flags, then its next instant: the next change of a flag, or
            # when its buffer empties (expiry comes an idle timeout after: never first here),
            # unless it is empty already.
            empties = stream.start + stream.buffered
            risk, unsafe, due = stream.flags_at(now, self._hysteresis_ms)
            if risk != stream.risk or unsafe != stream.unsafe:
                self._throttle.note(stream, risk=risk, unsafe=unsafe)
            if stream.underrun_since is None and empties > now:
                if empties < due:
                    due = empties
            else:
                due = self._dry_due(stream, empties, due, now, out, timer=timer)
        elif phase is WAITING:
            due = stream.expires_at(self._idle_ms)
        else:
            self._throttle.note(stream, risk=False, unsafe=False)
            due = stream.empties_at
        if due < now:
            due = now  # an instant already passed is handled now, never in the past
        if due != stream.due:
            # The entry at the old instant goes stale and is skipped when it comes up.
            stream.due = due
            self._timers.push(due, 0, stream)

    def _dry_due(
        self,
        stream: Stream,
        empties: float,
        due: float,
        now: float,
        out: list[Output],
        *,
        timer: bool,
    ) -> float:
        """`refresh` of a live stream in underrun, or whose buffer ran dry (at `empties`) by
        `now`: its next instant (its flags change next at `due`), its underrun begun if due."""
        if stream.underrun_since is None:
            # Exactly when it ran dry by the device's times: `u`, or the chunk that left it
            # empty (late chunks can show that this was before edgemon's clock now).
            t_last = stream.t_last_chunk
            u = empties if empties > t_last else t_last
            if not timer and u >= now:
                # Empty from now on after a message: judged with this instant's timers, after
                # every message of the instant (a later one may refill the buffer).
                return now
            self._lateness.begin_underrun(stream, u, now, out)
        expiry = stream.expires_at(self._idle_ms)
        return expiry if expiry < due else due

    def wake(self, stream: Stream, now: float, out: list[Output]) -> bool:
        """The stream's timer came at `now`: it has played out, expired or is refreshed.
        True: it would expire, but chunks came and wait for a missing one, so it is not
        idle; the device applies them now (the holes declared gaps), which moves the
        expiry on."""
        stream.due = INF
        if stream.phase is DRAINING:
            if now >= stream.empties_at:
                self.remove(stream, "completed", now, out)
                return False
        elif now >= stream.expires_at(self._idle_ms):
            if stream.held is not None:
                return True
            self.remove(stream, "expired", now, out)
            return False
        self.refresh(stream, now, out, timer=True)
        return False

    def remargin(self, at: float) -> None:
        """The margins changed at `at`: every stream takes its own again and is refreshed."""
        for stream in list(self._streams.values()):
            stream.margin = self._margins.for_stream(stream.margin_from_start)
            self._live_index.note(stream)
            stream.due = min(stream.due, at)
            self._timers.push(at, 0, stream)
        self._throttle.dirty = True

    def restore_timers(self, at: float) -> None:
        """Recompute flags, counts and timers of adopted streams from instant `at` on."""
        for stream in list(self._streams.values()):
            self.refresh(stream, at, [])
        self._throttle.dirty = True
