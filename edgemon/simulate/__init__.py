"""Synthetic TTS devices: a pure, seeded model (`model`) and its MQTT publisher (`publisher`).

Only the model is re-exported here, so importing it pulls in neither asyncio nor paho-mqtt.
"""

from __future__ import annotations

from edgemon.simulate.model import ENGINE_OBJECT, Message, Simulation

__all__ = ["ENGINE_OBJECT", "Message", "Simulation"]
