"""A test's own MQTT client (paho on its network thread): watches topics, publishes objects;
and `eventually`, waiting for what such threads change."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


@dataclass(frozen=True, slots=True)
class Seen:
    """One message the probe received."""

    topic: str
    payload: bytes
    retain: bool

    def json(self) -> Any:
        """The payload as JSON."""
        return json.loads(self.payload)


class Probe:
    """Subscribes to `topics` on connect and keeps every message in `seen`.

    With `session`, it is a persistent session of that client id: what the broker queues
    while the probe is away (a broker restart with persistence) arrives when it is back.
    """

    def __init__(self, host: str, port: int, *topics: str, session: str | None = None) -> None:
        self.seen: list[Seen] = []
        self._topics = topics
        self._cond = threading.Condition()
        self._subscribed = threading.Event()
        self._client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=session or f"probe-{uuid.uuid4().hex[:8]}",
            clean_session=session is None,
        )
        self._client.reconnect_delay_set(1, 1)
        self._client.on_connect = self._on_connect
        self._client.on_subscribe = self._on_subscribe
        self._client.on_message = self._on_message
        self._client.connect(host, port)
        self._client.loop_start()
        if topics and not self._subscribed.wait(10):
            raise AssertionError("the probe could not subscribe")

    def _on_connect(self, client: mqtt.Client, *_: Any) -> None:
        if self._topics:
            client.subscribe([(topic, 1) for topic in self._topics])

    def _on_subscribe(self, *_: Any) -> None:
        self._subscribed.set()

    def _on_message(self, _client: mqtt.Client, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        with self._cond:
            self.seen.append(Seen(message.topic, bytes(message.payload), message.retain))
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[list[Seen]], bool], timeout: float = 15.0) -> bool:
        """Wait until `predicate(seen)` holds."""
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self.seen), timeout)

    def events(self, topic: str) -> list[dict[str, Any]]:
        """Every event object received on `topic`, batches unpacked, in order."""
        with self._cond:
            payloads = [m.json() for m in self.seen if m.topic == topic]
        return [event for payload in payloads for event in payload]

    def publish(self, topic: str, value: object, *, retain: bool = True) -> None:
        """Publish `value` (JSON, or raw bytes) at QoS 1 and wait for the PUBACK."""
        payload = value if isinstance(value, bytes) else json.dumps(value).encode()
        info = self._client.publish(topic, payload, qos=1, retain=retain)
        info.wait_for_publish(10)
        assert info.is_published()

    def close(self) -> None:
        """Disconnect and stop the network thread."""
        self._client.disconnect()
        self._client.loop_stop()


@contextlib.contextmanager
def probe(host: str, port: int, *topics: str, session: str | None = None) -> Iterator[Probe]:
    """A connected probe for a `with` block."""
    watcher = Probe(host, port, *topics, session=session)
    try:
        yield watcher
    finally:
        watcher.close()


def eventually(check: Callable[[], bool], timeout: float = 30.0) -> bool:
    """Whether `check()` became true within `timeout` seconds (polled; a generous default:
    only waited in full when a test fails on a loaded machine)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
