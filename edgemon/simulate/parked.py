"""edgemon's parking (`edgemon.policy.parking`) as the simulated engine's pacing.

The same rule, fed the leads the players measured (edgemon's slack feed, handed in by the
caller), their true buffers (the oracle, handed in the same way), or the leads the server
estimates (the peers' formula, `estimated.Stream.lead_ms`).
What a stream needs to rejoin in time: its margin, its next chunk's frames at the engine's
step estimate, and the delivery to its player.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgemon.policy.parking import Lead, Parking

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from edgemon.engine.feed import SlackEntry
    from edgemon.simulate.estimated import Stream

FEEDS = ("measured", "estimated", "none", "oracle")
"""What edgemon's policy is fed of its players: their measured state, the server's estimate,
neither, or (an upper bound no protocol gives) each player's true buffer at every instant."""
PARKING_FEEDS = ("measured", "estimated", "oracle")
"""The feeds parking can run on."""


class FedParking:
    """The parking rule on `feed`'s leads (`measured(stream)`: the stream's entry in
    edgemon's slack feed as the engine last received it, or its player's true state for the
    oracle; or the estimate)."""

    __slots__ = ("_measured", "_rule", "delivery_ms", "feed", "margin_ms", "step_ms")

    frees_seats = True
    """A parked stream's batch row is free for another request."""

    def __init__(
        self,
        feed: str,
        *,
        measured: Callable[[str], SlackEntry | None],
        step_ms: Callable[[], float],
        margin_ms: float,
        delivery_ms: float,
    ) -> None:
        if feed not in PARKING_FEEDS:
            raise ValueError(f"parking is fed one of {', '.join(PARKING_FEEDS)}, not {feed!r}")
        self.feed = feed
        self._measured = measured
        self._rule = Parking()
        self.step_ms = step_ms
        self.margin_ms = margin_ms
        self.delivery_ms = delivery_ms

    def _leads(self, now_ms: float, streams: Sequence[Stream]) -> list[Lead]:
        """Each stream's lead on the feed (the estimate takes every stream that sent a chunk
        to be playing, as the peers do)."""
        step, fixed = self.step_ms(), self.margin_ms + self.delivery_ms
        if self.feed == "estimated":
            return [Lead(s.id, s.lead_ms(now_ms), fixed + s.next_frames * step) for s in streams]
        leads = []
        for s in streams:
            entry = self._measured(s.id)
            lead = None if entry is None else entry.slack_at(now_ms)
            playing = entry is not None and entry.play_start_ms <= now_ms
            leads.append(Lead(s.id, lead, fixed + s.next_frames * step, playing=playing))
        return leads

    def held(
        self, now_ms: float, streams: Sequence[Stream], free_rows: int, *, waiting: int = 0
    ) -> frozenset[str]:
        """The streams parked for this step."""
        leads = self._leads(now_ms, streams)
        return self._rule.held(leads, waiting=waiting, free_rows=free_rows)

    def spare(self, now_ms: float, streams: Sequence[Stream]) -> frozenset[str]:
        """The streams parked, or that could be parked, now: their rows count as free."""
        return self._rule.spare(self._leads(now_ms, streams))

    def ended(self, stream: str) -> None:
        """`stream` finished (the rule forgets streams no longer running by itself)."""
