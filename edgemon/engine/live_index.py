"""A device's live streams, indexed so that reading the engine is cheap at any fleet size.

A scrape must not cost O(streams) per device (README: serving `/metrics` at 10,000 live
streams delays no transition by more than 2 ms). Between events a live stream (conceal
player) is fixed by `L = S + B` (when its buffer empties) and `P = S + B − E` (its headroom
plateau), and at instant `t` (docs/semantics.md, `edgemon.engine.headroom`):

    headroom(t) = min(P, L − t)        slack(t) = min(B, L − t)
    at risk(t)  ⟺  P < margin  or  t > L − margin

So each device keeps its live streams in a few lists sorted by `P`, `L`, `B` and
`L − margin` (`LiveIndex`). The device only notes which streams changed (O(1) per event);
the lists catch up on those at the next read. A read is then O(log n) for the minima and the
at-risk count, and the `k` lowest-headroom streams are among the `k` first by `P` and the `k`
first by `L` (each of those comes before any stream ranked after it by headroom, id).

Rebuffer players (slack never below zero, headroom not of that form once stalled) are few
and read directly.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import TYPE_CHECKING, TypeVar

from edgemon.engine.stream import Phase

if TYPE_CHECKING:
    from edgemon.engine.stream import Stream

_Key = tuple[float, str]
#: An entry of the list by `P`: (P, id, L, B); by `L`: (L, id, B). A stream's id is unique in
#: each list, so the values after it never decide the order; they are there for `lowest`,
#: which then reads nothing but the entries it meets (no lookup per stream found).
_ByPlateau = tuple[float, str, float, float]
_ByLasts = tuple[float, str, float]
_Entry = TypeVar("_Entry", _Key, _ByPlateau, _ByLasts)
#: Per stream in the index: (P, L, B, L − margin or None when the plateau is at risk).
_Keys = tuple[float, float, float, float | None]


class LiveIndex:
    """A device's live conceal-player streams sorted by the quantities above, kept lazily.

    The device calls `note(stream)` whenever a stream's audio, times, margin or phase may
    have changed or it was removed; `sync` brings the lists up to date. Notes beyond a cap
    (nobody reads) are dropped and the next `sync` rebuilds from the streams: memory stays
    bounded whether or not anyone scrapes.
    """

    __slots__ = (
        "_b",
        "_by_stream",
        "_cap",
        "_f",
        "_l",
        "_odd",
        "_p",
        "_plateau_risk",
        "_rebuild",
        "changed",
    )

    def __init__(self, cap: int) -> None:
        self.changed: set[Stream] = set()
        self._cap = cap
        self._rebuild = False
        self._by_stream: dict[str, tuple[Stream, _Keys]] = {}
        self._p: list[_ByPlateau] = []
        self._l: list[_ByLasts] = []
        self._b: list[_Key] = []
        self._f: list[_Key] = []
        self._plateau_risk = 0
        self._odd: dict[str, Stream] = {}  # live rebuffer players, read directly

    def note(self, stream: Stream) -> None:
        """A stream changed (or left): re-index it at the next read."""
        changed = self.changed
        changed.add(stream)
        if len(changed) > self._cap:
            changed.clear()
            self._rebuild = True

    def sync(self, streams: dict[str, Stream]) -> None:
        """Catch up with the noted changes (all of `streams` after an overflow)."""
        if self._rebuild:
            self._rebuild = False
            self.changed.clear()
            for stream, _ in list(self._by_stream.values()):
                self._drop(stream.id)
            self._odd.clear()
            pending: list[Stream] = list(streams.values())
        else:
            pending = list(self.changed)
            self.changed.clear()
        for stream in pending:
            sid = stream.id
            if self._odd.get(sid) is stream:
                del self._odd[sid]
            present = streams.get(sid) is stream and stream.phase is Phase.LIVE
            if present and stream.rebuffer:
                self._odd[sid] = stream
                present = False
            if not present:
                if sid in self._by_stream and self._by_stream[sid][0] is stream:
                    self._drop(sid)
                continue
            lasts = stream.start + stream.buffered
            plateau = lasts - stream.expected
            margin = stream.margin
            keys = (plateau, lasts, stream.buffered, None if plateau < margin else lasts - margin)
            old = self._by_stream.get(sid)
            if old is not None:
                if old[1] == keys and old[0] is stream:
                    continue
                self._drop(sid)
            self._add(stream, keys)

    def _add(self, stream: Stream, keys: _Keys) -> None:
        sid = stream.id
        plateau, lasts, buffered, falls = keys
        self._by_stream[sid] = (stream, keys)
        insort(self._p, (plateau, sid, lasts, buffered))
        insort(self._l, (lasts, sid, buffered))
        insort(self._b, (buffered, sid))
        if falls is None:
            self._plateau_risk += 1
        else:
            insort(self._f, (falls, sid))

    def _drop(self, sid: str) -> None:
        _, (plateau, lasts, buffered, falls) = self._by_stream.pop(sid)
        _remove(self._p, (plateau, sid, lasts, buffered))
        _remove(self._l, (lasts, sid, buffered))
        _remove(self._b, (buffered, sid))
        if falls is None:
            self._plateau_risk -= 1
        else:
            _remove(self._f, (falls, sid))

    # ------------------------------------------------------------------ reads (after sync)
    def min_headroom(self, t: float) -> float | None:
        """Lowest headroom at `t` among live streams (None if none)."""
        values = [s.headroom_at(t) for s in self._odd.values()]
        if self._p:
            values.append(min(self._p[0][0], self._l[0][0] - t))
        return min(values, default=None)

    def min_slack(self, t: float) -> float | None:
        """Lowest playback slack at `t` among live streams (None if none)."""
        values = [s.slack_at(t) for s in self._odd.values()]
        if self._b:
            values.append(min(self._b[0][0], self._l[0][0] - t))
        return min(values, default=None)

    def at_risk(self, t: float) -> int:
        """Live streams with headroom < their margin at `t`."""
        odd = sum(1 for s in self._odd.values() if s.headroom_at(t) < s.margin)
        return self._plateau_risk + bisect_left(self._f, (t,)) + odd

    def lowest(self, t: float, k: int) -> list[tuple[str, float, float]]:
        """The `k` live streams lowest in headroom at `t` (ties by id): (id, slack, headroom).

        Read from the index's entries (no stream is asked): the lists by `P` and by `L − t`
        are merged, smallest (value, id) first. A stream's headroom `min(P, L − t)` is the
        first of its two keys the merge meets, so the first `k` streams met are the `k`
        lowest, in order, after at most `2k` steps. Slack is `min(B, L − t)`.
        """
        if k <= 0:
            return []
        by_plateau, by_lasts = self._p, self._l
        n_plateau, n_lasts = len(by_plateau), len(by_lasts)
        i = j = 0
        found: list[tuple[str, float, float]] = []
        seen: set[str] = set()
        need = k
        while need:
            if j < n_lasts:
                lasts, sid, buffered = by_lasts[j]
                head = lasts - t
                # (P, id, L, B) against (L − t, id): decided by the first two unless it is the
                # same stream with P = L − t, which either way gives the same item.
                if i < n_plateau and by_plateau[i] <= (head, sid):
                    head, sid, lasts, buffered = by_plateau[i]
                    i += 1
                else:
                    j += 1
            elif i < n_plateau:
                head, sid, lasts, buffered = by_plateau[i]
                i += 1
            else:
                break
            if sid in seen:
                continue
            seen.add(sid)
            left = lasts - t
            found.append((sid, buffered if buffered < left else left, head))
            need -= 1
        if self._odd:
            found += [(s.id, s.slack_at(t), s.headroom_at(t)) for s in self._odd.values()]
            found.sort(key=_by_headroom)  # then id (ids are unique: slack never decides)
            del found[k:]
        return found


def _by_headroom(item: tuple[str, float, float]) -> tuple[float, str]:
    """A `lowest` item's rank: headroom, then id."""
    return item[2], item[0]


def _remove(keys: list[_Entry], key: _Entry) -> None:
    i = bisect_left(keys, key)
    if i < len(keys) and keys[i] == key:
        del keys[i]
