"""The fields of one device, declared once for `edgemon.engine.device.Device` and its bases.

`Device` holds parts, each owning its own fields: the timer heap (`TimerHeap`), the throttle
state (`ThrottleState`), late delivery (`LatenessState`), the tombstones and the sampler.
What is left here is the device's own: identity, configuration, clock, streams, the live
index, stats and the slots of those parts. `Device` and its two bases (`Lifecycle`, which
creates and removes streams, and `Restore`, which adopts restored ones) derive from
`DeviceState`, so the device stays one slotted object and each base is type-checked against
the same fields; a base calls only its own methods and those of the bases below it.
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
