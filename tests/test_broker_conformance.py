"""The daemon's MQTT link against more than one broker (docs/reliability.md, "Conformance"):
each test runs once on Mosquitto and once on amqtt (the embedded broker), through the
`any_broker` fixture. The write-ahead log's crash test runs on both too
(`test_daemon_restart.py`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import TYPE_CHECKING, Any

import aiomqtt
import pytest

from edgemon.daemon import Daemon
from edgemon.settings import HttpSettings, MqttSettings, Settings, StateSettings

from amqtt_broker import AMQTT_NO_SESSION, AMQTT_RETAINED_TO_ALL
from clients import WAIT_S, P, chunk, device, scrape, send, settings_for, watching
from daemons import running
from ports import TcpProxy
from scrapes import total

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from brokers import Broker

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

#: Chunks the device publishes before the link is cut, while it is, and after.
BEFORE, DURING, AFTER = 40, 40, 40


async def retained(port: int, *topics: str) -> dict[str, tuple[dict[str, Any], bool]]:
    """What a subscriber that comes now receives first on each of `topics`: (object, retain
    flag) by topic (the retained message, if the broker holds one). Messages on other topics
    are passed over (amqtt sends some: `test_a_late_subscriber_gets_what_it_asked_for_once`)."""
    found: dict[str, tuple[dict[str, Any], bool]] = {}
    async with aiomqtt.Client("127.0.0.1", port, identifier=f"late-{time.monotonic_ns()}") as c:
        await c.subscribe([(topic, 1) for topic in topics])
        async with asyncio.timeout(WAIT_S):
            async for message in c.messages:
                assert isinstance(message.payload, bytes)
                if message.topic.value in topics:
                    obj = json.loads(message.payload)
                    found.setdefault(message.topic.value, (obj, message.retain))
                if len(found) == len(topics):
                    break
    return found


async def test_a_late_subscriber_gets_what_it_asked_for_once(
    any_broker: Broker, request: pytest.FixtureRequest
) -> None:
    """A broker holds two retained messages; one client subscribed to both earlier. A client
    that subscribes to one of them receives that one message, once, and nothing else (MQTT
    3.1.1 §3.3.1.3: the retained message of each topic matching the new subscription)."""
    if request.node.callspec.params["any_broker"] == "amqtt":
        request.applymarker(AMQTT_RETAINED_TO_ALL)
    port = any_broker.port
    async with aiomqtt.Client("127.0.0.1", port, identifier="publisher") as client:
        for topic in ("t/a", "t/b"):
            await client.publish(topic, topic.encode(), qos=1, retain=True)
    async with aiomqtt.Client("127.0.0.1", port, identifier="both") as client:
        await client.subscribe([("t/a", 1), ("t/b", 1)])
        async with asyncio.timeout(WAIT_S):
            async for _ in client.messages:
                break
    seen: list[str] = []
    async with aiomqtt.Client("127.0.0.1", port, identifier="one") as client:
        await client.subscribe("t/a", qos=1)
        await client.publish("t/end", b"", qos=1)
        await client.subscribe("t/end", qos=1)
        await client.publish("t/end", b"end", qos=1)
        async with asyncio.timeout(WAIT_S):
            async for message in client.messages:
                if message.topic.value == "t/end" and message.payload == b"end":
                    break
                seen.append(message.topic.value)
    assert seen == ["t/a"]


async def test_throttle_objects_and_status_are_retained_qos1(
    any_broker: Broker,
) -> None:
    """A device runs dry and recovers: the daemon's throttle objects reach a subscriber at
    QoS 1 in order (ON, OFF), and a subscriber that comes later receives the last one and the
    `online` status as retained messages; after a clean stop, a late subscriber receives the
    retained `offline`."""
    broker, port = any_broker, any_broker.port
    topic, status = f"{P}/d1/throttle", f"{P}/_edgemon/edgemon-test/status"
    async with watching(broker) as watcher:
        async with running(Daemon(settings_for(broker), environ={}, install_signal_handlers=False)):
            async with device(broker) as client:
                await send(client, "d1", chunk("s1", 0, 300, 50))  # runs dry 220 ms later
                await watcher.until(lambda: len(watcher.throttles("d1")) >= 1)
                await send(client, "d1", chunk("s1", 1, 2000, 50))
                await watcher.until(lambda: len(watcher.throttles("d1")) >= 2)
            assert [t["throttle"] for t in watcher.throttles("d1")] == [True, False]
            found = await retained(port, topic, status)
            assert found[topic] == (watcher.throttles("d1")[-1], True)
            assert (found[status][0]["state"], found[status][1]) == ("online", True)
        found = await retained(port, status)
        assert (found[status][0]["state"], found[status][1]) == ("offline", True)


@contextlib.asynccontextmanager
async def proxied(port: int) -> AsyncIterator[TcpProxy]:
    """A `TcpProxy` to the broker for the block."""
    proxy = TcpProxy(port)
    try:
        yield proxy
    finally:
        await asyncio.to_thread(proxy.close)


async def test_a_lost_connection_loses_nothing_with_a_persistent_session(
    any_broker: Broker, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The daemon (persistent session, QoS 1, write-ahead log) reaches the broker through a
    link that is cut while a device goes on publishing at QoS 1: the broker queues what comes
    meanwhile for the session, and once the link is back every chunk is counted exactly once
    (`edgemon_chunks_total` equals what the device published, no gap), one reconnect."""
    if request.node.callspec.params["any_broker"] == "amqtt":
        request.applymarker(AMQTT_NO_SESSION)
    async with proxied(any_broker.port) as proxy:
        settings = Settings(
            mqtt=MqttSettings(url=f"mqtt://127.0.0.1:{proxy.port}", client_id="edgemon-cut"),
            http=HttpSettings(listen="127.0.0.1:0"),
            state=StateSettings(dir=tmp_path / "state"),
        )
        daemon = Daemon(settings, environ={}, install_signal_handlers=False)
        async with running(daemon), device(any_broker) as client:
            http = daemon.http_port
            assert http is not None
            seq = 0

            async def publish(count: int) -> None:
                nonlocal seq
                for _ in range(count):
                    await send(client, "d1", chunk("s", seq, 1000.0, 50))
                    seq += 1

            await publish(BEFORE)
            proxy.cut()
            async with asyncio.timeout(WAIT_S):
                while daemon.connection.connected:  # noqa: ASYNC110 - a flag of the daemon
                    await asyncio.sleep(0.01)
            await publish(DURING)  # queued by the broker for the session
            proxy.restore()
            await publish(AFTER)
            async with asyncio.timeout(2 * WAIT_S):
                while True:
                    metrics = (await scrape(http, "/metrics"))[1]
                    if total(metrics, "edgemon_chunks_total") >= seq:
                        break
                    await asyncio.sleep(0.05)
    assert total(metrics, "edgemon_chunks_total") == BEFORE + DURING + AFTER
    assert total(metrics, "edgemon_messages_total", result="gap") == 0
    assert total(metrics, "edgemon_mqtt_reconnects_total") == 1
