"""What a router reads of the engines' capacity (docs/fleet.md): `/api/v1/capacity` on a real
server, and HAProxy's agent check answered by a running daemon on a real Mosquitto."""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest

from edgemon.adapters.agent import serve_agent
from edgemon.adapters.capacity import agent_answer, agent_reply, device_share, spare_share
from edgemon.adapters.http import create_app, serve
from edgemon.adapters.metrics import ConnectionState, build_registry
from edgemon.capacity_object import Capacity
from edgemon.daemon import Daemon
from edgemon.engine.config import EngineConfig
from edgemon.monitor import Monitor
from edgemon.protocol import CAPACITY_MAX_AGE_MS, DEFAULT_MAX_SEQS
from edgemon.settings import HttpSettings

from clients import device, settings_for
from daemons import running

if TYPE_CHECKING:
    from brokers import Broker

T0 = 1_764_000_000_000.0
#: How long a test waits for what must come at once on an idle machine.
WITHIN_S = 15.0


def fed(objects: dict[str, tuple[float, dict[str, Any]]], *events_of: str) -> Monitor:
    """A monitor given each device's capacity object at its wall time, and a chunk from each
    device of `events_of` (known, without a capacity object)."""
    monitor = Monitor(EngineConfig())
    for device_id, (recv_ms, value) in objects.items():
        topic = f"edgemon/v1/{device_id}/capacity"
        monitor.handle(topic, json.dumps(value).encode(), recv_ms, [])
    for device_id in events_of:
        chunk = {"type": "chunk", "stream": "s", "t_ms": T0, "seq": 0, "audio_ms": 200}
        monitor.handle(f"edgemon/v1/{device_id}/events", json.dumps(chunk).encode(), T0, [])
    return monitor


def test_agent_reply_weighs_spare_streams() -> None:
    """The weight is the spare share of real-time streams in percent (rounded, at least 1 while
    any stream is spare), 0 % with none spare, 100 % when nothing is known (fail open)."""
    assert [agent_reply(share) for share in (None, 0.0, 0.004, 0.25, 0.666, 1.0)] == [
        "up 100%\n",
        "up 0%\n",
        "up 1%\n",
        "up 25%\n",
        "up 67%\n",
        "up 100%\n",
    ]


def test_each_device_has_a_share_capped_by_what_its_engine_can_hold() -> None:
    """A device's share is spare over real-time streams, unknown unless both are given;
    running beyond real time is no spare; no real-time stream at all is 0; each figure is
    capped by the engine's `max_num_seqs` (else `DEFAULT_MAX_SEQS`), so 2^53 streams running
    out of 2^53 is a full engine, never a share that swamps others."""
    assert device_share(None, None) is None
    assert device_share(Capacity(running=3), None) is None
    assert device_share(Capacity(realtime_streams=4), None) is None
    assert device_share(Capacity(realtime_streams=8, running=2), None) == 0.75
    assert device_share(Capacity(realtime_streams=4, running=9), None) == 0.0
    assert device_share(Capacity(realtime_streams=0, running=0), None) == 0.0
    huge = Capacity(realtime_streams=2.0**53, running=2**53)
    assert device_share(huge, None) == 0.0
    assert device_share(Capacity(realtime_streams=2.0**53, running=0), 16) == 1.0
    assert device_share(Capacity(realtime_streams=2.0**53, running=8), 16) == 0.5
    assert device_share(Capacity(realtime_streams=2.0**53, running=8), None) == (
        (DEFAULT_MAX_SEQS - 8) / DEFAULT_MAX_SEQS
    )


def test_the_box_share_averages_the_devices_it_knows() -> None:
    """Over several devices the shares are averaged over those known (one device moves the
    box by its own share at most); none known is None."""
    assert spare_share([]) is None
    assert spare_share([None, None]) is None
    assert spare_share([0.75, None]) == 0.75
    assert spare_share([1.0, 0.0, None]) == 0.5


def test_agent_answer_for_one_device_or_the_box() -> None:
    """With a device set the answer is that device's (unknown to edgemon: up 100 %); without,
    every device's share averaged. A forged full object on one device of two halves the box
    at most (before, the absolute figures summed: 2^53 streams made any box look full)."""
    monitor = fed(
        {
            "a": (T0, {"realtime_streams": 10, "running": 10}),
            "b": (T0, {"realtime_streams": 10, "running": 5}),
        },
        "c",
    )
    engine = monitor.engine
    assert agent_answer(engine, "a", T0) == "up 0%\n"
    assert agent_answer(engine, "b", T0) == "up 50%\n"
    assert agent_answer(engine, "c", T0) == "up 100%\n"
    assert agent_answer(engine, "nope", T0) == "up 100%\n"
    assert agent_answer(engine, None, T0) == "up 25%\n"
    forged = fed(
        {
            "real": (T0, {"realtime_streams": 8, "running": 2}),
            "forged": (T0, {"realtime_streams": 2**53, "running": 2**53}),
        }
    )
    assert agent_answer(forged.engine, None, T0) == "up 38%\n"


def test_a_stale_or_void_object_counts_for_nothing_in_the_agent_check() -> None:
    """An object older than `CAPACITY_MAX_AGE_MS`, by when it came or by its own `t_ms`, is
    unknown to the agent check (fail open), and so is a device whose last object was voided
    by an unreadable one or emptied; a fresh object counts again."""
    full = {"realtime_streams": 8, "running": 8}
    monitor = fed(
        {
            "old": (T0 - CAPACITY_MAX_AGE_MS - 1, full),
            "dated": (T0, {**full, "t_ms": 1}),
            "fresh": (T0, {"realtime_streams": 8, "running": 2}),
        }
    )
    engine = monitor.engine
    assert agent_answer(engine, "old", T0) == "up 100%\n"
    assert agent_answer(engine, "dated", T0) == "up 100%\n"
    assert agent_answer(engine, None, T0) == "up 75%\n"
    for payload in (b'{"running": 1e400}', b""):
        monitor.handle("edgemon/v1/fresh/capacity", payload, T0 + 1, [])
        assert agent_answer(engine, "fresh", T0 + 1) == "up 100%\n"
        monitor.handle("edgemon/v1/fresh/capacity", json.dumps(full).encode(), T0 + 2, [])
        assert agent_answer(engine, "fresh", T0 + 2) == "up 0%\n"


@pytest.mark.asyncio
async def test_capacity_api_per_device_with_age_and_spare_streams() -> None:
    """`/api/v1/capacity` lists every device by id with its last capacity object, how long
    ago it came (edgemon's wall clock) and whether that makes it stale, its spare real-time
    streams (null unless known, never below 0) and its refusals; a device without one has
    nulls; `?device=` answers one device (none if unknown)."""
    monitor = fed(
        {
            "full": (T0 - 500, {"realtime_streams": 4, "running": 6, "waiting": 3}),
            "room": (T0 - 2000, {"realtime_streams": 12, "running": 9, "shed_total": 2}),
            "half": (T0 - 100, {"running": 2}),
            "old": (T0 - 20_000, {"running": 2}),
        },
        "plain",
    )
    now = T0 + 1000
    app = create_app(
        registry=build_registry(
            monitor,
            wall_clock=lambda: now,
            connection=ConnectionState(),
            per_stream_series=0,
            version="0",
        ),
        monitor=monitor,
        connection=ConnectionState(),
        wall_clock=lambda: now,
    )
    async with (
        serve(app, host="127.0.0.1", port=0) as port,
        aiohttp.ClientSession(f"http://127.0.0.1:{port}") as client,
    ):
        async with client.get("/api/v1/capacity") as response:
            assert response.status == 200
            body = await response.json()
        async with client.get("/api/v1/capacity", params={"device": "room"}) as response:
            one = await response.json()
        async with client.get("/api/v1/capacity", params={"device": "nope"}) as response:
            none = await response.json()
    assert body["wall_ms"] == now
    by_id = {entry["device"]: entry for entry in body["devices"]}
    assert [e["device"] for e in body["devices"]] == ["full", "half", "old", "plain", "room"]
    assert by_id["room"] == {
        "device": "room",
        "capacity": {
            "t_ms": None,
            "realtime_streams": 12.0,
            "running": 9,
            "waiting": None,
            "start_wait_ms": None,
            "shed_total": 2,
        },
        "received_wall_ms": T0 - 2000,
        "age_ms": 3000.0,
        "stale": False,
        "spare_streams": 3.0,
        "shed": 2,
        "shed_cut": 0,
    }
    assert (by_id["full"]["spare_streams"], by_id["full"]["age_ms"]) == (0.0, 1500.0)
    assert by_id["half"]["spare_streams"] is None
    assert (by_id["old"]["age_ms"], by_id["old"]["stale"]) == (21_000.0, True)
    assert by_id["plain"]["capacity"] is None
    assert by_id["plain"]["spare_streams"] is None
    assert one["devices"] == [by_id["room"]]
    assert none["devices"] == []


async def agent_port(daemon: Daemon) -> int:
    """The port the daemon's agent check listens on, once it does."""
    async with asyncio.timeout(WITHIN_S):
        while (port := daemon.agent_port) is None:  # noqa: ASYNC110 - no event for it
            await asyncio.sleep(0.01)
    return port


async def ask_agent(port: int, send: bytes = b"") -> bytes:
    """Connect to the agent port as HAProxy does (sending its `agent-send` string, if any),
    and read until the agent closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if send:
            writer.write(send)
        async with asyncio.timeout(WITHIN_S):
            return await reader.read()
    finally:
        writer.close()


@pytest.mark.asyncio
async def test_agent_server_answers_each_connection_and_stops_with_one_open() -> None:
    """Each connection gets the answer as it is then, whether or not the peer sends a line
    first; a connection the peer keeps open does not hold up the server's end."""
    answers = iter(["up 100%\n", "up 40%\n", "up 0%\n"])
    async with asyncio.timeout(WITHIN_S):  # the end does not wait for the idle peer
        async with serve_agent(lambda: next(answers), host="127.0.0.1", port=0) as port:
            assert await ask_agent(port) == b"up 100%\n"
            assert await ask_agent(port, b"box-a\n") == b"up 40%\n"
            reader, idle = await asyncio.open_connection("127.0.0.1", port)
            assert await reader.readline() == b"up 0%\n"
    idle.close()


@pytest.mark.integration
@pytest.mark.asyncio
async def test_daemon_answers_the_agent_check_from_capacity_objects(
    mosquitto_broker: Broker,
) -> None:
    """A daemon with `agent_listen` answers `up 100%` before it knows anything, then the
    weight of its device's retained capacity object, and follows a newer one."""
    broker = mosquitto_broker
    http = HttpSettings(listen="127.0.0.1:0", agent_listen="127.0.0.1:0", agent_device="tts")
    daemon = Daemon(settings_for(broker, http=http), environ={}, install_signal_handlers=False)
    async with running(daemon), device(broker) as engine:
        agent = await agent_port(daemon)
        assert await ask_agent(agent) == b"up 100%\n"
        for running_now, expected in ((6, b"up 25%\n"), (8, b"up 0%\n")):
            payload = json.dumps({"realtime_streams": 8, "running": running_now})
            await engine.publish(broker.topic("tts", "capacity"), payload, qos=1, retain=True)
            async with asyncio.timeout(WITHIN_S):
                while (answer := await ask_agent(agent)) != expected:
                    assert answer in (b"up 100%\n", b"up 25%\n")
                    await asyncio.sleep(0.05)


def test_agent_check_is_off_unless_configured() -> None:
    """`[http] agent_listen` is unset by default (no port opened); when set it must be
    HOST:PORT, and `agent_device` a device id."""
    assert HttpSettings().agent_address is None
    assert HttpSettings(agent_listen="[::1]:9858").agent_address == ("::1", 9858)
    for bad in ({"agent_listen": "9858"}, {"agent_device": "a/b"}):
        with pytest.raises(ValueError, match="agent_"):
            HttpSettings(**bad)


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_forged_or_stale_object_moves_the_box_by_its_own_share_at_most(
    mosquitto_broker: Broker,
) -> None:
    """A daemon answering for the whole box: the real engine's object (75 % spare), then a
    forged "full" object of 2^53 streams on another device: the box's weight is the devices'
    shares averaged, 38 % (before: the figures summed, 1 %); once that object is stamped in
    1970 it counts for nothing, 75 % again (before: obeyed)."""
    broker = mosquitto_broker
    http = HttpSettings(listen="127.0.0.1:0", agent_listen="127.0.0.1:0")
    daemon = Daemon(settings_for(broker, http=http), environ={}, install_signal_handlers=False)
    now = time.time() * 1000.0
    async with running(daemon), device(broker) as engine:
        agent = await agent_port(daemon)
        for topic, value, expected in (
            ("tts", {"t_ms": now, "realtime_streams": 8, "running": 2}, b"up 75%\n"),
            ("other", {"t_ms": now, "realtime_streams": 2**53, "running": 2**53}, b"up 38%\n"),
            ("other", {"t_ms": 1, "realtime_streams": 8, "running": 8}, b"up 75%\n"),
        ):
            payload = json.dumps(value)
            await engine.publish(broker.topic(topic, "capacity"), payload, qos=1, retain=True)
            async with asyncio.timeout(WITHIN_S):
                while await ask_agent(agent) != expected:  # noqa: ASYNC110 - the answer changes with what the broker delivers
                    await asyncio.sleep(0.05)
