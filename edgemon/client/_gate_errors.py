"""The errors a `ThrottleGate` catches: counted, the first logged with its traceback.

The gate runs inside an engine's scheduler and paho's network thread: an exception in it
must never stop either, so whatever part catches one answers "do not hold" and counts it here
(`stats.errors`)."""

from __future__ import annotations

from edgemon.client import _mqtt


class GateErrors:
    """Exceptions caught inside one gate."""

    __slots__ = ("count", "device")

    def __init__(self, device: str) -> None:
        self.device = device
        self.count = 0

    def caught(self, where: str) -> None:
        """Count an exception caught in `where`; log the first one with its traceback
        (call it from the `except` block)."""
        self.count += 1
        if self.count == 1:
            _mqtt.log.exception(
                "edgemon gate %s: an error in %s; answering 'do not hold' (further errors "
                "are counted in stats.errors, not logged)",
                self.device,
                where,
            )
