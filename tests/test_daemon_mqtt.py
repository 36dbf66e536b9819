"""The MQTT link's connection: how it is set up, and how two instances sharing an id fare."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import TYPE_CHECKING, Any

import pytest
import structlog
from sessions import connect_request

from edgemon.daemon import Daemon
from edgemon.daemon.intake import Intake
from edgemon.daemon.mqtt_connection import Connection
from edgemon.settings import HttpSettings, MqttSettings, Settings

from amqtt_broker import AMQTT_RETAINED_TO_ALL
from clients import settings_for, throttle_on_then_off, watching
from daemons import logged, running

if TYPE_CHECKING:
    from collections.abc import MutableMapping

    from brokers import Broker


@pytest.mark.integration
@pytest.mark.asyncio
async def test_the_link_disables_nagle_so_throttles_are_not_held_back(
    mosquitto_broker: Broker,
) -> None:
    """The session's socket, connected to the broker, has TCP_NODELAY set: a throttle object
    written right after the PUBACK of the chunk that caused it must not wait ~40 ms for the
    broker's delayed ACK."""
    broker = mosquitto_broker
    intake = Intake(lambda *_: None)
    request = connect_request(client_id=broker.client_id("session"))
    session = Connection(intake, request, on_accepted=lambda *_: None)
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_connection(lambda: session, broker.host, broker.port)
    try:
        sock = transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        await session.close()


@pytest.mark.integration
@pytest.mark.asyncio
async def test_two_instances_sharing_a_client_id_are_reported_and_back_off(
    mosquitto_broker: Broker, captured_logs: list[MutableMapping[str, Any]]
) -> None:
    """Two daemons with the same client id take each other's session in a loop. Each notices
    that its sessions keep ending right after they begin and logs `mqtt_session_taken_over`
    (an error naming the client id and the likely cause), and its reconnect delays keep
    growing instead of restarting from the first one after every short session."""
    broker = mosquitto_broker
    twins = ("a", "b")

    def lines(twin: str) -> list[MutableMapping[str, Any]]:
        return [line for line in captured_logs if line.get("twin") == twin]

    async with contextlib.AsyncExitStack() as stack:
        for twin in twins:  # each logs through the real logger, its lines marked `twin`
            logger = structlog.get_logger("edgemon").bind(twin=twin)
            daemon = Daemon(
                settings_for(broker, "edgemon-twin"), environ={}, log=logger,
                install_signal_handlers=False,
            )  # fmt: skip
            await stack.enter_async_context(running(daemon, until="started", logs=captured_logs))
        async with asyncio.timeout(30):
            while not logged(captured_logs, "mqtt_session_taken_over"):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
    twin = next(twin for twin in twins if logged(lines(twin), "mqtt_session_taken_over"))
    log = lines(twin)
    report = logged(log, "mqtt_session_taken_over")[0]
    assert report["client_id"] == broker.client_id("edgemon-twin")
    assert report["sessions_lost"] >= 3
    assert "same client id" in report["cause"]
    delays = [fields["delay_s"] for fields in logged(log, "mqtt_reconnect_scheduled")]
    assert len(delays) >= 3
    assert delays[2] >= 0.5 * 2**2 * 0.5 - 1e-3  # the third delay: no reset in between


def owning(broker: Broker, client_id: str, devices: tuple[str, ...]) -> Daemon:
    """A daemon on `broker` that owns `devices` only (`[mqtt] devices`)."""
    mqtt = MqttSettings(
        url=broker.url, client_id=broker.client_id(client_id), topic_prefix=broker.prefix,
        devices=devices,
    )  # fmt: skip
    settings = Settings(mqtt=mqtt, http=HttpSettings(listen="127.0.0.1:0"))
    return Daemon(settings, environ={}, install_signal_handlers=False)


@pytest.mark.integration
@pytest.mark.asyncio
async def test_each_instance_owns_the_devices_it_lists(
    any_broker: Broker, request: pytest.FixtureRequest
) -> None:
    """Two daemons on one broker, `[mqtt] devices` ["a"] and ["b"]; the first ran before
    under the same client id with no list, so its persistent session held the wildcard
    subscriptions. Each instance sees only its own devices' messages (the first run's wildcard is
    dropped on connect: nothing foreign arrives) and publishes only their throttles: device
    a's ON and OFF come once each, from the first; b's from the second. On Mosquitto and on
    amqtt (`any_broker`), where each instance is sent a retained message it never subscribed
    to (counted as foreign)."""
    if request.node.callspec.params["any_broker"] == "amqtt":
        request.applymarker(AMQTT_RETAINED_TO_ALL)
    broker = any_broker
    async with running(Daemon(settings_for(broker, "edgemon-a"), environ={},
                              install_signal_handlers=False)):  # fmt: skip
        pass  # the session keeps `edgemon/v1/+/events` and `+/engine`
    first, second = owning(broker, "edgemon-a", ("a",)), owning(broker, "edgemon-b", ("b",))
    async with watching(broker) as watcher, running(first), running(second):
        await throttle_on_then_off(broker, watcher, "a")
        await throttle_on_then_off(broker, watcher, "b")
    assert [device.id for device in first.monitor.engine.devices()] == ["a"]
    assert [device.id for device in second.monitor.engine.devices()] == ["b"]
    assert (first.link.intake.foreign, second.link.intake.foreign) == (0, 0)
    assert [t["throttle"] for t in watcher.throttles("a")] == [True, False]
    assert [t["throttle"] for t in watcher.throttles("b")] == [True, False]
    assert (first.publisher.published, second.publisher.published) == (2, 2)
