"""Samples of every live stream at a fixed period (`replay --sample-ms`, README).

Samples are timers of the lowest priority: at an instant they come after its messages, its
timers and the throttle decision. Sampling starts with a device's first live stream and stops
when it has none.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from edgemon.engine.headroom import INF
from edgemon.engine.outputs import StreamSample

if TYPE_CHECKING:
    from collections.abc import Iterable

    from edgemon.engine.outputs import Output
    from edgemon.engine.stream import Stream


class Sampler:
    """When a device samples its live streams next: a part a `Device` holds, owning its
    period and its next instant. The device puts the instants it returns in its timer heap."""

    __slots__ = ("due", "every_ms")

    def __init__(self, every_ms: float | None) -> None:
        #: The period (None: no samples).
        self.every_ms = every_ms
        #: The next sampling instant (device clock), INF while none is armed.
        self.due = INF

    def start(self, at: float) -> float | None:
        """A stream went live at `at`: the first sampling instant to arm (on the period's
        grid), or None if sampling is off or already armed."""
        every = self.every_ms
        if every is None or self.due != INF:
            return None
        self.due = math.ceil(at / every) * every
        return self.due

    def sample(
        self, device_id: str, live: Iterable[Stream], now: float, out: list[Output]
    ) -> float | None:
        """Sample the `live` streams at `now`; the next instant to arm, or None when there
        are none left to sample (sampling starts again with the next live stream)."""
        self.due = INF
        sampled = False
        for stream in live:
            sampled = True
            head = stream.headroom_at(now)
            out.append(
                StreamSample(
                    device=device_id,
                    stream=stream.id,
                    t_ms=now,
                    slack_ms=stream.slack_at(now),
                    eta_ms=stream.eta_at(now),
                    headroom_ms=head,
                    at_risk=head < stream.margin,
                )
            )
        if not sampled or self.every_ms is None:
            return None
        due = now + self.every_ms
        # A period below the float resolution at `now` must still move time on.
        self.due = due if due > now else math.nextafter(now, INF)
        return self.due
