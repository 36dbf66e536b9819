"""The fields of one device, declared once for every part of `edgemon.engine.device.Device`.

`Device` is put together from base classes, one per concern (timers, throttle, lifecycle,
late delivery, restore), which all read and write the same state. They derive from
`DeviceState`, which holds every slot, so the device stays one slotted object (only one base
may add slots) and each part is type-checked against the same fields. The tombstones and the
sampler are parts the device holds instead, each owning its own fields.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgemon.engine.clock import DeviceClock
    from edgemon.engine.config import DeviceOverride, EngineConfig
    from edgemon.engine.lateness import LatenessState
    from edgemon.engine.live_index import LiveIndex
    from edgemon.engine.sampling import Sampler
    from edgemon.engine.stats import DeviceStats
    from edgemon.engine.stream import Stream
    from edgemon.engine.throttle import ThrottleState
    from edgemon.engine.timers import TimerHeap
    from edgemon.engine.tombstones import Tombstones
    from edgemon.engine.tts import TtsEngineInfo


class DeviceState:
    """Slots and types of a device's fields (`Device.__init__` sets them)."""

    __slots__ = (
        "base_margin",
        "clock",
        "config",
        "engine_info",
        "gap_ewma",
        "id",
        "last_message_wall_ms",
        "lateness",
        "live",
        "live_index",
        "override",
        "sampler",
        "stats",
        "streams",
        "throttle",
        "timers",
        "tombstones",
    )

    id: str
    config: EngineConfig
    override: DeviceOverride | None
    clock: DeviceClock
    streams: dict[str, Stream]
    #: Recently removed stream ids and when: late redeliveries must not resurrect them.
    tombstones: Tombstones
    timers: TimerHeap
    #: Live streams sorted for the adapters' reads (`edgemon.engine.views`).
    live_index: LiveIndex
    #: Streams in phase LIVE.
    live: int
    #: The throttle, and the counts of at-risk and unsafe streams it is decided from.
    throttle: ThrottleState
    gap_ewma: float | None
    engine_info: TtsEngineInfo | None
    base_margin: float
    stats: DeviceStats
    sampler: Sampler
    #: When the last message of the device was received (wall ms).
    last_message_wall_ms: float
    #: Late delivery (`edgemon.engine.lateness`).
    lateness: LatenessState
