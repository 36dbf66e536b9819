"""The two ends of edgemon's loop (docs/client.md), light enough for a player or a TTS engine.

- `Reporter` (player side): reports stream starts, chunk arrivals and ends to edgemon.
- `ThrottleGate` (engine side): says when to hold back new prefills.
- `SlackFeedReader` (engine side): edgemon's slack feed, what the players measured.
- `AudioFormat`: raw PCM formats, to turn byte counts into milliseconds.

Imports only the standard library and paho-mqtt; nothing from the daemon.
"""

from __future__ import annotations

from edgemon.client.audio import AudioFormat
from edgemon.client.feed import SlackFeedReader
from edgemon.client.gate import DeviceThrottle, GateState, GateStats, ThrottleGate
from edgemon.client.reporter import Reporter, ReporterStats

__all__ = [
    "AudioFormat",
    "DeviceThrottle",
    "GateState",
    "GateStats",
    "Reporter",
    "ReporterStats",
    "SlackFeedReader",
    "ThrottleGate",
]
