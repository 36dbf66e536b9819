"""The embedded broker (amqtt): a working MQTT 3.1.1 broker on a free port, clear one-line
errors when it cannot run, and the simulator publishing through it."""

from __future__ import annotations

import asyncio
import json
import socket
import sys

import aiomqtt
import pytest

from edgemon.broker import EXTRA_HINT, EmbeddedBrokerError, embedded_broker
from edgemon.simulate import Simulation
from edgemon.simulate.publisher import publish_simulation, wall_ms

pytestmark = pytest.mark.integration

pytest.importorskip("amqtt", reason="the embedded extra is not installed")


@pytest.mark.asyncio
async def test_round_trip_qos1_and_retained() -> None:
    """Port 0 picks a free port; a QoS 1 message goes from one client to another, and a
    retained message reaches a subscriber that comes later, flagged as retained."""
    async with embedded_broker("127.0.0.1", 0) as (host, port):
        assert host == "127.0.0.1"
        assert port > 0
        async with aiomqtt.Client(host, port, identifier="pub") as pub:
            await pub.publish("edgemon/v1/d1/engine", b'{"margin_ms": 50}', qos=1, retain=True)
            async with aiomqtt.Client(host, port, identifier="sub") as sub:
                await sub.subscribe("edgemon/v1/#", qos=1)
                await pub.publish("edgemon/v1/d1/events", b'{"type": "start"}', qos=1)
                got = []
                async with asyncio.timeout(5):
                    async for message in sub.messages:
                        got.append(message)
                        if len(got) == 2:
                            break
    retained, live = got
    assert str(retained.topic) == "edgemon/v1/d1/engine"
    assert retained.retain
    assert retained.payload == b'{"margin_ms": 50}'
    assert str(live.topic) == "edgemon/v1/d1/events"
    assert live.qos == 1
    assert not live.retain
    assert live.payload == b'{"type": "start"}'


@pytest.mark.asyncio
async def test_port_in_use_is_one_clear_line() -> None:
    """A port another program holds gives EmbeddedBrokerError naming the address, one line."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(EmbeddedBrokerError, match=f"127.0.0.1:{port}") as caught:
            async with embedded_broker("127.0.0.1", port):
                pass  # pragma: no cover - never entered
    assert "\n" not in str(caught.value)


@pytest.mark.asyncio
async def test_missing_extra_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without amqtt the broker does not start and says `pip install edgemon[embedded]`."""
    monkeypatch.setitem(sys.modules, "amqtt.broker", None)
    with pytest.raises(EmbeddedBrokerError) as caught:
        async with embedded_broker("127.0.0.1", 0):
            pass  # pragma: no cover - never entered
    assert str(caught.value) == EXTRA_HINT
    assert "pip install edgemon[embedded]" in EXTRA_HINT


@pytest.mark.asyncio
async def test_simulator_publishes_through_it() -> None:
    """The simulator's QoS 1 events and retained engine object flow through the embedded
    broker in order."""
    async with (
        embedded_broker("127.0.0.1", 0) as (host, port),
        aiomqtt.Client(host, port, identifier="sub") as sub,
    ):
        await sub.subscribe("edgemon/v1/#", qos=1)
        sim = Simulation(devices=1, streams=2, rtf=0.1, stall_rate=0.0, seed=1, start_ms=wall_ms())
        report = await publish_simulation(sim, hostname=host, port=port, duration_s=1.0)
        topics: list[str] = []
        seqs: dict[str, list[int]] = {}
        async with asyncio.timeout(5):
            async for message in sub.messages:
                topics.append(str(message.topic))
                if topics[-1].endswith("/events"):
                    event = json.loads(message.payload)
                    if event["type"] == "chunk":
                        seqs.setdefault(event["stream"], []).append(event["seq"])
                if len(topics) == report.messages + 1:
                    break
    assert topics[0] == "edgemon/v1/sim-0/engine"
    assert topics[1:] == ["edgemon/v1/sim-0/events"] * report.messages
    assert seqs
    assert all(s == list(range(len(s))) for s in seqs.values())
