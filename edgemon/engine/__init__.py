"""The pure engine: playback slack, underruns, risk and throttle at exact instants, KV admission.

Nothing here does I/O or knows about asyncio, MQTT or Prometheus; the daemon and `replay`
drive the same `Engine` with events and the time.
"""

from __future__ import annotations

from edgemon.engine.config import DeviceOverride, EngineConfig, Limits, SlackPolicy
from edgemon.engine.engine import Engine
from edgemon.engine.events import ChunkEvent, EndEvent, Event, StartEvent
from edgemon.engine.outputs import (
    Output,
    Rejected,
    StreamEnded,
    StreamSample,
    ThrottleChanged,
    UnderrunBegan,
    UnderrunEnded,
)

__all__ = [
    "ChunkEvent",
    "DeviceOverride",
    "EndEvent",
    "Engine",
    "EngineConfig",
    "Event",
    "Limits",
    "Output",
    "Rejected",
    "SlackPolicy",
    "StartEvent",
    "StreamEnded",
    "StreamSample",
    "ThrottleChanged",
    "UnderrunBegan",
    "UnderrunEnded",
]
