"""An MQTT broker inside the process, for zero set-up (`--broker embedded`)."""

from __future__ import annotations

from edgemon.broker.embedded import EXTRA_HINT, EmbeddedBrokerError, embedded_broker

__all__ = ["EXTRA_HINT", "EmbeddedBrokerError", "embedded_broker"]
