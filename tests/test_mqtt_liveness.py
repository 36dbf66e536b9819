"""A broker gone silent is noticed within 1.5 keep-alives, whatever edgemon writes: through a
proxy that black-holes a real Mosquitto's connection, and against a broker that records the
wire and leaves chosen packets unanswered."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

import pytest

from edgemon.daemon import Daemon
from edgemon.daemon.mqtt import LinkHooks
from edgemon.daemon.publisher import PublishError
from edgemon.settings import HttpSettings, MqttSettings, Settings

from blackhole import BlackHoleProxy
from clients import scrape
from daemons import logged, running
from fake_broker import PINGREQ, PUBLISH, SUBSCRIBE, FakeBroker, puback_packet
from links import running_link, until
from scrapes import samples

if TYPE_CHECKING:
    from collections.abc import Callable, MutableMapping

pytestmark = pytest.mark.asyncio

#: The defaults: keep-alive 30 s, a heartbeat every 5 s.
KEEPALIVE_S = MqttSettings().keepalive_s


async def readyz_becomes(http_port: int, status: int, within_s: float) -> None:
    async with asyncio.timeout(within_s):
        while (await scrape(http_port, "/readyz"))[0] != status:  # noqa: ASYNC110 - HTTP
            await asyncio.sleep(0.05)


@pytest.mark.integration
@pytest.mark.slow  # 45 s: the defaults' 1.5 keep-alives, which no scaling may hide
async def test_a_black_holed_broker_is_noticed_and_the_link_reconnects(
    mosquitto_broker: tuple[str, int], captured_logs: list[MutableMapping[str, Any]]
) -> None:
    """The daemon reaches Mosquitto through a proxy, at the default intervals (keep-alive
    30 s, a heartbeat every 5 s). The proxy black-holes the connection: it stays open and
    takes what edgemon writes, but nothing reaches the broker or comes back. Edgemon keeps
    writing heartbeats into the hole, and still ends the connection: `/readyz` turns 503 and
    `edgemon_mqtt_connected` 0 (the link gives up within 1.5 keep-alives, 45 s; the deadline
    here is twice that, for a loaded machine). It then reconnects through the proxy (new
    connections pass): 200 again, one reconnect counted."""
    _, port = mosquitto_broker
    async with BlackHoleProxy(port) as proxy:
        mqtt = MqttSettings(url=f"mqtt://127.0.0.1:{proxy.port}", client_id="edgemon-hole")
        daemon = Daemon(
            Settings(mqtt=mqtt, http=HttpSettings(listen="127.0.0.1:0")), environ={},
            install_signal_handlers=False,
        )  # fmt: skip
        async with running(daemon, logs=captured_logs):
            http = daemon.http_port
            assert http is not None
            assert (await scrape(http, "/readyz"))[0] == 200
            hole = proxy.black_hole()
            await readyz_becomes(http, 503, within_s=3 * KEEPALIVE_S)
            down = (await scrape(http, "/metrics"))[1]
            await readyz_becomes(http, 200, within_s=60)
            up = (await scrape(http, "/metrics"))[1]
    assert samples(down, "edgemon_mqtt_connected") == {(): 0.0}
    assert samples(up, "edgemon_mqtt_connected") == {(): 1.0}
    assert samples(up, "edgemon_mqtt_reconnects_total") == {(): 1.0}
    assert PUBLISH in {first & 0xF0 for first in hole.packets_into_the_hole()}
    (lost, *_) = logged(captured_logs, "mqtt_disconnected")
    assert "did not answer" in lost["error"] or "stopped answering" in lost["error"]


async def test_the_link_pings_when_nothing_is_received_whatever_it_writes(
    captured_logs: list[MutableMapping[str, Any]],
) -> None:
    """Keep-alive 1 s; edgemon writes a QoS 0 message every 50 ms (nothing to acknowledge, so
    nothing to time out) and the broker goes silent. Writing does not stop the link from
    pinging: nothing was received for a keep-alive, so a PINGREQ goes out, stays unanswered,
    and the connection ends, naming the keep-alive."""
    broker = FakeBroker()
    async with running_link("pinger", "edgemon", broker=broker, keepalive_s=1) as (link, _):
        await until(lambda: link.connection.subscribed, "subscribed")

        async def keep_writing() -> None:
            while True:
                with contextlib.suppress(PublishError):
                    await link.publish("t/q0", b"x", qos=0, retain=False)
                await asyncio.sleep(0.05)

        writer = asyncio.create_task(keep_writing())
        try:
            broker.ignore = {PINGREQ, PUBLISH, SUBSCRIBE}
            await until(lambda: bool(logged(captured_logs, "mqtt_disconnected")), "link ended")
        finally:
            writer.cancel()
    (lost, *_) = logged(captured_logs, "mqtt_disconnected")
    assert "stopped answering" in lost["error"]
    assert "PINGREQ unanswered" in lost["error"]
    firsts = [packet.first for packet in broker.packets]
    assert PINGREQ in firsts


async def test_an_unacknowledged_publish_ends_the_connection(
    captured_logs: list[MutableMapping[str, Any]],
) -> None:
    """The broker answers pings but never a PUBLISH: a QoS 1 message not acknowledged within a
    keep-alive ends the connection (the caller gets PublishError, the link reconnects)."""
    broker = FakeBroker()
    async with running_link("unacked", "edgemon", broker=broker, keepalive_s=1) as (link, _):
        await until(lambda: link.connection.subscribed, "subscribed")
        broker.ignore = {PUBLISH}
        with pytest.raises(Exception, match="did not answer a PUBLISH"):
            async with asyncio.timeout(30):
                await link.publish("t/q1", b"x", qos=1, retain=False)
        await until(lambda: broker.connections >= 2, "reconnected")
    (lost, *_) = logged(captured_logs, "mqtt_disconnected")
    assert "did not answer a PUBLISH within 1 s" in lost["error"]


def sent_mid(broker: FakeBroker, topic: str) -> int | None:
    """The packet id of the client's first QoS 1 PUBLISH on `topic`, once the broker has it."""
    sent = (p.mid for p in list(broker.packets) if p.kind == PUBLISH and p.topic == topic)
    return next(sent, None)


async def test_an_answer_behind_a_backlog_being_delivered_is_late_not_lost(
    captured_logs: list[MutableMapping[str, Any]],
) -> None:
    """Keep-alive 1 s. The broker holds back its PUBACK of edgemon's PUBLISH for 2.5 s (two
    and a half request deadlines) while it delivers a message every 50 ms, as a broker does
    whose answer waits behind the backlog it is delivering: the PUBLISH is still waiting,
    completes once the PUBACK comes, and the connection never ended. (Before, it ended after
    1 s: under a flood on a slow machine that reconnection dropped the QoS 0 part of the
    backlog; tests/test_overload.py failed on it in CI.)"""
    broker = FakeBroker()
    async with running_link("behind", "edgemon", broker=broker, keepalive_s=1) as (link, _):
        await until(lambda: link.connection.subscribed, "subscribed")
        broker.ignore = {PUBLISH}
        publish = asyncio.create_task(link.publish("t/q1", b"x", qos=1, retain=False))
        await until(lambda: sent_mid(broker, "t/q1") is not None, "the PUBLISH reached the broker")
        began, n = time.monotonic(), 0
        while time.monotonic() - began < 2.5:  # the backlog's duration, not a wait to assert
            n += 1
            broker.publish([("edgemon/v1/d/events", b"%d" % n, n)])
            await asyncio.sleep(0.05)
        assert not publish.done()
        mid = sent_mid(broker, "t/q1")
        assert mid is not None
        broker.send(puback_packet(mid))
        async with asyncio.timeout(30):
            await publish
        assert broker.connections == 1
    assert not logged(captured_logs, "mqtt_disconnected")


@pytest.mark.parametrize("silent", [PUBLISH, SUBSCRIBE])
async def test_the_online_publish_and_the_suback_have_a_timeout(
    silent: int, captured_logs: list[MutableMapping[str, Any]]
) -> None:
    """A broker that accepts the connection but never acknowledges the `online` status (or
    never answers SUBSCRIBE) does not hold the link for ever: the connection ends after a
    keep-alive and is tried again."""
    broker = FakeBroker()
    broker.ignore = {silent}
    async with running_link("waits", "edgemon", broker=broker, keepalive_s=1) as (link, _):
        await until(lambda: broker.connections >= 2, "a second connection")
        assert not link.connection.subscribed
    what = "PUBLISH" if silent == PUBLISH else "SUBSCRIBE"
    (lost, *_) = logged(captured_logs, "mqtt_disconnected")
    assert f"did not answer a {what}" in lost["error"]


async def test_a_paused_intake_does_not_stop_the_liveness_check(
    captured_logs: list[MutableMapping[str, Any]],
) -> None:
    """The intake pauses (the log holds every batch: nothing is durable) after 4 messages, so
    the link stops reading; then the broker goes silent. The check runs all the same: the
    connection ends within 1.5 keep-alives of the last byte read, and nothing applied was
    acknowledged (it will come again)."""
    held: list[Callable[[], None]] = []
    applied: list[bytes] = []
    hooks = LinkHooks(
        on_message=lambda _topic, payload: applied.append(payload),
        status_payload=lambda state: state.encode(),
        when_durable=held.append,
    )
    broker = FakeBroker()
    async with running_link(
        "paused", "edgemon", broker=broker, hooks=hooks, keepalive_s=1, pending_limits=(4, 1 << 40)
    ) as (link, _):
        await until(lambda: link.connection.subscribed, "subscribed")
        broker.ignore = {PINGREQ, PUBLISH, SUBSCRIBE}
        broker.publish([("edgemon/v1/d/events", b"%d" % n, n) for n in range(1, 9)])
        await until(lambda: link.intake.paused, "intake paused")
        await until(lambda: bool(logged(captured_logs, "mqtt_disconnected")), "link ended")
    assert len(applied) == 4
    assert broker.pubacks() == []
    (lost, *_) = logged(captured_logs, "mqtt_disconnected")
    assert "stopped answering" in lost["error"]
