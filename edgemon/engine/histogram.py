"""Cumulative bucket counts kept by the engine, exported by the metrics adapter."""

from __future__ import annotations

from bisect import bisect_left


class Histogram:
    """Observations counted into fixed upper bounds (`le`, inclusive), plus their sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # last slot: above every bound (+Inf)
        self.total = 0.0

    def observe(self, value: float) -> None:
        """Count one observation."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    @property
    def count(self) -> int:
        """How many observations."""
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """`(le, count ≤ le)` pairs ending with `(inf, count)`, as Prometheus exposes them."""
        running = 0
        pairs = []
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            pairs.append((bound, running))
        return pairs


# Bucket bounds in milliseconds (the engine's unit); the exporter shows them in seconds.
SLACK_AT_ARRIVAL_MS = (-1000.0, -500.0, -250.0, -100.0, -50.0, 0.0, 50.0, 100.0, 200.0, 300.0,
                       500.0, 750.0, 1000.0, 1500.0, 2000.0, 3000.0, 5000.0, 10000.0)  # fmt: skip
CHUNK_GAP_MS = (10.0, 25.0, 50.0, 100.0, 200.0, 300.0, 500.0, 750.0, 1000.0, 1500.0, 2000.0,
                3000.0, 5000.0, 10000.0)  # fmt: skip
TIME_TO_FIRST_AUDIO_MS = (10.0, 25.0, 50.0, 75.0, 100.0, 150.0, 200.0, 300.0, 500.0, 1000.0,
                          2000.0, 5000.0)  # fmt: skip
START_SILENCE_MS = (50.0, 100.0, 200.0, 300.0, 500.0, 750.0, 1000.0, 1500.0, 2000.0, 3000.0,
                    5000.0, 10000.0, 20000.0)  # fmt: skip
#: A stream's longest gap, around the continuity SLO (100 ms by default): 0 for the streams
#: without any (most of them), 20 ms steps up to 100 so that a quantile near the threshold is
#: read between close bounds and `le="0.1"` counts the streams that met the default exactly,
#: then up to 5 s, past which a gap is an outage rather than a glitch.
LONGEST_GAP_MS = (0.0, 20.0, 40.0, 60.0, 80.0, 100.0, 150.0, 200.0, 300.0, 500.0, 1000.0,
                  2000.0, 5000.0)  # fmt: skip
