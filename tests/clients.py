"""What the in-process daemon tests talk to it with: its settings on a test broker, a device
(an MQTT client that publishes events), a watcher of the throttle and status topics, and HTTP
GETs. Shared by every daemon test. Each takes the test's `Broker` (the `mosquitto_broker`
fixture's, or another): its topic prefix and client ids are the test's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import TYPE_CHECKING, Any

import aiohttp
import aiomqtt

from edgemon.protocol import TOPIC_PREFIX
from edgemon.settings import HttpSettings, MqttSettings, Settings

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from brokers import Broker

#: How long a test waits for something the daemon publishes (only waited in full on failure,
#: generous for a loaded 2-core machine).
WAIT_S = 10.0

#: edgemon's default topic prefix, which a broker of the test's own keeps.
P = TOPIC_PREFIX


def settings_for(broker: Broker, client_id: str = "edgemon-test", **sections: Any) -> Settings:
    """Settings of an in-process daemon on `broker` (its topic prefix, and `client_id` made
    the test's own), HTTP on a free port (unless `sections` has `http`), and any more
    `sections` (`state=StateSettings(...)`, say)."""
    sections.setdefault("http", HttpSettings(listen="127.0.0.1:0"))
    mqtt = MqttSettings(
        url=broker.url, client_id=broker.client_id(client_id), topic_prefix=broker.prefix
    )
    return Settings(mqtt=mqtt, **sections)


class Watcher:
    """A subscriber to every throttle and status topic under `prefix`, collecting (topic,
    object, retained)."""

    def __init__(self, client: aiomqtt.Client, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self.seen: list[tuple[str, dict[str, Any], bool]] = []
        self._changed = asyncio.Event()

    async def run(self) -> None:
        """Collect until cancelled."""
        async for message in self.client.messages:
            assert isinstance(message.payload, bytes)
            self.seen.append((message.topic.value, json.loads(message.payload), message.retain))
            self._changed.set()

    def throttles(self, device: str) -> list[dict[str, Any]]:
        """The throttle objects of `device`, in the order they came."""
        return [obj for topic, obj, _ in self.seen if topic == f"{self.prefix}/{device}/throttle"]

    def statuses(self) -> list[str]:
        """The `state` of every status object, in the order they came."""
        return [obj["state"] for topic, obj, _ in self.seen if topic.endswith("/status")]

    async def until(self, predicate: Any, within_s: float = WAIT_S) -> None:
        """Wait until `predicate()` holds on what was seen (fail after `within_s`)."""
        async with asyncio.timeout(within_s):
            while not predicate():
                self._changed.clear()
                await self._changed.wait()


@contextlib.asynccontextmanager
async def watching(broker: Broker) -> AsyncIterator[Watcher]:
    """A `Watcher` subscribed on `broker`, under its prefix, for the block."""
    name = broker.client_id(f"watch-{time.monotonic_ns()}")
    async with aiomqtt.Client(broker.host, broker.port, identifier=name) as c:
        await c.subscribe(
            [(broker.topic("+", "throttle"), 1), (broker.topic("_edgemon", "+", "status"), 1)]
        )
        watcher = Watcher(c, broker.prefix)
        task = asyncio.create_task(watcher.run())
        try:
            yield watcher
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class Device(aiomqtt.Client):
    """An MQTT client standing for devices on `broker`, under its topic `prefix`."""

    def __init__(self, broker: Broker) -> None:
        name = broker.client_id(f"dev-{time.monotonic_ns()}")
        super().__init__(broker.host, broker.port, identifier=name)
        self.prefix = broker.prefix


@contextlib.asynccontextmanager
async def device(broker: Broker) -> AsyncIterator[Device]:
    """A `Device` connected to `broker` for the block."""
    async with Device(broker) as c:
        yield c


async def send(client: Device, device_id: str, *events: dict[str, Any]) -> None:
    """Publish `events` (a batch if more than one) on `device_id`'s events topic under the
    client's prefix, QoS 1."""
    payload = json.dumps(list(events) if len(events) > 1 else events[0])
    await client.publish(f"{client.prefix}/{device_id}/events", payload, qos=1)


def now_ms() -> float:
    """Wall time now, in ms (what a device on this machine puts in `t_ms`)."""
    return time.time() * 1000.0


def chunk(stream: str, seq: int, audio: float, eta: float, **extra: Any) -> dict[str, Any]:
    """A chunk event at wall time now with `audio` ms of audio, the next in `eta` ms."""
    event = {"type": "chunk", "stream": stream, "t_ms": now_ms(), "seq": seq, "audio_ms": audio}
    return event | {"eta_ms": eta} | extra


async def scrape(port: int, path: str) -> tuple[int, str]:
    """GET `path` on 127.0.0.1:`port`: (status, body)."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        return response.status, await response.text()


async def throttle_on_then_off(broker: Broker, watcher: Watcher, device_id: str) -> float:
    """Chunk 0 (300 ms audio, next chunk in 50 ms): headroom reaches the 80 ms margin 220 ms
    later with no message (timer → ON); chunk 1 brings 2 s of audio (→ OFF after min-on).
    Returns chunk 0's `t_ms` (the device's clock)."""
    async with device(broker) as client:
        await send(client, device_id, {"type": "start", "stream": "s1", "t_ms": now_ms()})
        first = chunk("s1", 0, 300, 50)
        await send(client, device_id, first)
        await watcher.until(lambda: len(watcher.throttles(device_id)) >= 1)
        await send(client, device_id, chunk("s1", 1, 2000, 50))
        await watcher.until(lambda: len(watcher.throttles(device_id)) >= 2)
        await send(client, device_id, {"type": "end", "stream": "s1", "t_ms": now_ms()})
    return float(first["t_ms"])
