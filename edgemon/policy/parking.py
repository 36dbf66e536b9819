"""Parking: a running stream whose player holds plenty of audio sits steps out, so that its
compute and its batch row go to a request that waits; it rejoins before its player runs low.

One rule, fed either of two views of each player's buffer (issue 40's ablation):

- **measured**: what the player reported to edgemon (its slack feed, docs/protocol.md): a
  listener who paused, a player that waits for more audio before it starts, a Wi-Fi link that
  held the last chunks back, all show in it;
- **estimated**: what the server can work out alone, the peers' formula (audio sent − time
  since the first chunk was sent), blind to all of those.

A stream is parked when its lead exceeds what it needs to rejoin in time (`need_ms`: the
margin, and the time its next chunk takes to make and deliver) by more than `band_ms`, and
only for a request that waits with no row free for it (parking with nobody to take the
compute buys nothing): at most one stream per such request, the longest leads first. It rejoins
as soon as its lead falls to what it needs, whatever the rows free (a short stream is never
kept out: protection comes before the waiting request). A stream whose lead is unknown, or
whose player has not started playing (its listener still waits in silence), is never parked,
and a parked one whose lead became unknown rejoins.

Pure and clock-free: the engine asks, at the start of every step, which running streams sit
it out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

BAND_MS = 600.0
"""How far beyond what it needs a stream's lead must be before it is parked (the 1.0 s park
and 0.4 s resume leads of sglang-omni #1903 are 600 ms apart)."""


@dataclass(frozen=True, slots=True)
class Lead:
    """A running stream as the parking rule sees it."""

    id: str
    lead_ms: float | None
    """The audio its player holds ahead of playback now (None: unknown)."""
    need_ms: float
    """The least lead it may be left with: its margin and the time its next chunk takes to
    make and deliver once it rejoins."""
    playing: bool = True
    """Its player has started playing (False: its listener still waits for the start)."""


class Parking:
    """The parking rule; see the module doc."""

    __slots__ = ("_parked", "band_ms")

    def __init__(self, band_ms: float = BAND_MS) -> None:
        if not band_ms >= 0:
            raise ValueError(f"the band must be a number ≥ 0, not {band_ms!r}")
        self.band_ms = band_ms
        self._parked: set[str] = set()

    def spare(self, leads: Sequence[Lead]) -> frozenset[str]:
        """The streams parked now or that could be: their rows are as good as free for a
        request that arrives (it is admitted, and one of them parked for it)."""
        return frozenset(
            lead.id for lead in leads if lead.id in self._parked or self._parkable(lead)
        )

    def _parkable(self, lead: Lead) -> bool:
        known = lead.lead_ms
        return lead.playing and known is not None and known > lead.need_ms + self.band_ms

    def held(self, leads: Sequence[Lead], *, waiting: int, free_rows: int) -> frozenset[str]:
        """The streams that sit this step out, given every running stream's lead now, how
        many requests wait for admission and how many batch rows are free for them."""
        parked = self._parked
        parked &= {lead.id for lead in leads}  # ended streams leave
        candidates: list[tuple[float, str]] = []
        for lead in leads:
            known = lead.lead_ms
            if lead.id in parked:
                if known is None or known <= lead.need_ms:
                    parked.discard(lead.id)  # it rejoins now, rows or not
            elif known is not None and self._parkable(lead):
                candidates.append((known - lead.need_ms, lead.id))
        wanted = waiting - max(0, free_rows)
        if wanted > 0 and candidates:
            candidates.sort(reverse=True)
            parked.update(name for _, name in candidates[:wanted])
        return frozenset(parked)
