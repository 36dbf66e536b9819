"""MQTT 5 sessions: the daemon speaks v5 with a session expiry, and the broker keeps its
session (and queues QoS 1 events) while it is away."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

import aiomqtt
import pytest

from edgemon.daemon import mqtt_codec as codec
from edgemon.daemon.app import Daemon
from edgemon.daemon.mqtt import RECEIVE_MAXIMUM, connect_request, max_packet_size
from edgemon.settings import HttpSettings, LimitsSettings, MqttSettings, Settings

from clients import throttle_on_then_off, watching
from daemons import running

if TYPE_CHECKING:
    from edgemon.daemon.mqtt_codec import ConnectRequest

    from brokers import Broker

pytestmark = pytest.mark.integration


def v5_settings(broker: Broker) -> Settings:
    return Settings(
        mqtt=MqttSettings(
            url=broker.url, client_id=broker.client_id("edgemon-v5"), topic_prefix=broker.prefix,
            protocol="5",
        ),
        http=HttpSettings(listen="127.0.0.1:0"),
    )  # fmt: skip


def _request(settings: MqttSettings) -> ConnectRequest:
    return connect_request(settings, b"offline", "edgemon/v1/_edgemon/x/status")


def test_connect_by_protocol() -> None:
    """3.1.1 keeps the session with clean session off; v5 with no clean start and an expiry
    (0 when the session is not meant to persist)."""
    v311 = _request(MqttSettings())
    assert (v311.version, v311.clean) == (codec.V311, False)
    v5 = _request(MqttSettings(protocol="5", session_expiry_s=600))
    assert (v5.version, v5.clean, v5.session_expiry_s) == (codec.V5, False, 600)
    fleeting = _request(MqttSettings(protocol="5", persistent_session=False))
    assert (fleeting.clean, fleeting.session_expiry_s) == (True, 0)


def test_v5_declares_what_the_broker_may_send() -> None:
    """Flow control and bounded input on MQTT 5 (reliability.md): CONNECT carries a Receive
    Maximum, so the broker keeps at most that many unacknowledged QoS 1 messages out to edgemon
    and holds the rest; a Maximum Packet Size a little above `[limits] max_payload_bytes`, so
    it sends no larger packet; and a Topic Alias Maximum of 0, so it sends no topic alias.
    Read from the CONNECT packet's bytes: its properties follow the keep-alive."""
    limit = max_packet_size(LimitsSettings().max_payload_bytes)
    assert LimitsSettings().max_payload_bytes < limit <= LimitsSettings().max_payload_bytes + 8192
    settings = MqttSettings(protocol="5", session_expiry_s=600)
    packet = codec.connect(
        connect_request(settings, b"offline", "edgemon/v1/_edgemon/x/status", max_packet=limit)
    )
    start, _ = codec.split(packet, 0) or (0, 0)
    variable = packet[start + 6 :]  # after "\x00\x04MQTT"
    assert variable[0] == codec.V5
    length = variable[4]
    properties = variable[5 : 5 + length]
    assert properties == (
        bytes((codec.SESSION_EXPIRY_INTERVAL,)) + (600).to_bytes(4, "big")
        + bytes((codec.RECEIVE_MAXIMUM,)) + RECEIVE_MAXIMUM.to_bytes(2, "big")
        + bytes((codec.MAXIMUM_PACKET_SIZE,)) + limit.to_bytes(4, "big")
        + bytes((codec.TOPIC_ALIAS_MAXIMUM,)) + b"\x00\x00"
    )  # fmt: skip


@pytest.mark.asyncio
async def test_v5_daemon_publishes_throttle_transitions(mosquitto_broker: Broker) -> None:
    """Over MQTT 5 the daemon subscribes, detects risk from its timer and publishes ON then OFF."""
    broker = mosquitto_broker
    daemon = Daemon(v5_settings(broker), environ={}, install_signal_handlers=False)
    async with watching(broker) as watcher, running(daemon):
        await throttle_on_then_off(broker, watcher, "dev5")
        on, off = watcher.throttles("dev5")
    assert (on["throttle"], off["throttle"]) == (True, False)


@pytest.mark.asyncio
async def test_v5_session_queues_events_while_edgemon_is_away(mosquitto_broker: Broker) -> None:
    """Events published at QoS 1 while edgemon is stopped reach it when it comes back: the
    broker kept its v5 session (session expiry) with the subscriptions."""
    broker = mosquitto_broker
    first = Daemon(v5_settings(broker), environ={}, install_signal_handlers=False)
    async with running(first):
        pass
    dev_q = broker.client_id("dev-q")
    async with aiomqtt.Client(broker.host, broker.port, identifier=dev_q) as client:
        for seq in range(5):
            event = {"type": "chunk", "stream": "q", "t_ms": 1_000.0 + seq, "seq": seq,
                     "audio_ms": 2_000.0}  # fmt: skip
            await client.publish(broker.topic("devq", "events"), json.dumps(event), qos=1)
    second = Daemon(v5_settings(broker), environ={}, install_signal_handlers=False)
    async with running(second):
        async with asyncio.timeout(5):
            while second.monitor.results["accepted"] < 5:  # noqa: ASYNC110 - a counter
                await asyncio.sleep(0.02)
    assert second.monitor.results["accepted"] == 5
