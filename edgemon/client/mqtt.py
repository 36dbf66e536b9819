"""The paho-mqtt helpers edgemon's client is built on, for edgemon's other links to the box's
broker (the capacity topic's publisher and the shedding middleware's view, `edgemon.shedding`):
`PahoLink`, the paho client for a `Broker` (`edgemon.broker_url`) with the callbacks of its
connection, unique client ids, and one warning per outage rather than one per reconnect
attempt.

paho-mqtt 2.x on its own network thread (`loop_start`), never asyncio: the engine's and the
API server's processes import these, and neither should own an event loop for them.
"""

from __future__ import annotations

from edgemon.client._mqtt import (
    CONNECT_TIMEOUT_S,
    KEEPALIVE_S,
    RECONNECT_MAX_S,
    RECONNECT_MIN_S,
    PahoLink,
    default_client_id,
    log,
    refused_filters,
)

__all__ = [
    "CONNECT_TIMEOUT_S",
    "KEEPALIVE_S",
    "RECONNECT_MAX_S",
    "RECONNECT_MIN_S",
    "PahoLink",
    "default_client_id",
    "log",
    "refused_filters",
]
