"""A broker gone silent ends the link's connection, and the link comes back: the wiring of the
session's deadlines (`tests/test_mqtt_session.py` holds their rules on a fake clock, at the
defaults too) to a real socket, through a proxy that black-holes a real Mosquitto's
connection, and against a broker that records the wire and leaves PUBLISH unanswered."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest

from edgemon.daemon import Daemon
from edgemon.errors import PublishError
from edgemon.settings import HttpSettings, MqttSettings, Settings

from blackhole import BlackHoleProxy
from clients import scrape
from daemons import logged, running
from fake_broker import PUBLISH, FakeBroker
from links import running_link, until
from scrapes import samples

if TYPE_CHECKING:
    from collections.abc import MutableMapping

    from brokers import Broker

pytestmark = pytest.mark.asyncio

#: A keep-alive and a heartbeat in the defaults' ratio (30 s and 5 s), scaled down: the rule
#: at the defaults themselves is held on a fake clock.
KEEPALIVE_S, HEARTBEAT_S = 2, 0.4


async def readyz_becomes(http_port: int, status: int, within_s: float) -> None:
    async with asyncio.timeout(within_s):
        while (await scrape(http_port, "/readyz"))[0] != status:  # noqa: ASYNC110 - HTTP
            await asyncio.sleep(0.05)


@pytest.mark.integration
async def test_a_black_holed_broker_is_noticed_and_the_link_reconnects(
    mosquitto_broker: Broker, captured_logs: list[MutableMapping[str, Any]]
) -> None:
    """The daemon reaches Mosquitto through a proxy (keep-alive 2 s, a heartbeat every
    0.4 s). The proxy black-holes the connection: it stays open and takes what edgemon
    writes, but nothing reaches the broker or comes back. Edgemon keeps writing heartbeats
    into the hole, and still ends the connection: `/readyz` turns 503 and
    `edgemon_mqtt_connected` 0. It then reconnects through the proxy (new connections pass):
    200 again, one reconnect counted."""
    broker = mosquitto_broker
    async with BlackHoleProxy(broker.port) as proxy:
        mqtt = MqttSettings(url=f"mqtt://127.0.0.1:{proxy.port}",
                            client_id=broker.client_id("edgemon-hole"), topic_prefix=broker.prefix,
                            keepalive_s=KEEPALIVE_S, heartbeat_s=HEARTBEAT_S)  # fmt: skip
        daemon = Daemon(
            Settings(mqtt=mqtt, http=HttpSettings(listen="127.0.0.1:0")), environ={},
            install_signal_handlers=False,
        )  # fmt: skip
        async with running(daemon, logs=captured_logs):
            http = daemon.http_port
            assert http is not None
            assert (await scrape(http, "/readyz"))[0] == 200
            hole = proxy.black_hole()
            await readyz_becomes(http, 503, within_s=60)
            down = (await scrape(http, "/metrics"))[1]
            await readyz_becomes(http, 200, within_s=60)
            up = (await scrape(http, "/metrics"))[1]
    assert samples(down, "edgemon_mqtt_connected") == {(): 0.0}
    assert samples(up, "edgemon_mqtt_connected") == {(): 1.0}
    assert samples(up, "edgemon_mqtt_reconnects_total") == {(): 1.0}
    assert PUBLISH in {first & 0xF0 for first in hole.packets_into_the_hole()}
    (lost, *_) = logged(captured_logs, "mqtt_disconnected")
    assert "did not answer" in lost["error"] or "stopped answering" in lost["error"]


async def test_an_unacknowledged_publish_ends_the_connection(
    captured_logs: list[MutableMapping[str, Any]],
) -> None:
    """The broker answers pings but never a PUBLISH: a QoS 1 message not acknowledged within a
    keep-alive ends the connection (the caller gets PublishError, the link reconnects)."""
    broker = FakeBroker()
    async with running_link("unacked", "edgemon", broker=broker, keepalive_s=1) as (link, _):
        await until(lambda: link.connection.subscribed, "subscribed")
        broker.ignore = {PUBLISH}
        with pytest.raises(PublishError, match="did not answer a PUBLISH"):
            async with asyncio.timeout(30):
                await link.publish("t/q1", b"x", qos=1, retain=False)
        await until(lambda: broker.connections >= 2, "reconnected")
    (lost, *_) = logged(captured_logs, "mqtt_disconnected")
    assert "did not answer a PUBLISH within 1 s" in lost["error"]
