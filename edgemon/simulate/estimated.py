"""What the peers do instead of measuring: pace streams by the server's estimate of each
client's buffer.

Every serving system found that schedules streaming audio by playback estimates the
client's buffer on the server, assuming the client starts playing the moment the first chunk
is sent and never stalls:

    estimated lead = audio sent − (now − when the first chunk was sent)

Two rules built on it, as baselines (`closed_loop.py --policy estimated-park`,
`estimated-edf`):

- **`EstimatedPark`** (sglang-omni #1903, `PlaybackLeadPacer`): a stream whose estimated
  lead exceeds `park_ms` (1.0 s) leaves the decode batch (its KV stays; its batch row is free
  for another request) until its lead would have fallen to `resume_ms` (0.4 s); at most
  `max_resume` (4) parked streams rejoin a step, and only into free rows unless the most
  overdue one is more than `overdue_ms` (0.2 s) late. Only audio in chunks already sent
  counts ("count only chunks actually sent"); a stream that has sent nothing is never parked.
- **`EstimatedEdf`** (vLLM-Omni PR #6600, `active_stream_policy: edf`, on the window of
  #3592): at most `window` streams decode in a step, those whose estimated buffer runs dry
  first; a stream that has sent nothing yet is due at its arrival plus the start SLO (the PR's
  formula for it is not public: this is ours). The others stay in the batch's rows, with their
  KV, and wait.

Pure and clock-injected: the simulated engine asks, at the start of every step, which of its
running streams sit this step out (`held`).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence

PARK_MS = 1000.0
RESUME_MS = 400.0
MAX_RESUME = 4
OVERDUE_MS = 200.0


@dataclass(frozen=True, slots=True)
class Stream:
    """A running request whose prefill is done, as the server sees it."""

    id: str
    arrival_ms: float
    first_sent_ms: float | None
    """When its first chunk was sent (None: none yet)."""
    sent_ms: float
    """Audio in the chunks it sent."""
    next_frames: int = 0
    """Frames its next chunk still needs."""

    def lead_ms(self, now_ms: float) -> float | None:
        """The estimated audio ahead of its player (None before its first chunk)."""
        if self.first_sent_ms is None:
            return None
        return self.sent_ms - (now_ms - self.first_sent_ms)


class Pacing(Protocol):
    """What the engine asks of a pacing rule."""

    @property
    def frees_seats(self) -> bool:
        """Whether a stream held out of steps frees its batch row for another request."""
        ...

    def held(
        self, now_ms: float, streams: Sequence[Stream], free_rows: int, *, waiting: int = 0
    ) -> frozenset[str]:
        """The streams that sit this step out (`free_rows`: batch rows free now; `waiting`:
        requests waiting for admission)."""
        ...

    def spare(self, now_ms: float, streams: Sequence[Stream]) -> frozenset[str]:
        """Running streams whose rows count as free for an arriving request, beyond those
        held this step (edgemon's parking: the streams it could park now)."""
        ...

    def ended(self, stream: str) -> None:
        """`stream` finished."""
        ...


class EstimatedPark:
    """sglang-omni's pacing by estimated lead; see the module doc."""

    __slots__ = ("_parked", "max_resume", "overdue_ms", "park_ms", "resume_ms")

    frees_seats = True
    """A parked stream's batch row is free for another request."""

    def __init__(
        self,
        park_ms: float = PARK_MS,
        resume_ms: float = RESUME_MS,
        *,
        max_resume: int = MAX_RESUME,
        overdue_ms: float = OVERDUE_MS,
    ) -> None:
        if not 0 <= resume_ms < park_ms:
            raise ValueError("the resume lead must be ≥ 0 and below the park lead")
        self.park_ms = park_ms
        self.resume_ms = resume_ms
        self.max_resume = max_resume
        self.overdue_ms = overdue_ms
        self._parked: dict[str, float] = {}  # stream -> when it wakes

    def held(
        self, now_ms: float, streams: Sequence[Stream], free_rows: int, *, waiting: int = 0
    ) -> frozenset[str]:
        """The streams that sit this step out: parked ones (after waking the due ones into
        `free_rows` free batch rows), and those whose lead passed the park lead now (whether
        requests wait or not)."""
        del waiting
        parked = self._parked
        due = [(wake, name) for name, wake in parked.items() if wake <= now_ms]
        if due:
            budget = min(self.max_resume, free_rows)
            if budget < 1 and now_ms - min(due)[0] > self.overdue_ms:
                budget = 1
            for _, name in heapq.nsmallest(max(0, budget), due):
                del parked[name]
        for stream in streams:
            if stream.id in parked:
                continue
            lead = stream.lead_ms(now_ms)
            if lead is not None and lead > self.park_ms:
                parked[stream.id] = now_ms + max(0.0, lead - self.resume_ms)
        return frozenset(parked)

    def spare(self, now_ms: float, streams: Sequence[Stream]) -> frozenset[str]:
        """None beyond the parked ones."""
        del now_ms, streams
        return frozenset()

    def ended(self, stream: str) -> None:
        """`stream` finished."""
        self._parked.pop(stream, None)


class EstimatedEdf:
    """vLLM-Omni's earliest-deadline-first window on the estimated buffer; see the module
    doc."""

    __slots__ = ("start_slo_ms", "window")

    frees_seats = False
    """A stream that waits keeps its batch row."""

    def __init__(self, window: int, start_slo_ms: float) -> None:
        if window < 1:
            raise ValueError(f"the window must be ≥ 1, not {window}")
        self.window = window
        self.start_slo_ms = start_slo_ms

    def due_ms(self, stream: Stream) -> float:
        """When its player is estimated to run dry (to be owed its start, before any audio)."""
        if stream.first_sent_ms is None:
            return stream.arrival_ms + self.start_slo_ms
        return stream.first_sent_ms + stream.sent_ms

    def held(
        self, now_ms: float, streams: Sequence[Stream], free_rows: int, *, waiting: int = 0
    ) -> frozenset[str]:
        """The streams beyond the `window` earliest due; they sit this step out."""
        del now_ms, free_rows, waiting  # the order alone decides
        if len(streams) <= self.window:
            return frozenset()
        ranked = sorted(streams, key=lambda s: (self.due_ms(s), s.arrival_ms))
        return frozenset(s.id for s in ranked[self.window :])

    def spare(self, now_ms: float, streams: Sequence[Stream]) -> frozenset[str]:
        """None: a stream that waits keeps its row."""
        del now_ms, streams
        return frozenset()

    def ended(self, stream: str) -> None:
        """`stream` finished (nothing is kept per stream)."""


@dataclass(frozen=True, slots=True)
class PacingSetting:
    """A pacing rule as a policy names it: `park` (lead thresholds) or `edf` (its window)."""

    kind: str
    park_ms: float = PARK_MS
    resume_ms: float = RESUME_MS
    window: int = 0

    def make(self, start_slo_ms: float) -> Pacing:
        """A fresh rule for one engine."""
        if self.kind == "park":
            return EstimatedPark(self.park_ms, self.resume_ms)
        return EstimatedEdf(self.window, start_slo_ms)
