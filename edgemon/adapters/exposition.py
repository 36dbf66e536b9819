"""`/metrics` rendered on the event loop in slices, so that a scrape never holds up a deadline.

The engine belongs to the event loop thread, so it is read there; but a scrape of 10,000
streams on 100 devices is tens of thousands of samples, far more work than the 2 ms a
transition may wait (SPEC §5). So the engine is read one device at a time and the text is
encoded a few dozen samples at a time, and whenever a slice has run for `budget_s` the
renderer yields to the loop: due deadlines and messages go first. Each device is read whole,
between two messages, at its own clock's current time.

A thread would not do: it would hold the GIL for up to the interpreter's switch interval
(5 ms) whenever the loop thread wakes for a deadline.
"""

from __future__ import annotations

import asyncio
import copy
import time
from typing import TYPE_CHECKING, Final

from prometheus_client.exposition import choose_encoder

from edgemon.adapters.metrics import EdgemonRegistry

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

__all__ = ["Slicer", "render"]

#: Samples encoded between two looks at the clock.
SAMPLES_PER_PIECE: Final = 64
_EOF: Final = b"# EOF\n"


class Slicer:
    """`await slicer()` yields to the event loop once `budget_s` of work has run since the
    last yield; otherwise it returns at once."""

    __slots__ = ("_budget", "_since", "yields")

    def __init__(self, budget_s: float = 0.0005) -> None:
        self._budget = budget_s
        self._since = time.perf_counter()
        self.yields = 0

    async def __call__(self) -> None:
        """A possible yield point."""
        if time.perf_counter() - self._since >= self._budget:
            self.yields += 1
            await asyncio.sleep(0)
            self._since = time.perf_counter()


class _Families:
    """A stand-in registry that yields given families (what the encoders take)."""

    __slots__ = ("_families",)

    def __init__(self, *families: Metric) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def _pieces(family: Metric) -> Iterator[Metric]:
    """The family cut into families of at most `SAMPLES_PER_PIECE` samples, in order."""
    samples = family.samples
    if len(samples) <= SAMPLES_PER_PIECE:
        yield family
        return
    for start in range(0, len(samples), SAMPLES_PER_PIECE):
        piece = copy.copy(family)
        piece.samples = samples[start : start + SAMPLES_PER_PIECE]
        yield piece


async def render(
    registry: CollectorRegistry, accept: str, slicer: Slicer | None = None
) -> tuple[bytes, str]:
    """The exposition for an `Accept` header: (body, content type)."""
    slicer = slicer or Slicer()
    encoder, content_type = choose_encoder(accept)
    if isinstance(registry, EdgemonRegistry):
        families = await registry.edgemon.collect_sliced(slicer)
        families.extend(registry.collect_others())
    else:
        families = list(registry.collect())
    openmetrics = content_type.startswith("application/openmetrics-text")
    parts: list[bytes] = []
    for family in families:
        for n, piece in enumerate(_pieces(family)):
            text = encoder(_Families(piece))
            if openmetrics and text.endswith(_EOF):
                text = text[: -len(_EOF)]
            if n:  # a continuation: its samples only, not the family's header again
                text = b"".join(
                    line for line in text.splitlines(keepends=True) if not line.startswith(b"# ")
                )
            parts.append(text)
            await slicer()
    if openmetrics:
        parts.append(_EOF)
    return b"".join(parts), content_type
