"""The simulation publisher against a real Mosquitto: real-time events in order, valid payloads,
the retained engine object, batches, and a clean stop."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import aiomqtt
import pytest

from edgemon.simulate import Simulation
from edgemon.simulate.publisher import PublishError, publish_simulation, wall_ms
from edgemon.wire.decode import Problem, decode_engine, decode_events

from load import MachineLag
from sockets import left_open

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from edgemon.simulate import Message

    from brokers import Broker
    from ports import MosquittoServer

pytestmark = pytest.mark.integration

PREFIX = "edgemon/v1"


def _sim(start_ms: float, *, seed: int = 5) -> Simulation:
    return Simulation(devices=1, streams=2, rtf=0.1, stall_rate=0.0, seed=seed, start_ms=start_ms)


async def _collect(
    broker: Broker, run: Awaitable[Any]
) -> tuple[Any, list[tuple[float, aiomqtt.Message]]]:
    """Subscribe to everything under the broker's prefix, await `run`, return what arrived
    (with the wall time of arrival)."""
    received: list[tuple[float, aiomqtt.Message]] = []
    sub_id = broker.client_id("test-sub")
    async with aiomqtt.Client(broker.host, broker.port, identifier=sub_id) as sub:
        await sub.subscribe(broker.topic("#"), qos=1)

        async def listen() -> None:
            async for message in sub.messages:
                received.append((wall_ms(), message))  # noqa: PERF401 - runs until cancelled

        listener = asyncio.create_task(listen())
        result = await run
        async with asyncio.timeout(10):  # QoS 1 deliveries still in flight
            while sum(str(m.topic).endswith("/events") for _, m in received) < result.messages:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
    return result, received


def _events(received: list[tuple[float, aiomqtt.Message]], broker: Broker) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for _, message in received:
        if str(message.topic) != broker.topic("sim-0", "events"):
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
async def test_events_arrive_in_order_at_real_time(mosquitto_broker: Broker) -> None:
    """Two seconds of one device with two streams: the engine object retained, then exactly the
    model's events in order, each sent when the wall clock reaches its t_ms (within a second,
    plus whatever time the machine held a separate process back), and at the end every open
    stream cancelled."""
    broker = mosquitto_broker
    start = wall_ms()
    run = publish_simulation(
        _sim(start), hostname=broker.host, port=broker.port, duration_s=2.0,
        topic_prefix=broker.prefix,
    )  # fmt: skip
    with MachineLag() as lag:
        report, received = await _collect(broker, run)
    events = _events(received, broker)
    assert report.events == report.messages == len(events)
    assert report.streams >= 2
    assert report.chunks >= 4

    _assert_model_then_cancels(events, _sim(start).until(start + 3_000.0))
    times = [e["t_ms"] for e in events]
    assert times == sorted(times)
    delays = [
        arrived - json.loads(message.payload)["t_ms"]
        for arrived, message in received
        if str(message.topic).endswith("/events")
    ]
    assert min(delays) >= -5  # never sent early (a loaded machine only makes it later)

    engine = [m for _, m in received if str(m.topic) == broker.topic("sim-0", "engine")]
    assert len(engine) == 1
    assert engine[0].qos == 1
    assert isinstance(engine[0].payload, bytes)
    assert not isinstance(decode_engine(json.loads(engine[0].payload)), Problem)
    # A subscriber that comes later still gets the engine object: it was retained.
    late_id = broker.client_id("test-late")
    async with aiomqtt.Client(broker.host, broker.port, identifier=late_id) as late:
        await late.subscribe(broker.topic("+", "engine"), qos=1)
        async with asyncio.timeout(5):
            message = await anext(aiter(late.messages))
    assert message.retain
    assert message.payload == engine[0].payload
    allowed_ms = 1000 + 1000 * lag.total_s
    assert max(delays) <= allowed_ms, (max(delays), lag.oversleeps_s)  # sent when t_ms came


@pytest.mark.asyncio
async def test_batches_are_arrays_of_a_device(mosquitto_broker: Broker) -> None:
    """With batch=True every events payload is a JSON array; together they hold the same events
    in the same order as one-by-one publishing would."""
    broker = mosquitto_broker
    start = wall_ms()
    run = publish_simulation(
        _sim(start), hostname=broker.host, port=broker.port, duration_s=1.0, batch=True,
        topic_prefix=broker.prefix,
    )  # fmt: skip
    report, received = await _collect(broker, run)
    bodies = [json.loads(m.payload) for _, m in received if str(m.topic).endswith("/events")]
    assert bodies
    assert all(isinstance(body, list) for body in bodies)
    events = _events(received, broker)
    assert report.events == len(events)
    assert report.messages == len(bodies)
    _assert_model_then_cancels(events, _sim(start).until(start + 2_000.0))


@pytest.mark.asyncio
async def test_stop_event_ends_the_run_early(mosquitto_broker: Broker) -> None:
    """Setting `stop` ends an unlimited run, and its open streams are cancelled, stamped with
    the stop's time: no event is sent for a time after it."""
    broker = mosquitto_broker
    stop = asyncio.Event()
    stopped_at: list[float] = []

    def set_stop() -> None:
        stopped_at.append(wall_ms())
        stop.set()

    asyncio.get_running_loop().call_later(0.5, set_stop)
    run = publish_simulation(
        _sim(wall_ms()), hostname=broker.host, port=broker.port, duration_s=None, stop=stop,
        topic_prefix=broker.prefix,
    )  # fmt: skip
    async with asyncio.timeout(30):  # an unlimited run: only the stop ends it
        report, received = await _collect(broker, run)
    events = _events(received, broker)
    cancels = [e["t_ms"] for e in events if e["type"] == "end"]
    assert cancels
    assert min(cancels) >= stopped_at[0]
    assert all(e["t_ms"] <= max(cancels) for e in events)
    assert report.cancelled >= 1
    assert report.cancelled == sum(1 for e in events if e["type"] == "end")
    started = {e["stream"] for e in events if e["type"] == "start"}
    finished = {e["stream"] for e in events if e["type"] == "end" or e.get("final")}
    assert started == finished


@pytest.mark.asyncio
async def test_unreachable_broker_raises_publish_error() -> None:
    """No broker listening: the publisher raises PublishError (the CLI reports it)."""
    with pytest.raises(PublishError):
        await publish_simulation(_sim(wall_ms()), hostname="127.0.0.1", port=1, duration_s=1.0)


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_broker_that_goes_away_ends_the_run_with_publish_error(
    mosquitto_server: MosquittoServer,
) -> None:
    """The broker stops mid-run: the publisher raises PublishError instead of waiting forever
    for acknowledgements that cannot come (the commands print it as one line)."""
    server = mosquitto_server
    run = asyncio.ensure_future(
        publish_simulation(_sim(wall_ms()), hostname=server.host, port=server.port, duration_s=None)
    )
    async with aiomqtt.Client(server.host, server.port, identifier="watch") as watch:
        await watch.subscribe(f"{PREFIX}/+/events", qos=1)
        async with asyncio.timeout(30):
            await anext(aiter(watch.messages))  # the run is publishing
    server.stop()
    with pytest.raises(PublishError, match="went away"):
        async with asyncio.timeout(60):
            await run


@pytest.mark.asyncio
async def test_a_finished_run_leaves_no_socket_open(mosquitto_broker: Broker) -> None:
    """When a run returns, every socket it opened is closed: paho's wake-up socket pair for
    its network thread too, not left for the garbage collector (whose ResourceWarning would
    surface in whatever test happens to collect it)."""
    broker = mosquitto_broker
    with left_open() as still_open:
        await publish_simulation(
            _sim(wall_ms()), hostname=broker.host, port=broker.port, duration_s=0.2,
            topic_prefix=broker.prefix,
        )  # fmt: skip
        assert not still_open()  # none of the sockets it opened is still open
