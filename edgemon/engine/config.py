"""What the engine is told: slack policy, limits, per-device overrides and service-level
objectives (plain frozen values)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from collections.abc import Mapping

PlayerModel = Literal["conceal", "rebuffer"]
ClockMode = Literal["estimate", "trust"]

#: Safety margin by the engine's hardware class (docs/semantics.md), in milliseconds.
HARDWARE_MARGIN_MS: Mapping[str, float] = MappingProxyType(
    {"cuda": 50.0, "jetson": 80.0, "x86": 120.0, "arm64": 160.0, "npu": 200.0}
)


@dataclass(frozen=True, slots=True)
class SlackPolicy:
    """The `[slack]` section: how slack, risk and the throttle are judged."""

    player: PlayerModel = "conceal"
    default_margin_ms: float = 80.0
    hysteresis_ms: float = 20.0
    min_on_ms: float = 250.0
    default_chunk_gap_ms: float = 200.0
    stream_idle_timeout_ms: float = 30_000.0
    clock: ClockMode = "estimate"
    #: Window of the per-device clock offset estimate (docs/semantics.md).
    clock_window_ms: float = 60_000.0
    #: How long a provisional underrun or a chunk out of `seq` order waits for late chunks
    #: (docs/semantics.md), on the device's clock.
    allowed_lateness_ms: float = 1_000.0


@dataclass(frozen=True, slots=True)
class SloPolicy:
    """The `[slo]` section: when an ended stream served its listener well (docs/semantics.md,
    "Service level")."""

    #: The start SLO: start event (the request) to playback start, at most this.
    start_ms: float = 3_000.0
    #: The continuity SLO: the stream's longest underrun, at most this.
    gap_ms: float = 100.0
    #: The share of good streams the burn-rate alerts defend (exported, not judged by the engine).
    objective: float = 0.99


@dataclass(frozen=True, slots=True)
class Limits:
    """The `[limits]` section: what bounds memory whatever devices send."""

    max_devices: int = 1_000
    max_streams_per_device: int = 256
    max_payload_bytes: int = 262_144
    max_batch_events: int = 1_000
    per_stream_series: int = 20
    #: A device with no stream, no throttle and no message for this long is forgotten
    #: (docs/reliability.md).
    device_idle_ms: float = 600_000.0


@dataclass(frozen=True, slots=True)
class DeviceOverride:
    """A `[devices.<id>]` section: the operator's word beats what the device says."""

    margin_ms: float | None = None
    player: PlayerModel | None = None


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything the pure engine needs; built once from the settings and passed in."""

    slack: SlackPolicy = field(default_factory=SlackPolicy)
    limits: Limits = field(default_factory=Limits)
    devices: Mapping[str, DeviceOverride] = field(default_factory=dict)
    topic_prefix: str = "edgemon/v1"
    slo: SloPolicy = field(default_factory=SloPolicy)
