"""MQTT 5 sessions: the daemon speaks v5 with a session expiry, and the broker keeps its
session (and queues QoS 1 events) while it is away."""

from __future__ import annotations

import asyncio
import json

import aiomqtt
import pytest

from edgemon.daemon.app import Daemon
from edgemon.daemon.mqtt import RECEIVE_MAXIMUM, session_options
from edgemon.settings import HttpSettings, MqttSettings, Settings

from clients import throttle_on_then_off, watching
from daemons import running

pytestmark = pytest.mark.integration


def v5_settings(port: int) -> Settings:
    return Settings(
        mqtt=MqttSettings(url=f"mqtt://127.0.0.1:{port}", client_id="edgemon-v5", protocol="5"),
        http=HttpSettings(listen="127.0.0.1:0"),
    )


def test_session_options_by_protocol() -> None:
    """3.1.1 keeps the session with clean session off; v5 with no clean start and an expiry."""
    v311 = session_options(MqttSettings())
    assert (v311["protocol"], v311["clean_session"]) == (aiomqtt.ProtocolVersion.V311, False)
    v5 = session_options(MqttSettings(protocol="5", session_expiry_s=600))
    assert (v5["protocol"], v5["clean_start"]) == (aiomqtt.ProtocolVersion.V5, False)
    assert v5["properties"].SessionExpiryInterval == 600
    fleeting = session_options(MqttSettings(protocol="5", persistent_session=False))
    assert (fleeting["clean_start"], fleeting["properties"].SessionExpiryInterval) == (True, 0)


def test_v5_declares_a_receive_maximum() -> None:
    """Flow control on MQTT 5 (SPEC §7): CONNECT carries a Receive Maximum, so the broker
    keeps at most that many unacknowledged QoS 1 messages out to edgemon and holds the rest."""
    v5 = session_options(MqttSettings(protocol="5"))
    assert v5["properties"].ReceiveMaximum == RECEIVE_MAXIMUM


@pytest.mark.asyncio
async def test_v5_daemon_publishes_throttle_transitions(mosquitto_broker: tuple[str, int]) -> None:
    """Over MQTT 5 the daemon subscribes, detects risk from its timer and publishes ON then OFF."""
    _, port = mosquitto_broker
    daemon = Daemon(v5_settings(port), environ={}, install_signal_handlers=False)
    async with watching(port) as watcher, running(daemon):
        await throttle_on_then_off(port, watcher, "dev5")
        on, off = watcher.throttles("dev5")
    assert (on["throttle"], off["throttle"]) == (True, False)


@pytest.mark.asyncio
async def test_v5_session_queues_events_while_edgemon_is_away(
    mosquitto_broker: tuple[str, int],
) -> None:
    """Events published at QoS 1 while edgemon is stopped reach it when it comes back: the
    broker kept its v5 session (session expiry) with the subscriptions."""
    _, port = mosquitto_broker
    first = Daemon(v5_settings(port), environ={}, install_signal_handlers=False)
    async with running(first):
        pass
    async with aiomqtt.Client("127.0.0.1", port, identifier="dev-q") as client:
        for seq in range(5):
            event = {"type": "chunk", "stream": "q", "t_ms": 1_000.0 + seq, "seq": seq,
                     "audio_ms": 2_000.0}  # fmt: skip
            await client.publish("edgemon/v1/devq/events", json.dumps(event), qos=1)
    second = Daemon(v5_settings(port), environ={}, install_signal_handlers=False)
    async with running(second):
        async with asyncio.timeout(5):
            while second.monitor.results["accepted"] < 5:  # noqa: ASYNC110 - a counter
                await asyncio.sleep(0.02)
    assert second.monitor.results["accepted"] == 5
