"""A `Reporter`'s sending side: its `PahoLink` and the callbacks of its own, and the flusher
thread.

The flusher waits until a batch is due (the oldest waiting event has waited `flush_s`, a
full batch waits, or `flush()` asks), while connected and fewer than `max_in_flight`
messages wait for their PUBACK; it takes the batch from the `EventBuffer`, encodes it as JSON
arrays within `max_payload_bytes`, and publishes each at QoS 1. paho's network thread sends
them and reports the PUBACKs, which settle them in `InFlight`. A publish that raises or is
refused puts the events back ahead of newer ones. Everything here is guarded by the
Reporter's lock.
"""

from __future__ import annotations

import json
import threading
import time
from typing import TYPE_CHECKING, Any

import paho.mqtt.client as mqtt

from edgemon.client import _mqtt

if TYPE_CHECKING:
    from edgemon.broker_url import Broker
    from edgemon.client._report_buffer import EventBuffer, Indexed
    from edgemon.client._report_flight import InFlight

#: How long the flusher waits before it retries a publish that failed.
RETRY_S = 0.1
#: Built once: `json.dumps` with arguments builds an encoder per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
_SENT = frozenset({mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN})  # NO_CONN: paho resends


class Sender:
    """The paho link, the connection's state and the flusher thread of one Reporter."""

    __slots__ = (
        "_buffer",
        "_cond",
        "_device",
        "_flight",
        "_flusher",
        "_link",
        "_max_in_flight",
        "_max_payload_bytes",
        "_topic",
        "client",
        "connected",
        "connects",
        "stopping",
        "urgent",
    )

    def __init__(  # noqa: PLR0913 - the connection's parts and the bounds, each a keyword
        self,
        cond: threading.Condition,
        buffer: EventBuffer,
        flight: InFlight,
        *,
        broker: Broker,
        topic: str,
        device: str,
        client_id: str,
        clean_session: bool,
        max_in_flight: int,
        max_payload_bytes: int,
    ) -> None:
        self._cond = cond
        self._buffer = buffer
        self._flight = flight
        self._topic = topic
        self._device = device
        self._max_in_flight = max_in_flight
        self._max_payload_bytes = max_payload_bytes
        self._link = _mqtt.PahoLink(
            broker, who=f"edgemon reporter {device}", client_id=client_id,
            clean_session=clean_session, on_up=self._up, on_down=self._down,
            lost_means="; buffering events until it is back",
        )  # fmt: skip
        #: The paho client (None until `start`).
        self.client: mqtt.Client | None = None
        self._flusher: threading.Thread | None = None
        #: Whether the connection is up; connections made (the first one included).
        self.connected = False
        self.connects = 0
        #: Set by `stop`: the flusher ends, a lost connection is no news.
        self.stopping = False
        #: `flush()` calls waiting: no coalescing delay meanwhile.
        self.urgent = 0

    def start(self) -> None:
        """Start the flusher and the network thread (under the lock); the connection is
        made in the background. Idempotent."""
        if self.client is not None:
            return
        self.client = self._link.open(self._configure)
        self._flusher = threading.Thread(
            target=self._run, name=f"edgemon-reporter-{self._device}", daemon=True
        )
        self._flusher.start()

    def stop(self, deadline: float) -> None:
        """End the flusher and disconnect, by `deadline` (`time.monotonic`) at the latest."""
        with self._cond:
            self.stopping = True
            self._cond.notify_all()
        if self._flusher is not None:
            self._flusher.join(max(0.0, deadline - time.monotonic()))
        self._link.close(deadline - time.monotonic())

    # ------------------------------------------------------------------ the flusher
    def _take(self) -> list[Indexed] | None:
        """Wait (under the lock) until a batch is due, and take it; None when stopping."""
        cond, buffer, flight = self._cond, self._buffer, self._flight
        while not self.stopping:
            if not (buffer and self.connected and len(flight) < self._max_in_flight):
                cond.wait()
                continue
            due = buffer.due_in(urgent=self.urgent > 0)
            if due > 0:
                cond.wait(due)
                continue
            taken = buffer.take()
            flight.in_hand = taken[0][0]
            return taken
        return None

    def _run(self) -> None:
        client = self.client
        assert client is not None
        while True:
            with self._cond:
                taken = self._take()
            if taken is None:
                return
            payloads = self._encode(taken)
            for number, (first, count, payload) in enumerate(payloads, 1):
                try:
                    info = client.publish(self._topic, payload, qos=1)
                    rc, mid = info.rc, info.mid
                except Exception:  # noqa: BLE001 - the flusher must outlive any library surprise
                    _mqtt.log.exception("edgemon reporter: publish raised")
                    rc, mid = mqtt.MQTT_ERR_UNKNOWN, 0
                with self._cond:
                    if rc not in _SENT:  # not expected (queue and size are bounded): retry
                        _mqtt.log.warning("edgemon reporter: publish failed (%s); retrying", rc)
                        self._flight.in_hand = None
                        self._buffer.put_back([item for item in taken if item[0] >= first])
                        self._cond.wait(RETRY_S)
                        break
                    self._flight.published(mid, first, count)
                    self._flight.in_hand = payloads[number][0] if number < len(payloads) else None
                    self._cond.notify_all()

    def _encode(self, taken: list[Indexed]) -> list[tuple[int, int, bytes]]:
        """JSON arrays of `taken`, each within `max_payload_bytes`: (first index, count, bytes)."""
        out: list[tuple[int, int, bytes]] = []
        parts: list[str] = []
        first = taken[0][0]
        size = 2
        for idx, event in taken:
            text = _ENCODER.encode(event)
            if parts and size + len(text) + 1 > self._max_payload_bytes:
                out.append((first, len(parts), f"[{','.join(parts)}]".encode()))
                parts, first, size = [], idx, 2
            parts.append(text)
            size += len(text) + (1 if len(parts) > 1 else 0)
        out.append((first, len(parts), f"[{','.join(parts)}]".encode()))
        return out

    # ------------------------------------------------------------------ paho callbacks
    def _configure(self, client: mqtt.Client) -> None:
        client.max_inflight_messages_set(0)  # bounded here: max_in_flight messages
        client.on_publish = self._on_publish

    def _up(self, _client: mqtt.Client) -> None:
        with self._cond:
            self.connected = True
            self.connects += 1
            self._cond.notify_all()

    def _down(self, _reason: str) -> bool:
        """The connection is lost: news unless it was not up, or `stop` asked for it."""
        with self._cond:
            was_connected, self.connected = self.connected, False
            self._cond.notify_all()
            return was_connected and not self.stopping

    def _on_publish(
        self,
        _client: mqtt.Client,
        _userdata: Any,
        mid: int,
        _reason_code: Any,
        _properties: Any,
    ) -> None:
        with self._cond:
            self._flight.acknowledged(mid)
            self._cond.notify_all()
