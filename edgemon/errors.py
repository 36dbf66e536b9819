"""edgemon's exceptions: one root, `EdgemonError`, with the MQTT errors under `MqttError`; and
what is done with an exception caught where none may escape (`CaughtErrors`).

As aiomqtt has its `MqttError`: a caller that wants to survive whatever the broker link does
catches `MqttError`; one that wants to survive anything edgemon raises on purpose catches
`EdgemonError`. The errors about bad input are defined in their own modules and derive from
`ValueError` too, so code that catches `ValueError` keeps working. Standard library only:
the client and the engine import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import logging

__all__ = [
    "CaughtErrors",
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


class CaughtErrors:
    """Exceptions caught where none may escape (an engine's scheduler step, paho's network
    thread): each is counted, the first logged as an error with its traceback, the others not
    (an error that repeats every step would flood the log)."""

    __slots__ = ("_log", "count", "note", "who")

    def __init__(
        self,
        log: logging.Logger,
        who: str,
        note: str = ", caught (further errors are counted, not logged)",
    ) -> None:
        """`who` begins the line, `note` ends it (what is done instead, where the count is):
        "{who}: an error in {where}{note}"."""
        self._log = log
        self.who = who
        self.note = note
        #: Exceptions caught so far.
        self.count = 0

    def caught(self, where: str) -> None:
        """Count an exception caught in `where`; log the first (call it from the `except`
        block: its traceback goes with it)."""
        self.count += 1
        if self.count == 1:
            self._log.exception("%s: an error in %s%s", self.who, where, self.note)
