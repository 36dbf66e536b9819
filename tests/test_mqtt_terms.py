"""What the broker says is heard: a session it did not keep, a QoS it did not grant, retained
messages it does not keep, a QoS 2 message, its limits on what edgemon sends, and packets the
standards forbid. Against real Mosquitto where it can say it, else a broker that records the
wire and says what the test asks."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest

from edgemon.daemon import Daemon
from edgemon.daemon.mqtt import LinkHooks
from edgemon.errors import PublishError
from edgemon.settings import HttpSettings, MqttSettings, Settings

from clients import scrape
from daemons import logged, running
from fake_broker import PUBCOMP, PUBLISH, PUBREC, FakeBroker, puback_packet, publish_packet
from links import running_link, until
from ports import MosquittoServer
from scrapes import samples

if TYPE_CHECKING:
    from collections.abc import MutableMapping
    from pathlib import Path

    from brokers import Broker

pytestmark = pytest.mark.asyncio

TOPIC = "edgemon/v1/d/events"


def v5_connack(properties: bytes) -> bytes:
    """An MQTT 5 CONNACK, accepted, no session present, with these properties."""
    body = b"\x00\x00" + bytes((len(properties),)) + properties
    return bytes((0x20, len(body))) + body


@pytest.mark.integration
async def test_a_session_the_broker_did_not_keep_is_counted_and_logged(
    tmp_path: Path, captured_logs: list[MutableMapping[str, Any]]
) -> None:
    """Mosquitto without persistence restarts under a daemon with a persistent session: the
    reconnection's CONNACK says no session is present, so what arrived meanwhile is gone. One
    warning `mqtt_session_lost` says so, and `edgemon_mqtt_sessions_lost_total` is 1 (0
    before: the first connection of a client id has no session to lose)."""
    broker = MosquittoServer(tmp_path)
    broker.start()
    try:
        settings = Settings(
            mqtt=MqttSettings(url=broker.url, client_id="edgemon-forgotten"),
            http=HttpSettings(listen="127.0.0.1:0"),
        )
        daemon = Daemon(settings, environ={}, install_signal_handlers=False)
        async with running(daemon, logs=captured_logs):
            http = daemon.http_port
            assert http is not None
            before = (await scrape(http, "/metrics"))[1]
            broker.stop()
            await until(lambda: not daemon.connection.connected, "disconnected")
            broker.start()
            await until(lambda: daemon.connection.ready, "subscribed again")
            after = (await scrape(http, "/metrics"))[1]
    finally:
        broker.stop()
    assert samples(before, "edgemon_mqtt_sessions_lost_total") == {(): 0.0}
    assert samples(after, "edgemon_mqtt_sessions_lost_total") == {(): 1.0}
    (lost,) = logged(captured_logs, "mqtt_session_lost")
    assert "what devices sent while edgemon was away is lost" in lost["cause"]


async def test_a_qos_0_grant_is_one_error_and_readyz_says_degraded(
    captured_logs: list[MutableMapping[str, Any]],
) -> None:
    """The broker grants QoS 0 to filters edgemon subscribed at QoS 1: messages would no
    longer wait for the log before their acknowledgement. One error `mqtt_qos_downgraded`
    names the filters and the fix; `/readyz` stays 200 (messages flow, throttles go out) and
    says "degraded" and why. A second connection granted the same logs nothing more."""
    broker = FakeBroker()
    broker.grant = 0
    settings = Settings(
        mqtt=MqttSettings(url=f"mqtt://127.0.0.1:{broker.port}", client_id="edgemon-qos0"),
        http=HttpSettings(listen="127.0.0.1:0"),
    )
    daemon = Daemon(settings, environ={}, install_signal_handlers=False)
    try:
        async with running(daemon, logs=captured_logs):
            http = daemon.http_port
            assert http is not None
            status, text = await scrape(http, "/readyz")
            broker.drop()
            await until(lambda: broker.connections >= 2 and daemon.connection.ready, "again")
    finally:
        broker.close()
    assert status == 200
    assert text.startswith("ready, degraded: the broker granted less than QoS 1")
    assert "edgemon/v1/+/events QoS 0" in text
    (error,) = logged(captured_logs, "mqtt_qos_downgraded")
    assert "max_qos" in error["fix"]


async def test_a_v5_maximum_qos_0_publishes_at_qos_0_and_is_reported(
    captured_logs: list[MutableMapping[str, Any]],
) -> None:
    """An MQTT 5 broker whose CONNACK says Maximum QoS 0: edgemon sends nothing above it (its
    `online` status goes out at QoS 0, not waiting for a PUBACK that would never come) and
    reports the downgrade."""
    broker = FakeBroker()
    broker.connack = v5_connack(b"\x24\x00")  # Maximum QoS 0
    broker.grant = 0
    async with running_link("maxqos", "edgemon", broker=broker, protocol="5") as (link, _):
        await until(lambda: link.connection.subscribed, "subscribed")
    publishes = [p for p in broker.packets if p.kind == PUBLISH]
    assert publishes
    assert all(p.first & 0x06 == 0 for p in publishes)
    assert link.connection.degraded is not None
    assert "publishes QoS 0" in link.connection.degraded
    assert len(logged(captured_logs, "mqtt_qos_downgraded")) == 1


@pytest.mark.integration
async def test_a_broker_without_retained_messages_is_refused_with_one_error(
    tmp_path: Path, captured_logs: list[MutableMapping[str, Any]]
) -> None:
    """Mosquitto with `retain_available false`, MQTT 5: it refuses edgemon's retained will
    (reason "retain not supported"). Edgemon logs one error `mqtt_broker_unsuitable` naming
    the setting to change, then only warnings as it keeps trying."""
    broker = MosquittoServer(tmp_path, options="retain_available false\n")
    broker.start()
    try:
        async with running_link("noretain", "edgemon", url=broker.url, protocol="5") as (link, _):
            await until(lambda: len(logged(captured_logs, "mqtt_connect_failed")) >= 2, "retried")
            assert not link.connection.connected
    finally:
        broker.stop()
    (error,) = logged(captured_logs, "mqtt_broker_unsuitable")
    assert "retain not supported" in error["problem"]
    assert "retain_available true" in error["fix"]


async def test_a_v5_retain_available_0_is_refused(
    captured_logs: list[MutableMapping[str, Any]],
) -> None:
    """A broker that accepts the connection but says Retain Available 0 (every throttle and
    status edgemon publishes is retained): refused before anything is read or subscribed, one
    error naming the broker's setting."""
    broker = FakeBroker()
    broker.connack = v5_connack(b"\x25\x00")  # Retain Available 0
    async with running_link("retain0", "edgemon", broker=broker, protocol="5") as (link, _):
        await until(lambda: broker.connections >= 2, "tried again")
        assert not link.connection.subscribed
    (error,) = logged(captured_logs, "mqtt_broker_unsuitable")
    assert "Retain Available 0" in error["problem"]
    assert "retain_available true" in error["fix"]
    assert not [p for p in broker.packets if p.kind == 0x80]  # no SUBSCRIBE


async def test_a_qos_2_message_is_applied_once_and_completed() -> None:
    """A QoS 2 PUBLISH (a broker should send none: edgemon subscribes at QoS 1) is applied
    once, answered with PUBREC once durable, and completed with PUBCOMP on the broker's
    PUBREL, on the same connection: no loop of reconnections."""
    applied: list[bytes] = []
    hooks = LinkHooks(
        on_message=lambda _topic, payload: applied.append(payload),
        status_payload=lambda state: state.encode(),
    )
    async with running_link("qos2", "edgemon", hooks=hooks) as (link, broker):
        await until(lambda: link.connection.subscribed, "subscribed")
        broker.send(publish_packet(TOPIC, b"two", 41, qos=2))
        await until(lambda: any(p.kind == PUBCOMP for p in broker.packets), "PUBCOMP")
    assert applied == [b"two"]
    assert [p.mid for p in broker.packets if p.kind in {PUBREC, PUBCOMP}] == [41, 41]
    assert broker.connections == 1


async def test_pubacks_leave_in_the_order_the_messages_came() -> None:
    """Messages whose packet ids come in no particular order (a broker picks them): the
    PUBACKs leave in the order the messages were received, not sorted, whatever batches
    they were made durable in."""
    mids = [9, 3, 200, 1, 77, 4, 65535, 12, 2, 100]
    async with running_link("order", "edgemon") as (link, broker):
        await until(lambda: link.connection.subscribed, "subscribed")
        for mid in mids:  # one write each: several reads, several batches
            broker.publish([(TOPIC, b"%d" % mid, mid)])
        await until(lambda: len(broker.pubacks()) == len(mids), "every PUBACK")
    assert [ack.mid for ack in broker.pubacks()] == mids


async def test_a_packet_id_0_or_reserved_flags_end_the_connection(
    captured_logs: list[MutableMapping[str, Any]],
) -> None:
    """Malformed packets (MQTT 3.1.1 §2.2.2, §2.3.1): a QoS 1 PUBLISH with packet id 0, and a
    PINGRESP with a reserved flag set, each end the connection with a protocol error; the
    message is not applied."""
    applied: list[bytes] = []
    hooks = LinkHooks(
        on_message=lambda _topic, payload: applied.append(payload),
        status_payload=lambda state: state.encode(),
    )
    async with running_link("strict", "edgemon", hooks=hooks) as (link, broker):
        await until(lambda: link.connection.subscribed, "subscribed")
        broker.send(publish_packet(TOPIC, b"zero", 0))
        await until(lambda: broker.connections >= 2 and link.connection.subscribed, "again")
        broker.send(b"\xd1\x00")
        await until(lambda: len(logged(captured_logs, "mqtt_disconnected")) >= 2, "ended")
    errors = [line["error"] for line in logged(captured_logs, "mqtt_disconnected")]
    assert "packet identifier 0" in errors[0]
    assert "unexpected packet 0xd1" in errors[1]
    assert applied == []


async def test_the_brokers_receive_maximum_holds_publishes_until_acknowledged() -> None:
    """An MQTT 5 broker with Receive Maximum 1 that acknowledges nothing for now: of two
    QoS 1 publishes, one goes out and the other waits, even after the first's caller gave up
    (its packet id stays in flight until its PUBACK); the PUBACK lets the second go."""
    broker = FakeBroker()
    broker.connack = v5_connack(b"\x21\x00\x01")  # Receive Maximum 1
    async with running_link("quota", "edgemon", broker=broker, protocol="5") as (link, _):
        await until(lambda: link.connection.subscribed, "subscribed")
        broker.ignore = {PUBLISH}
        first = asyncio.create_task(link.publish("t/1", b"1", qos=1, retain=False))
        await until(lambda: len(sent(broker, "t/1")) == 1, "first sent")
        first.cancel()
        second = asyncio.create_task(link.publish("t/2", b"2", qos=1, retain=False))
        for _ in range(3):  # the second runs until it waits (or writes)
            await asyncio.sleep(0)
        await link.publish("t/marker", b"m", qos=0, retain=False)  # after anything written
        await until(
            lambda: any(p.body.startswith(b"\x00\x08t/marker") for p in broker.packets), "marker"
        )
        assert sent(broker, "t/2") == []
        (held,) = sent(broker, "t/1")
        broker.send(puback_packet(held))  # PUBACK of the first
        await until(lambda: len(sent(broker, "t/2")) == 1, "second sent")
        assert sent(broker, "t/2") != [held]
        second.cancel()


def sent(broker: FakeBroker, topic: str) -> list[int]:
    """The packet ids of the PUBLISHes on `topic` the client sent."""
    name = topic.encode()
    head = len(name).to_bytes(2, "big") + name
    return [
        int.from_bytes(p.body[len(head) : len(head) + 2], "big")
        for p in list(broker.packets)
        if p.kind == PUBLISH and p.body.startswith(head)
    ]


async def test_the_brokers_maximum_packet_size_is_honoured() -> None:
    """An MQTT 5 broker whose Maximum Packet Size is 128 bytes (room for edgemon's SUBSCRIBE
    of three filters): a larger PUBLISH is not sent (the broker would have to drop the
    connection), the caller gets PublishError saying why, and the connection stays up."""
    broker = FakeBroker()
    broker.connack = v5_connack(b"\x27\x00\x00\x00\x80")  # Maximum Packet Size 128
    async with running_link("small", "edgemon", broker=broker, protocol="5") as (link, _):
        await until(lambda: link.connection.subscribed, "subscribed")
        with pytest.raises(PublishError, match="the broker takes 128 at most"):
            await link.publish("t/big", b"x" * 200, qos=1, retain=False)
        assert sent(broker, "t/big") == []
        assert link.connection.connected
    assert broker.connections == 1


@pytest.mark.integration
async def test_a_refused_subscription_is_one_error_and_a_count(
    subscriptions_denied_broker: Broker,
    captured_logs: list[MutableMapping[str, Any]],
) -> None:
    """A Mosquitto whose ACL refuses edgemon's capacity filter in its SUBACK: one error
    `mqtt_subscription_refused` naming the filter and the fix, however often the session is
    tried again; `edgemon_mqtt_subscriptions_refused_total` counts each refusal; `/readyz`
    stays 503 (before: a warning per attempt, and no count)."""
    settings = Settings(
        mqtt=MqttSettings(url=subscriptions_denied_broker.url, client_id="edgemon-refused"),
        http=HttpSettings(listen="127.0.0.1:0"),
    )
    daemon = Daemon(settings, environ={}, install_signal_handlers=False)
    async with running(daemon, until="http", logs=captured_logs):
        http = daemon.http_port
        assert http is not None
        await until(lambda: daemon.connection.subscriptions_refused >= 2, "refused twice")
        assert (await scrape(http, "/readyz"))[0] == 503
        metrics = (await scrape(http, "/metrics"))[1]
    (refused,) = logged(captured_logs, "mqtt_subscription_refused")
    assert refused["problem"] == "the broker refused the subscription to edgemon/v1/+/capacity"
    assert "deploy/mosquitto/acl" in refused["fix"]
    assert samples(metrics, "edgemon_mqtt_subscriptions_refused_total")[()] >= 2
