"""What a `ThrottleGate` shows: frozen snapshots of what it knows and what it did, and the
readers of the two retained objects it follows (throttle objects, instance statuses)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

#: `device` for every device on the broker, including devices that appear later.
ALL_DEVICES = "+"
#: An instance not heard from for this many of its own heartbeats counts as offline.
HEARTBEAT_MISSES = 3


@dataclass(frozen=True, slots=True)
class DeviceThrottle:
    """One followed device's latest throttle object, as the gate applied it."""

    #: The object's `throttle`; None once an unreadable object arrived (fail-open).
    throttle: bool | None
    #: The `seq` of the last object applied (kept after an unreadable one, for ordering).
    seq: int | None
    #: `t_ms` (edgemon's device-clock instant of the change), `streams`, `min_headroom_ms`.
    t_ms: float | None = None
    streams: tuple[str, ...] = ()
    min_headroom_ms: float | None = None
    #: The gate's clock when the object arrived.
    changed_at: float = 0.0
    #: The client id of the edgemon instance that owns the device (`owner`); None for an
    #: object without one (then any online instance makes it count).
    owner: str | None = None


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class GateState:
    """What the gate knows (a snapshot, taken when asked)."""

    #: Whether the gate is connected to the broker.
    connected: bool = False
    #: Whether at least one edgemon instance is `online` and heard from within 3 heartbeats.
    edgemon_online: bool = False
    #: True while any followed device is throttled; False when every device heard from says
    #: `false`; None while nothing readable was received.
    throttle: bool | None = None
    #: `seq` and `t_ms` of the last throttle object applied (any device).
    seq: int | None = None
    t_ms: float | None = None
    #: The at-risk streams and the lowest headroom of the devices holding (of all devices
    #: heard from while none holds).
    streams: tuple[str, ...] = ()
    min_headroom_ms: float | None = None
    #: Each known instance's status: `online`, `offline`, or `silent` (said `online` but not
    #: heard from for 3 of its heartbeats: counted as offline).
    instances: Mapping[str, str] = field(default_factory=_empty)
    #: The devices followed (`("+",)`: every device) and those whose throttle is on, sorted.
    following: tuple[str, ...] = ()
    holding: tuple[str, ...] = ()
    #: Every device heard from, by id.
    devices: Mapping[str, DeviceThrottle] = field(default_factory=_empty)
    #: The gate's clock at the last change.
    changed_at: float = 0.0
    #: The devices of `holding` whose owner is offline or silent: their throttle is void.
    voided: tuple[str, ...] = ()
    #: Topic filters the broker refused to subscribe the gate to (its ACL, say): the gate
    #: cannot hold for what they would bring.
    refused: tuple[str, ...] = ()

    @property
    def active(self) -> bool:
        """A throttle that counts (its owner online), edgemon online and connected (before
        the `max_hold_ms` rule)."""
        return (
            self.connected
            and self.edgemon_online
            and self.throttle is True
            and len(self.voided) < len(self.holding)
        )


@dataclass(frozen=True, slots=True)
class GateStats:
    """What the gate did (a snapshot)."""

    #: Holds begun (a True answer after a False one).
    holds: int
    #: Seconds spent holding, the current hold included.
    held_s: float
    #: Holds ended by `max_hold_ms` (released until a step admits, see `admitted()`).
    max_hold_releases: int
    #: Throttle objects ignored as out of order, and messages that could not be read.
    stale_ignored: int
    unreadable: int
    #: The devices followed and those holding now (as in `GateState`).
    following: tuple[str, ...] = ()
    holding: tuple[str, ...] = ()
    #: Exceptions caught inside the gate (each answered "do not hold"; the first is logged).
    errors: int = 0
    #: Topic filters the broker refused in a SUBACK (its ACL), counted at each refusal.
    subscriptions_refused: int = 0


@dataclass(frozen=True, slots=True)
class Instance:
    """An edgemon instance's latest status and when the gate received it."""

    state: str
    heard_at: float
    #: Its announced heartbeat (s); None for an edgemon that announces none (never silent).
    heartbeat_s: float | None
    #: When that edgemon process started (`started_ms`), telling a restart from a heartbeat.
    started_ms: float | None = None

    def online(self, now: float) -> bool:
        """`online`, and heard from within `HEARTBEAT_MISSES` heartbeats."""
        return self.state == "online" and (
            self.heartbeat_s is None or now - self.heard_at < HEARTBEAT_MISSES * self.heartbeat_s
        )

    def silent_at(self) -> float:
        """When an `online` status stops counting (inf: never)."""
        if self.state != "online" or self.heartbeat_s is None:
            return math.inf
        return self.heard_at + HEARTBEAT_MISSES * self.heartbeat_s

    def shown(self, now: float) -> str:
        """As `GateState.instances` shows it."""
        return "silent" if self.state == "online" and not self.online(now) else self.state


def read_throttle(payload: bytes, now: float) -> DeviceThrottle | None:
    """A throttle object (`throttle` a bool and `seq` an int at least), else None."""
    value = read_json(payload)
    if not isinstance(value, dict):
        return None
    throttle, seq = value.get("throttle"), value.get("seq")
    if type(throttle) is not bool or type(seq) is not int:
        return None
    streams = value.get("streams")
    owner = value.get("owner")
    return DeviceThrottle(
        throttle=throttle,
        seq=seq,
        t_ms=number(value.get("t_ms")),
        streams=tuple(s for s in streams if isinstance(s, str))
        if isinstance(streams, list)
        else (),
        min_headroom_ms=number(value.get("min_headroom_ms")),
        changed_at=now,
        owner=owner if isinstance(owner, str) and owner else None,
    )


def read_status(payload: bytes, now: float) -> Instance | None:
    """A status object (`state` online/offline; `heartbeat_s` a positive number or absent;
    `started_ms`)."""
    value = read_json(payload)
    state = value.get("state") if isinstance(value, dict) else None
    if state not in {"online", "offline"}:
        return None
    assert isinstance(value, dict)
    assert isinstance(state, str)
    heartbeat = number(value.get("heartbeat_s"))
    return Instance(
        state,
        now,
        heartbeat if heartbeat is not None and heartbeat > 0 else None,
        number(value.get("started_ms")),
    )


def read_json(payload: bytes) -> Any:
    """The payload as JSON, or None."""
    try:
        return json.loads(payload.decode("utf-8"))
    except (ValueError, RecursionError):
        return None


def number(value: object) -> float | None:
    """A finite JSON number as a float, else None."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None
