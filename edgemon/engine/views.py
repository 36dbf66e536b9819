"""Read-only views of the engine for the adapters (metrics, HTTP), cheap at any fleet size.

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

import math
from bisect import bisect_left, insort
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from edgemon.engine.stream import Phase

if TYPE_CHECKING:
    from collections.abc import Iterator

    from edgemon.engine.device import Device
    from edgemon.engine.engine import Engine
    from edgemon.engine.kv import KVVerdict
    from edgemon.engine.stats import DeviceStats
    from edgemon.engine.stream import Stream

_Key = tuple[float, str]
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
        self._p: list[_Key] = []
        self._l: list[_Key] = []
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
        insort(self._p, (plateau, sid))
        insort(self._l, (lasts, sid))
        insort(self._b, (buffered, sid))
        if falls is None:
            self._plateau_risk += 1
        else:
            insort(self._f, (falls, sid))

    def _drop(self, sid: str) -> None:
        _, (plateau, lasts, buffered, falls) = self._by_stream.pop(sid)
        _remove(self._p, (plateau, sid))
        _remove(self._l, (lasts, sid))
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

        Read from the index's keys (no stream is asked): headroom `min(P, L − t)`, slack
        `min(B, L − t)`.
        """
        if k <= 0:
            return []
        candidates = {sid for _, sid in self._p[:k]} | {sid for _, sid in self._l[:k]}
        by_stream = self._by_stream
        ranked: list[tuple[float, str, float]] = []
        for sid in candidates:
            plateau, lasts, buffered, _ = by_stream[sid][1]
            left = lasts - t
            ranked.append(
                (plateau if plateau < left else left, sid, buffered if buffered < left else left)
            )
        ranked += [(s.headroom_at(t), s.id, s.slack_at(t)) for s in self._odd.values()]
        ranked.sort()  # by headroom, then id (ids are unique: slack never decides)
        return [(sid, slack, head) for head, sid, slack in ranked[:k]]


def _remove(keys: list[_Key], key: _Key) -> None:
    i = bisect_left(keys, key)
    if i < len(keys) and keys[i] == key:
        del keys[i]


@dataclass(frozen=True, slots=True)
class LiveSummary:
    """A device's live streams at one instant (ms)."""

    at_risk: int
    min_headroom: float | None
    min_slack: float | None
    #: The lowest-headroom streams asked for: (stream id, slack, headroom), lowest first.
    lowest: tuple[tuple[str, float, float], ...]


class StreamState(NamedTuple):
    """One stream at one instant (ms, device clock); None where its phase has no such value
    (slack before the first chunk, ETA and headroom unless live) or it is not finite.

    A named tuple: `/api/v1/streams` makes one per stream (5,000 a page), and a frozen
    dataclass costs a `object.__setattr__` call per field to build."""

    stream: str
    phase: str
    slack_ms: float | None
    eta_ms: float | None
    headroom_ms: float | None
    at_risk: bool
    margin_ms: float
    chunks: int
    underruns: int
    #: In underrun now, provisional or confirmed.
    in_underrun: bool


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def stream_state(stream: Stream, now: float) -> StreamState:
    """What a stream looks like at device time `now`."""
    phase = stream.phase
    head = stream.headroom_at(now) if phase is Phase.LIVE else None
    return StreamState(
        stream=stream.id,
        phase=phase.value,
        slack_ms=None if phase is Phase.WAITING else _finite(stream.slack_at(now)),
        eta_ms=_finite(stream.eta_at(now)) if phase is Phase.LIVE else None,
        headroom_ms=None if head is None else _finite(head),
        at_risk=head is not None and head < stream.margin,
        margin_ms=stream.margin,
        chunks=stream.chunks,
        underruns=stream.underruns,
        in_underrun=stream.underrun_since is not None,
    )


class DeviceView:
    """What the adapters may read of one device: nothing here changes the engine's state
    (only the index of its live streams catches up)."""

    __slots__ = ("_device",)

    def __init__(self, device: Device) -> None:
        self._device = device

    @property
    def id(self) -> str:
        """The device id."""
        return self._device.id

    def now(self, wall_ms: float) -> float:
        """The device's clock at edgemon's wall time `wall_ms`."""
        return self._device.clock.now(wall_ms)

    @property
    def stream_count(self) -> int:
        """Streams tracked, in any phase."""
        return len(self._device.streams)

    @property
    def margin(self) -> float:
        """The device's margin (ms)."""
        return self._device.margin

    @property
    def throttle_on(self) -> bool:
        """Whether the throttle is on."""
        return self._device.throttle_on

    @property
    def throttle_since(self) -> float:
        """Device instant the throttle went on (meaningful while on)."""
        return self._device.throttle_since

    @property
    def clock_offset_ms(self) -> float:
        """Wall clock minus the device's clock (estimated)."""
        return self._device.clock.offset_ms

    @property
    def last_message_wall_ms(self) -> float:
        """Wall time of the device's last message."""
        return self._device.last_message_wall_ms

    @property
    def stats(self) -> DeviceStats:
        """The device's cumulative counters and histograms (read them, never write)."""
        return self._device.stats

    @property
    def kv(self) -> KVVerdict | None:
        """The KV verdict of the device's engine object, once one was received."""
        info = self._device.engine_info
        return None if info is None else info.kv

    def summary(self, now: float, lowest: int = 0) -> LiveSummary:
        """Minima, at-risk count and the `lowest` lowest-headroom streams at device time `now`."""
        device = self._device
        index = device.live_index
        index.sync(device.streams)
        return LiveSummary(
            at_risk=index.at_risk(now),
            min_headroom=index.min_headroom(now),
            min_slack=index.min_slack(now),
            lowest=tuple(index.lowest(now, lowest)),
        )

    def throttle_ms(self) -> float:
        """Time spent throttled, the ongoing period up to the instant the engine has reached
        for the device (never beyond: it may turn off at that very instant once the decision
        or a timer due there runs). Never decreases: the throttle turns off at an instant
        the engine reaches, never before one it has reached."""
        device = self._device
        total = device.stats.throttle_ms
        if device.throttle_on:
            ongoing = device.clock.floor_ms - device.throttle_since
            if ongoing > 0.0:
                total += ongoing
        return total

    def underrun_ms(self) -> float:
        """Time spent in confirmed underrun (a provisional one counts once confirmed,
        docs/semantics.md), ongoing ones up to the device's lateness horizon
        (`LatenessState.horizon`), or to the earliest end a held chunk could give. Never
        decreases: no underrun ends before either. O(ongoing confirmed underruns), not
        O(streams)."""
        device = self._device
        total = device.stats.underrun_ms
        horizon = device.lateness.horizon
        for stream in device.lateness.open_underruns.values():
            since = stream.underrun_since
            assert since is not None
            held = stream.held
            end = horizon if held is None else min(horizon, held.earliest_end())
            if end > since:
                total += end - since
        return total

    def stream_states(self, now: float) -> list[StreamState]:
        """Every stream at device time `now`, in no particular order (O(streams))."""
        return [stream_state(stream, now) for stream in self._device.streams.values()]

    def streams(self) -> Iterator[Stream]:
        """Every stream, in no particular order (read them, never write)."""
        return iter(list(self._device.streams.values()))


def device_views(engine: Engine) -> list[DeviceView]:
    """A view of every device the engine tracks now."""
    return [DeviceView(device) for device in engine.devices()]


def device_view(engine: Engine, device_id: str) -> DeviceView | None:
    """A view of one device, None if the engine does not track it."""
    device = engine.device(device_id)
    return None if device is None else DeviceView(device)
