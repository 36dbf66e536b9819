"""Samples of every live stream at a fixed period (`replay --sample-ms`, SPEC §4).

Samples are timers of the lowest priority: at an instant they come after its messages, its
timers and the throttle decision. Sampling starts with a device's first live stream and stops
when it has none.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from edgemon.engine.headroom import INF
from edgemon.engine.outputs import StreamSample
from edgemon.engine.state import DeviceState
from edgemon.engine.timers import SAMPLE

if TYPE_CHECKING:
    from edgemon.engine.lateness import ConfirmDeadline, HoldEnd
    from edgemon.engine.outputs import Output
    from edgemon.engine.stream import Stream


class Sampling(DeviceState):
    """The part of a `Device` that samples its live streams (a base class of `Device`)."""

    __slots__ = ()

    if TYPE_CHECKING:

        def live_streams(self) -> list[Stream]: ...
        def _push(
            self, due: float, priority: int, what: Stream | str | ConfirmDeadline | HoldEnd
        ) -> None: ...

    def _ensure_sampling(self, at: float) -> None:
        every = self.sample_every_ms
        if every is None or self._sample_due != INF:
            return
        self._sample_due = math.ceil(at / every) * every
        self._push(self._sample_due, 1, SAMPLE)

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
            self._push(self._sample_due, 1, SAMPLE)
