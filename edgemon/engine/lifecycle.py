"""A device's streams coming and going: created by their first event, removed with a summary.

A stream begins at a `start` or its first chunk (within the device's stream limit) and ends by
an `end`, by playing out its `final` chunk, or by expiry; its removal settles any underrun it
is in and emits its `StreamEnded` summary (docs/semantics.md). Its id is then buried for a while
(`edgemon.engine.tombstones`) so that late redeliveries do not bring it back.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from edgemon.engine.outputs import StreamEnded
from edgemon.engine.state import DeviceState
from edgemon.engine.stats import fold_reason
from edgemon.engine.stream import Phase, Stream

if TYPE_CHECKING:
    from edgemon.engine.events import StartEvent
    from edgemon.engine.outputs import Output


class Lifecycle(DeviceState):
    """A `Device` creating and removing streams, with the margins they take (the root of
    `Device`'s bases, on `DeviceState`)."""

    __slots__ = ()

    def _margin_for(self, from_start: float | None) -> float:
        """docs/semantics.md order: device config, start event, engine object, hardware, default."""
        override = self.override
        if override is not None and override.margin_ms is not None:
            return override.margin_ms
        return self.base_margin if from_start is None else from_start

    def _new_stream(
        self, stream_id: str, t_ms: float, *, start: StartEvent | None
    ) -> Stream | None:
        if len(self.streams) >= self.config.limits.max_streams_per_device:
            return None
        self.tombstones.unbury(stream_id)
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

    def _remove(self, stream: Stream, reason: str, now: float, out: list[Output]) -> None:
        stream.held = None
        if stream.underrun_provisional:
            self.lateness.confirm(stream, now, out)  # nothing can undo it once the stream is gone
        if stream.underrun_since is not None:
            self.lateness.end_underrun(stream, now, now, out)
        self.throttle.note(stream, risk=False, unsafe=False)
        if stream.phase is Phase.LIVE:
            self.live -= 1
        self.throttle.dirty = True
        stream.due = math.nan  # its timer entries are stale from now on
        del self.streams[stream.id]
        self.live_index.note(stream)
        config = self.config
        self.tombstones.bury(
            stream.id, now, keep_ms=config.slack.stream_idle_timeout_ms,
            cap=4 * config.limits.max_streams_per_device,
        )  # fmt: skip
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
