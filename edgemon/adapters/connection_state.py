"""The broker connection state, written by the MQTT adapter, read by metrics and `/readyz`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class ConnectionState:
    """What the MQTT adapter knows about its broker session (mutable, one per daemon)."""

    #: A session with the broker is up.
    connected: bool = False
    #: The subscriptions of this session were acknowledged (edgemon is ready).
    subscribed: bool = False
    #: Sessions re-established after a lost one (the first connect does not count).
    reconnects: int = 0
    #: Reconnections whose CONNACK said the broker kept no session (what it had queued for
    #: edgemon is gone).
    sessions_lost: int = 0
    #: Topic filters the broker refused in a SUBACK (its ACL), counted at each refusal.
    subscriptions_refused: int = 0
    #: Why the broker's grants fall short of what edgemon asked (a QoS below 1): still ready,
    #: but degraded. None when they do not.
    degraded: str | None = None

    @property
    def ready(self) -> bool:
        """Connected and subscribed: messages flow."""
        return self.connected and self.subscribed
