"""edgemon's exceptions: one root, `EdgemonError`, and the MQTT errors under `MqttError`.

As aiomqtt has its `MqttError`: a caller that wants to survive whatever the broker link does
catches `MqttError`; one that wants to survive anything edgemon raises on purpose catches
`EdgemonError`. Errors about bad input also derive from `ValueError` (their own modules), so
code that catches `ValueError` keeps working. Standard library only: the client and the
engine import it.
"""

from __future__ import annotations

__all__ = [
    "ConnectionLostError",
    "EdgemonError",
    "MqttError",
    "NotSendableError",
    "ProtocolError",
    "PublishError",
]


class EdgemonError(Exception):
    """The root of every exception edgemon raises on purpose."""


class MqttError(EdgemonError):
    """Something went wrong between edgemon and the MQTT broker."""


class ConnectionLostError(MqttError):
    """The connection to the broker ended (or never came up); `reason` is the broker's MQTT 5
    reason code, when it gave one (142: the session was taken over)."""

    def __init__(self, message: str, *, reason: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class ProtocolError(MqttError):
    """The broker sent something that is not MQTT as edgemon speaks it."""


class NotSendableError(MqttError):
    """A packet the broker said it would not take (larger than its Maximum Packet Size)."""


class PublishError(MqttError):
    """A publish that did not reach the broker: not connected, refused, timed out, or the
    broker went away before it acknowledged."""
