"""A device's parts built on their own, wired as a `Device` wires them, for the parts' tests."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from edgemon.engine.applier import Applier
from edgemon.engine.config import EngineConfig
from edgemon.engine.device_clock import DeviceClock
from edgemon.engine.lateness import LatenessState
from edgemon.engine.lifecycle import Lifecycle
from edgemon.engine.live_index import LiveIndex
from edgemon.engine.margins import Margins
from edgemon.engine.reorder_release import Reordering
from edgemon.engine.sampling import Sampler
from edgemon.engine.stats import DeviceStats
from edgemon.engine.stream import Stream
from edgemon.engine.throttle import ThrottleState
from edgemon.engine.timers import TimerHeap

if TYPE_CHECKING:
    from edgemon.engine.outputs import Output


@dataclass(slots=True)
class Parts:
    """One device's parts, sharing its streams, stats and timer heap, with no `Device`."""

    config: EngineConfig = field(default_factory=EngineConfig)
    device_id: str = "d"
    streams: dict[str, Stream] = field(default_factory=dict)
    stats: DeviceStats = field(default_factory=DeviceStats)
    timers: TimerHeap = field(default_factory=TimerHeap)
    throttle: ThrottleState = field(default_factory=ThrottleState)
    live_index: LiveIndex = field(default_factory=lambda: LiveIndex(64))
    out: list[Output] = field(default_factory=list)
    margins: Margins = field(init=False)
    lateness: LatenessState = field(init=False)
    lifecycle: Lifecycle = field(init=False)
    reordering: Reordering = field(init=False)
    applier: Applier = field(init=False)

    def __post_init__(self) -> None:
        """Wire the parts to each other and to the shared fields."""
        self.margins = Margins(self.device_id, self.config)
        clock = DeviceClock(trust=True, window_ms=60_000.0)
        self.lateness = LatenessState(
            self.device_id, allowed_ms=self.config.slack.allowed_lateness_ms, clock=clock,
            stats=self.stats, timers=self.timers,
        )  # fmt: skip
        self.lifecycle = Lifecycle(
            self.device_id, self.config, streams=self.streams, live_index=self.live_index,
            margins=self.margins, stats=self.stats, throttle=self.throttle,
            lateness=self.lateness, timers=self.timers,
        )  # fmt: skip
        self.reordering = Reordering(
            self.device_id, streams=self.streams, lateness=self.lateness, timers=self.timers
        )
        self.applier = Applier(
            self.config, streams=self.streams, stats=self.stats, lifecycle=self.lifecycle,
            lateness=self.lateness, reordering=self.reordering, sampler=Sampler(None),
            timers=self.timers,
        )  # fmt: skip

    def due(self) -> list[tuple[float, object]]:
        """Every live entry of the timer heap (stale stream entries left out), in order."""
        entries = sorted(self.timers.heap)
        return [(at, what) for at, _, _, what in entries if not _stale(at, what)]


def _stale(at: float, what: object) -> bool:
    return isinstance(what, Stream) and what.due != at


def a_stream(stream_id: str, *, margin: float = 0.0) -> Stream:
    """A bare stream, as a first chunk creates it (no `start`)."""
    return Stream(
        stream_id, t_ms=0.0, rebuffer=False, margin=margin, margin_from_start=None,
        started_by_event=False, play_start_ms=None,
    )  # fmt: skip
