"""The daemon's status, two ways: the retained status object on the broker (docs/protocol.md)
and the one-line `STATUS=` text for systemd."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from edgemon import __version__

if TYPE_CHECKING:
    from edgemon.adapters.connection_state import ConnectionState
    from edgemon.monitor import Monitor


def status_payload(state: str, *, now_ms: float, heartbeat_s: float, started_ms: float) -> bytes:
    """The status object: `online` or `offline`, this version, when; `heartbeat_s` tells a
    gate how often `online` is repeated and `started_ms` tells a restart from a heartbeat."""
    return json.dumps(
        {
            "state": state,
            "version": __version__,
            "t_ms": now_ms,
            "heartbeat_s": heartbeat_s,
            "started_ms": started_ms,
        },
        separators=(",", ":"),
    ).encode()


def status_line(monitor: Monitor, connection: ConnectionState) -> str:
    """`STATUS=` text: devices, streams, throttled devices, broker state."""
    devices = list(monitor.engine.devices())
    streams = sum(len(device.streams) for device in devices)
    throttled = sum(device.throttle_on for device in devices)
    broker = "subscribed" if connection.ready else "broker unreachable"
    return f"{len(devices)} devices, {streams} streams, {throttled} throttled, {broker}"
