"""A `ThrottleGate`'s connection: its `PahoLink` and the callbacks of its own, and the
heartbeat watcher thread.

`GateLink` owns the link (the paho client and its network thread) and the watcher thread, and
hands what arrives to `Heard`: on every (re)connect it subscribes to the followed devices'
`P/{device}/throttle` and to `P/_edgemon/+/status`; each message is routed by its topic. A
filter the broker refuses is one error in the log. The watcher wakes when an instance's 3
heartbeats run out, since the network thread may be quiet then.
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING, Any

from edgemon.client import _mqtt
from edgemon.client._gate_views import ALL_DEVICES

if TYPE_CHECKING:
    import paho.mqtt.client as mqtt

    from edgemon.broker_url import Broker
    from edgemon.client._gate_heard import Heard
    from edgemon.errors import CaughtErrors


class GateLink:
    """The gate's paho link and heartbeat watcher; `open` and `close` them."""

    __slots__ = ("_errors", "_heard", "_link", "_prefix", "_status_prefix", "_stop", "_watcher")

    def __init__(
        self,
        heard: Heard,
        errors: CaughtErrors,
        *,
        broker: Broker,
        prefix: str,
        client_id: str,
    ) -> None:
        self._heard = heard
        self._errors = errors
        self._prefix = prefix
        self._status_prefix = f"{prefix}/_edgemon/"
        self._link = _mqtt.PahoLink(
            broker, who=f"edgemon gate {heard.device}", client_id=client_id,
            on_up=self._up, on_down=lambda _reason: heard.disconnected(),
            lost_means="; not holding until it is back",
        )  # fmt: skip
        self._watcher: threading.Thread | None = None
        self._stop = False

    def open(self) -> None:
        """Start the network thread and the watcher (never waits for the broker); idempotent."""
        with self._heard.cond:
            if self._watcher is not None:
                return
            self._stop = False
            self._watcher = threading.Thread(
                target=self._watch, name="edgemon-gate-heartbeats", daemon=True
            )
            self._watcher.start()
            self._link.open(self._configure)

    def close(self, timeout: float) -> None:
        """Disconnect and end both threads, waiting at most `timeout` s."""
        with self._heard.cond:
            watcher, self._watcher = self._watcher, None
            self._stop = True
            self._heard.disconnected()
        if watcher is not None:
            watcher.join(max(0.0, timeout))
        self._link.close(timeout)

    def _watch(self) -> None:
        """The heartbeat watcher: an `online` instance not heard from for 3 of its
        heartbeats stops counting, at that moment."""
        heard = self._heard
        with heard.cond:
            while not self._stop:
                try:
                    due = heard.check_heartbeats()
                except Exception:  # noqa: BLE001 - the watcher must go on watching
                    self._errors.caught("the heartbeat watcher")
                    due = 1.0
                heard.cond.wait(None if due == math.inf else max(0.001, due))

    # ------------------------------------------------------------------ paho callbacks
    def _configure(self, client: mqtt.Client) -> None:
        client.on_message = self._on_message
        client.on_subscribe = self._on_subscribe

    def _up(self, client: mqtt.Client) -> None:
        """Connected: subscribe to the followed devices' throttles and the statuses."""
        heard = self._heard
        heard.connected_afresh()
        filters = [f"{self._prefix}/{device}/throttle" for device in heard.following]
        filters.append(f"{self._status_prefix}+/status")
        _, mid = client.subscribe([(topic, 1) for topic in filters])
        if mid is not None:  # None: not sent (the connection is already gone)
            heard.subscribing(mid, filters)

    def _on_subscribe(
        self, client: mqtt.Client, _userdata: Any, mid: int, reason_codes: Any, _properties: Any
    ) -> None:
        """The SUBACK: a filter the broker refused is one error in the log and shows in
        `state.refused`; the gate cannot hold for it."""
        if client is not self._link.client:
            return
        try:
            refused, said = self._heard.suback(mid, reason_codes)
        except Exception:  # noqa: BLE001 - a SUBACK it cannot read must not stop the gate
            self._errors.caught("the SUBACK's handling")
            return
        if refused and refused != said:
            _mqtt.log.error(
                "edgemon gate %s: the broker refused the subscription to %s (its ACL?); the "
                "gate cannot hold for what these topics would bring",
                self._heard.device,
                ", ".join(refused),
            )

    def _on_message(self, _client: mqtt.Client, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        heard = self._heard
        try:
            topic = message.topic
            if topic.startswith(self._status_prefix) and topic.endswith("/status"):
                instance = topic[len(self._status_prefix) : -len("/status")]
                heard.status(instance, bytes(message.payload))
                return
            device = topic[len(self._prefix) + 1 : -len("/throttle")]
            if (
                topic.startswith(self._prefix + "/")
                and topic.endswith("/throttle")
                and "/" not in device
                and (heard.following == (ALL_DEVICES,) or device in heard.following)
            ):
                heard.throttle(device, bytes(message.payload))
        except Exception:  # noqa: BLE001 - a bad message must not end up holding anything
            heard.forget_throttles()
            self._errors.caught("a message's handling (every throttle forgotten)")
