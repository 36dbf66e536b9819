"""Read-only views of the engine for the adapters (metrics, HTTP), cheap at any fleet size.

A scrape must not cost O(streams) per device (README: serving `/metrics` at 10,000 live
streams delays no transition by more than 2 ms): a device's live streams are read through
its `LiveIndex` (`edgemon.engine.live_index`), O(log n) for the minima and the at-risk count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from edgemon.engine.stream import Phase

if TYPE_CHECKING:
    from collections.abc import Iterator

    from edgemon.engine.capacity import CapacityRecord
    from edgemon.engine.device import Device
    from edgemon.engine.engine import Engine
    from edgemon.engine.kv import KVVerdict
    from edgemon.engine.stats import DeviceStats
    from edgemon.engine.stream import Stream


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

    @property
    def capacity(self) -> CapacityRecord | None:
        """The engine's last capacity object and its refusals, once one was received."""
        return self._device.capacity

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
