"""The pure engine: playback slack, underruns, risk and throttle at exact instants, KV admission.

Nothing here does I/O or knows about asyncio, MQTT or Prometheus; the daemon and `replay`
drive the same `Engine` with events and the time.
"""

from __future__ import annotations

from edgemon.engine.config import DeviceOverride, EngineConfig, Limits, SlackPolicy, SloPolicy
from edgemon.engine.engine import Engine
from edgemon.engine.events import ChunkEvent, EndEvent, Event, StartEvent
from edgemon.engine.outputs import (
    DeviceForgotten,
    GapDeclared,
    Output,
    Rejected,
    StreamEnded,
    StreamSample,
    ThrottleChanged,
    UnderrunBegan,
    UnderrunConfirmed,
    UnderrunEnded,
    UnderrunRetracted,
)

__all__ = [
    "ChunkEvent",
    "DeviceForgotten",
    "DeviceOverride",
    "EndEvent",
    "Engine",
    "EngineConfig",
    "Event",
    "GapDeclared",
    "Limits",
    "Output",
    "Rejected",
    "SlackPolicy",
    "SloPolicy",
    "StartEvent",
    "StreamEnded",
    "StreamSample",
    "ThrottleChanged",
    "UnderrunBegan",
    "UnderrunConfirmed",
    "UnderrunEnded",
    "UnderrunRetracted",
]
