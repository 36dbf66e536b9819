"""What the engine says happened: values with the exact device-clock instant they happened at."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgemon.engine.service_level import Outcome
    from edgemon.engine.stats import DeviceStats


@dataclass(frozen=True, slots=True)
class UnderrunBegan:
    """A live stream's player ran out of audio at `t_ms`, by what edgemon knows at `t_ms`
    (provisional until `UnderrunConfirmed` or `UnderrunRetracted`, docs/semantics.md)."""

    device: str
    stream: str
    t_ms: float


@dataclass(frozen=True, slots=True)
class UnderrunConfirmed:
    """The underrun that began at `t_ms` is confirmed at `confirmed_ms` (docs/semantics.md): the
    device's event time passed `t_ms`, or `allowed_lateness_ms` did. Only confirmed underruns
    are counted. `published` tells whether an `UnderrunBegan` announced it live; one that only
    late chunks revealed (its instant already behind edgemon's clock) was not."""

    device: str
    stream: str
    t_ms: float
    confirmed_ms: float
    published: bool


@dataclass(frozen=True, slots=True)
class UnderrunRetracted:
    """The underrun announced live at `t_ms` never happened: a chunk that reached the player
    before `t_ms` arrived late, at `retracted_ms`, and moved the instant the buffer runs dry."""

    device: str
    stream: str
    t_ms: float
    retracted_ms: float


@dataclass(frozen=True, slots=True)
class GapDeclared:
    """Chunks `missing_from` … `missing_to` of a stream did not arrive within
    `allowed_lateness_ms` of a later one: the later chunk is applied as a gap at `t_ms`."""

    device: str
    stream: str
    t_ms: float
    missing_from: int
    missing_to: int


@dataclass(frozen=True, slots=True)
class UnderrunEnded:
    """An underrun ended at `t_ms` after `duration_ms`."""

    device: str
    stream: str
    t_ms: float
    duration_ms: float


@dataclass(frozen=True, slots=True)
class ThrottleChanged:
    """The device's throttle turned on or off at `t_ms` (the state just after `t_ms`)."""

    device: str
    t_ms: float
    active: bool
    streams: tuple[str, ...]
    min_headroom_ms: float | None
    margin_ms: float


@dataclass(frozen=True, slots=True)
class StreamEnded:
    """A stream was removed; its summary, with its service level (docs/semantics.md): its
    start silence (None without a start event or a chunk), its longest gap and its outcome
    (`edgemon.engine.service_level`)."""

    device: str
    stream: str
    t_ms: float
    reason: str
    chunks: int
    audio_ms: float
    underruns: int
    underrun_ms: float
    min_slack_ms: float | None
    time_to_first_audio_ms: float | None
    start_silence_ms: float | None
    longest_gap_ms: float
    outcome: Outcome


@dataclass(frozen=True, slots=True)
class StreamSample:
    """One live stream's state at `t_ms` (what `replay --sample-ms` prints)."""

    device: str
    stream: str
    t_ms: float
    slack_ms: float
    eta_ms: float
    headroom_ms: float
    at_risk: bool


@dataclass(frozen=True, slots=True)
class Rejected:
    """A message, or one event of it, that was not applied, and why (a `result` label)."""

    recv_ms: float
    topic: str
    device: str | None
    reason: str
    detail: str


@dataclass(frozen=True, slots=True)
class DeviceForgotten:
    """An idle device was forgotten at `t_ms` (wall time `wall_ms`): whatever is kept per
    device goes with it. `stats` are its final totals (replay's summary keeps counting them)."""

    device: str
    t_ms: float
    wall_ms: float
    stats: DeviceStats


Output = (
    UnderrunBegan
    | UnderrunConfirmed
    | UnderrunRetracted
    | GapDeclared
    | UnderrunEnded
    | ThrottleChanged
    | StreamEnded
    | StreamSample
    | Rejected
    | DeviceForgotten
)
