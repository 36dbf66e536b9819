"""The simulation publisher against a real Mosquitto: real-time events in order, valid payloads,
the retained engine object, batches, and a clean stop."""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

import aiomqtt
import pytest

from edgemon.simulate import Simulation
from edgemon.simulate.publisher import publish_simulation, wall_ms
from edgemon.wire.decode import Problem, decode_engine, decode_events

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from edgemon.simulate import Message

pytestmark = pytest.mark.integration

PREFIX = "edgemon/v1"


def _sim(start_ms: float, *, seed: int = 5) -> Simulation:
    return Simulation(devices=1, streams=2, rtf=0.1, stall_rate=0.0, seed=seed, start_ms=start_ms)


async def _collect(
    host: str, port: int, run: Awaitable[Any]
) -> tuple[Any, list[tuple[float, aiomqtt.Message]]]:
    """Subscribe to everything under the prefix, await `run`, return what arrived (with the
    wall time of arrival)."""
    received: list[tuple[float, aiomqtt.Message]] = []
    async with aiomqtt.Client(host, port, identifier="test-sub") as sub:
        await sub.subscribe(f"{PREFIX}/#", qos=1)

        async def listen() -> None:
            async for message in sub.messages:
                received.append((wall_ms(), message))  # noqa: PERF401 - runs until cancelled

        listener = asyncio.create_task(listen())
        result = await run
        await asyncio.sleep(0.2)  # QoS 1 deliveries in flight
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
    return result, received


def _events(received: list[tuple[float, aiomqtt.Message]]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for _, message in received:
        if str(message.topic) != f"{PREFIX}/sim-0/events":
            continue
        assert isinstance(message.payload, bytes)
        decoded = decode_events(message.payload, max_bytes=2**18, max_batch=1000)
        assert not isinstance(decoded, Problem)
        assert not any(isinstance(item, Problem) for item in decoded)
        body = json.loads(message.payload)
        events += body if isinstance(body, list) else [body]
    return events


def _assert_model_then_cancels(events: list[dict[str, Any]], model: list[Message]) -> None:
    """`events` are the model's messages up to the stop, none skipped, then `end` cancelled
    (at the stop time) for every stream still open."""
    expected = [m.payload for m in model]
    k = 0
    while k < min(len(events), len(expected)) and events[k] == expected[k]:
        k += 1
    assert k > 0
    tail = events[k:]
    assert all(e["type"] == "end" and e["reason"] == "cancelled" for e in tail)
    stop_ms = tail[0]["t_ms"] if tail else events[-1]["t_ms"]
    assert all(e["t_ms"] == stop_ms for e in tail)
    assert len(expected) > k
    assert expected[k]["t_ms"] >= stop_ms  # nothing due before the stop was left out
    started = {e["stream"] for e in events if e["type"] == "start"}
    finished = {e["stream"] for e in events if e["type"] == "end" or e.get("final")}
    assert started == finished


@pytest.mark.asyncio
async def test_events_arrive_in_order_at_real_time(mosquitto_broker: tuple[str, int]) -> None:
    """Two seconds of one device with two streams: the engine object retained, then exactly the
    model's events in order, each sent when the wall clock reaches its t_ms, and at the end
    every open stream cancelled."""
    host, port = mosquitto_broker
    start = wall_ms()
    run = publish_simulation(_sim(start), hostname=host, port=port, duration_s=2.0)
    report, received = await _collect(host, port, run)
    events = _events(received)
    assert report.events == report.messages == len(events)
    assert report.streams >= 2
    assert report.chunks >= 4

    _assert_model_then_cancels(events, _sim(start).until(start + 3_000.0))
    times = [e["t_ms"] for e in events]
    assert times == sorted(times)
    for arrived, message in received:
        if str(message.topic).endswith("/events"):
            event = json.loads(message.payload)
            assert -5 <= arrived - event["t_ms"] <= 1000  # sent on time, never early

    engine = [m for _, m in received if str(m.topic) == f"{PREFIX}/sim-0/engine"]
    assert len(engine) == 1
    assert engine[0].qos == 1
    assert isinstance(engine[0].payload, bytes)
    assert not isinstance(decode_engine(json.loads(engine[0].payload)), Problem)
    # A subscriber that comes later still gets the engine object: it was retained.
    async with aiomqtt.Client(host, port, identifier="test-late") as late:
        await late.subscribe(f"{PREFIX}/+/engine", qos=1)
        async with asyncio.timeout(5):
            message = await anext(aiter(late.messages))
    assert message.retain
    assert message.payload == engine[0].payload


@pytest.mark.asyncio
async def test_batches_are_arrays_of_a_device(mosquitto_broker: tuple[str, int]) -> None:
    """With batch=True every events payload is a JSON array; together they hold the same events
    in the same order as one-by-one publishing would."""
    host, port = mosquitto_broker
    start = wall_ms()
    run = publish_simulation(_sim(start), hostname=host, port=port, duration_s=1.0, batch=True)
    report, received = await _collect(host, port, run)
    bodies = [json.loads(m.payload) for _, m in received if str(m.topic).endswith("/events")]
    assert bodies
    assert all(isinstance(body, list) for body in bodies)
    events = _events(received)
    assert report.events == len(events)
    assert report.messages == len(bodies)
    _assert_model_then_cancels(events, _sim(start).until(start + 2_000.0))


@pytest.mark.asyncio
async def test_stop_event_ends_the_run_early(mosquitto_broker: tuple[str, int]) -> None:
    """Setting `stop` ends an unlimited run promptly, and its open streams are cancelled."""
    host, port = mosquitto_broker
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.5, stop.set)
    began = time.monotonic()
    run = publish_simulation(_sim(wall_ms()), hostname=host, port=port, duration_s=None, stop=stop)
    report, received = await _collect(host, port, run)
    assert time.monotonic() - began < 2.0
    events = _events(received)
    assert report.cancelled >= 1
    assert report.cancelled == sum(1 for e in events if e["type"] == "end")
    started = {e["stream"] for e in events if e["type"] == "start"}
    finished = {e["stream"] for e in events if e["type"] == "end" or e.get("final")}
    assert started == finished


@pytest.mark.asyncio
async def test_unreachable_broker_raises_mqtt_error() -> None:
    """No broker listening: the publisher raises aiomqtt.MqttError (the CLI reports it)."""
    with pytest.raises(aiomqtt.MqttError):
        await publish_simulation(_sim(wall_ms()), hostname="127.0.0.1", port=1, duration_s=1.0)
