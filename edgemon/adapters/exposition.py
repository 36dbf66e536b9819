"""`/metrics` rendered on the event loop in slices, so that a scrape never holds up a deadline.

The engine belongs to the event loop thread, so it is read there; but a scrape of 10,000
streams on 100 devices is tens of thousands of samples, far more work than the 2 ms a
transition may wait (README). So the engine is read one device at a time and the text is
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
from typing import TYPE_CHECKING, Any, Final

from prometheus_client.exposition import choose_encoder

from edgemon.adapters.clearance import clear_of_deadlines
from edgemon.adapters.metrics import EdgemonRegistry

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

    from edgemon.adapters.metrics import EdgemonCollector

__all__ = ["Slicer", "render", "render_parts"]

#: Samples encoded between two looks at the clock.
SAMPLES_PER_PIECE: Final = 64
#: The engine's text is cut into pieces of whole families, each piece at least this size
#: (characters; a family of per-stream series at 10,000 streams is about 200 kB), never
#: joined whole: a buffer the size of the page (about 1 MB at 10,000 streams), allocated
#: anew for each copy of it (a join, an encoding, headers in front), costs more in fresh
#: memory pages than the copy itself.
PART_BYTES: Final = 64 * 1024
_EOF: Final = b"# EOF\n"


class Slicer:
    """`await slicer()` yields to the event loop once `budget_s` of work has run since the
    last yield; otherwise it returns at once.

    With `until_deadline` (ms until the engine's next transition, None if none), a slice
    does not start within `clear_ms` of a transition: the slicer sleeps past it first (at
    most `max_wait_s` per call, so a fleet with transitions every millisecond still gets
    scraped), and the deadline task fires with nothing in its way. With `busy` (the throttle
    publisher has an object to send), no slice starts until it is sent: a transition that
    just fired goes out on the wire before the scrape goes on (sending takes a few turns of
    the loop, and a slice could otherwise run in each; also at most `max_wait_s`).
    """

    __slots__ = ("_budget", "_busy", "_clear", "_max_wait", "_since", "_until", "yields")

    def __init__(
        self,
        budget_s: float = 0.0005,
        *,
        until_deadline: Callable[[], float | None] | None = None,
        busy: Callable[[], bool] | None = None,
        clear_ms: float = 2.0,
        max_wait_s: float = 0.02,
    ) -> None:
        self._budget = budget_s
        self._until = until_deadline
        self._busy = busy
        self._clear = clear_ms
        self._max_wait = max_wait_s
        self._since = time.perf_counter()
        self.yields = 0

    async def __call__(self) -> None:
        """A possible yield point."""
        if time.perf_counter() - self._since < self._budget:
            return
        await self.now()

    async def now(self) -> None:
        """A yield, whatever the budget: before work that cannot be cut (the body's last
        join and its write to the socket), so that it too starts clear of a transition."""
        self.yields += 1
        await asyncio.sleep(0)
        if self._until is not None or self._busy is not None:
            await clear_of_deadlines(self._until, self._clear, self._max_wait, self._busy)
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


def _groups(families: list[Metric]) -> Iterator[list[Metric]]:
    """Families in order, small ones together (one encoder call for up to
    `SAMPLES_PER_PIECE` samples), a large one alone (to be cut into pieces)."""
    group: list[Metric] = []
    size = 0
    for family in families:
        n = len(family.samples)
        if group and size + n > SAMPLES_PER_PIECE:
            yield group
            group, size = [], 0
        group.append(family)
        size += n
    if group:
        yield group


async def render(
    registry: CollectorRegistry, accept: str, slicer: Slicer | None = None
) -> tuple[bytes, str]:
    """The exposition for an `Accept` header: (body, content type)."""
    parts, content_type = await render_parts(registry, accept, slicer)
    return b"".join(parts), content_type


async def render_parts(
    registry: CollectorRegistry, accept: str, slicer: Slicer | None = None
) -> tuple[list[bytes], str]:
    """The exposition for an `Accept` header as pieces to be written in order: whole
    families of `PART_BYTES` or more (the engine's), or one family group each. Returns
    (pieces, content type)."""
    slicer = slicer or Slicer()
    encoder, content_type = choose_encoder(accept)
    openmetrics = content_type.startswith("application/openmetrics-text")
    parts: list[bytes] = []
    if isinstance(registry, EdgemonRegistry):
        parts += await _engine_families(registry.edgemon, encoder, slicer)
        families = [*registry.edgemon.daemon_families(), *registry.collect_others()]
    else:
        families = list(registry.collect())
    for group in _groups(families):
        pieces = [[piece] for piece in _pieces(group[0])] if len(group) == 1 else [group]
        for n, piece in enumerate(pieces):
            text = encoder(_Families(*piece))
            if openmetrics:
                text = text.removesuffix(_EOF)
            parts.append(_samples_only(text) if n else text)
            await slicer()
    if openmetrics:
        parts.append(_EOF)
    return parts, content_type


async def _engine_families(
    collector: EdgemonCollector, encoder: Callable[[Any], bytes], slicer: Slicer
) -> list[bytes]:
    """The engine's families, read and written one device at a time, each device's lines as
    text at once (`EdgemonCollector.device_text`: no sample objects). Each family's header
    comes from the encoder, from the family without samples that `describe` gives.
    """
    declared = list(collector.describe())
    bodies: list[list[str]] = [[] for _ in declared]
    for device_id in collector.device_ids():
        texts = collector.device_text(device_id)
        if texts is not None:
            for i, text in texts:
                bodies[i].append(text)
        await slicer()
    parts: list[bytes] = []
    pending: list[str] = []
    size = 0
    for family, lines in zip(declared, bodies, strict=True):
        if not lines:
            continue
        text = "".join([_header(encoder, family), *lines])
        pending.append(text)
        size += len(text)
        if size >= PART_BYTES:
            parts.append("".join(pending).encode())
            pending, size = [], 0
            await slicer()
    if pending:
        parts.append("".join(pending).encode())
    return parts


#: The engine families' header lines, by encoder and family name (the same every scrape).
_HEADERS: dict[tuple[Callable[[Any], bytes], str], str] = {}


def _header(encoder: Callable[[Any], bytes], family: Metric) -> str:
    """A family's `# HELP`/`# TYPE` lines as the encoder writes them."""
    key = (encoder, family.name)
    header = _HEADERS.get(key)
    if header is None:
        bare = copy.copy(family)
        bare.samples = []
        header = _HEADERS[key] = encoder(_Families(bare)).removesuffix(_EOF).decode()
    return header


def _samples_only(text: bytes) -> bytes:
    """A family's text without its header lines (a continuation piece)."""
    return b"".join(line for line in text.splitlines(keepends=True) if not line.startswith(b"# "))
