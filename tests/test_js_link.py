"""The web Reporter's own MQTT link (clients/js/src/mqtt.ts), in Node against a real
Mosquitto: its packets read by an independent codec (mqtt-packet), and what it does when the
broker refuses it, is not there yet, cuts its packets across WebSocket messages or goes dead
without closing (`ws_tap.WsTap`, the relay in front of Mosquitto).

The package must be built (`make test-browser` does: `npm run build` in clients/js).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import pytest
from shipped_broker import write_passwords
from ws_tap import WsTap

from brokers import (
    RUN_AS_ROOT,
    MosquittoStartError,
    end_process,
    free_port,
    launch_mosquitto,
    plain_listener,
)
from strict_peer import Packet, node_packets, protocol_problems, require_peer
from tools import require_tool
from web_players import JS, node_command

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

DRIVER = JS / "test" / "link.mjs"
TOPIC = "edgemon/v1/web-1/events"
#: How long a test waits for what it waits for (a loaded machine is slow, never this slow).
DEADLINE_MS = 30_000


class Driver:
    """One `link.mjs` run: a Reporter in Node, phase by phase."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    async def line(self) -> dict[str, Any]:
        """The driver's next line of JSON."""
        assert self.process.stdout is not None
        raw = await asyncio.wait_for(self.process.stdout.readline(), DEADLINE_MS / 1000 + 30)
        assert raw, "the driver ended early"
        result: dict[str, Any] = json.loads(raw)
        return result

    async def phase(self) -> dict[str, Any]:
        """Skip the `reported` line; the phase's result."""
        assert "reported" in await self.line()
        return await self.line()

    def next_phase(self) -> None:
        """Start the next phase."""
        assert self.process.stdin is not None
        self.process.stdin.write(b"go\n")


@asynccontextmanager
async def driver(url: str, phases: list[dict[str, Any]], **options: Any) -> AsyncIterator[Driver]:
    """`link.mjs` reporting to `url` in `phases` (device `web-1`), for the block."""
    spec = {"url": url, "device": "web-1", "phases": phases, **options}
    process = await asyncio.create_subprocess_exec(
        *node_command(), str(DRIVER), json.dumps(spec), cwd=str(JS),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        yield Driver(process)
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


@asynccontextmanager
async def tapped(directory: Path, *, piece: int | None = None) -> AsyncIterator[WsTap]:
    """A Mosquitto of the test's own and a `WsTap` in front of it."""
    require_tool("mosquitto")
    try:
        broker, (port,) = launch_mosquitto(directory, lambda ports: plain_listener(ports[0]))
    except MosquittoStartError as error:
        pytest.fail(str(error))
    tap = WsTap(port, piece=piece)
    await tap.start()
    try:
        yield tap
    finally:
        await tap.stop()
        end_process(broker)


def chunk_seqs(tap: WsTap) -> list[int]:
    """The `seq` of each chunk event in every PUBLISH the page sent through `tap`, in order."""
    events: list[dict[str, Any]] = []
    for packet in tap.packets:
        if packet.direction == "out" and packet.kind == "publish":
            at = 1
            while packet.data[at] & 0x80:  # the remaining length's bytes
                at += 1
            topic = at + 1
            payload = topic + 2 + int.from_bytes(packet.data[topic : topic + 2], "big") + 2
            events.extend(json.loads(packet.data[payload:]))
    return [event["seq"] for event in events if event["type"] == "chunk"]


def test_the_links_packets_read_clean_in_an_independent_codec() -> None:
    """mqtt-packet reads the CONNECT (3.1.1, a clean session, the login and keepalive) and QoS
    1 PUBLISHes whose remaining length sits on each side of every boundary of its encoding (1
    to 4 bytes) as the link meant them: topic, packet id and every payload byte."""
    require_peer()
    overhead = 2 + len(TOPIC) + 2
    payloads = [0] + [size - overhead for size in (127, 128, 16_383, 16_384, 2_097_151, 2_097_152)]
    login = {"clientId": "reporter-web-1-ab", "username": "web-1", "password": "sé cret"}
    spec = {**login, "keepaliveS": 30, "topic": TOPIC, "payloads": payloads}
    done = subprocess.run(
        [*node_command(), str(DRIVER), "--packets", json.dumps(spec)], cwd=JS, capture_output=True,
        text=True, check=True, timeout=60,
    )  # fmt: skip
    frames = [bytes.fromhex(text) for text in json.loads(done.stdout)]
    read = node_packets(4, [Packet(i, 0, "out", data) for i, data in enumerate(frames)])
    assert all("packet" in result for result in read), read
    connect = read[0]["packet"]
    assert connect["cmd"] == "connect"
    assert (connect["protocolId"], connect["protocolVersion"], connect["clean"]) == (
        "MQTT",
        4,
        True,
    )
    assert (connect["clientId"], connect["username"]) == (login["clientId"], login["username"])
    assert bytes.fromhex(connect["password"]) == login["password"].encode()
    assert connect["keepalive"] == 30
    for number, (length, result) in enumerate(zip(payloads, read[1:], strict=True), start=1):
        publish = result["packet"]
        assert (publish["cmd"], publish["qos"], publish["messageId"]) == ("publish", 1, number)
        assert publish["topic"] == TOPIC
        assert bytes.fromhex(publish["payload"]) == bytes(i % 251 for i in range(length))


@pytest.mark.asyncio
@pytest.mark.parametrize("piece", [None, 1, 3])
async def test_a_session_keeps_the_rules(tmp_path: Path, piece: int | None) -> None:
    """Every event reaches the broker once, acknowledged: the session's packets, read by
    mqtt-packet, keep MQTT's rules (CONNECT first, each QoS 1 PUBLISH's id free until its
    PUBACK), and end with a DISCONNECT; also when the broker's packets reach the page a byte
    a message, or three bytes a message (a packet cut across messages, two in one)."""
    require_peer()
    async with tapped(tmp_path, piece=piece) as tap:
        async with driver(tap.url, [{"chunks": 20, "waitMs": DEADLINE_MS}]) as run:
            result = await run.phase()
            assert result["done"], result
            assert (result["stats"]["sent"], result["stats"]["connects"]) == (21, 1)
            await asyncio.wait_for(run.process.wait(), DEADLINE_MS / 1000)
        assert chunk_seqs(tap) == list(range(20))
        read = node_packets(4, tap.packets)
        assert all("packet" in r for r in read), read
        assert (
            protocol_problems(list(zip(tap.packets, [r["packet"] for r in read], strict=True)))
            == []
        )
        assert tap.kinds()[0] == ("out", "connect")
        assert tap.kinds()[-1] == ("out", "disconnect")


@pytest.mark.asyncio
async def test_a_refused_login_is_counted_logged_once_and_retried(tmp_path: Path) -> None:
    """A wrong password: each CONNACK refusal is a connection error, the first says why
    (once), the link tries again, and nothing is published."""
    require_tool("mosquitto", "mosquitto_passwd")
    passwords = write_passwords(tmp_path / "passwords", {"web-1": "right"})
    config = (
        f"{RUN_AS_ROOT}per_listener_settings false\nallow_anonymous false\n"
        f"password_file {passwords}\npersistence false\nlog_dest stderr\n"
        "listener {0} 127.0.0.1\nlistener {1} 127.0.0.1\nprotocol websockets\n"
    )
    try:
        broker, (_, ws) = launch_mosquitto(
            tmp_path, lambda ports: config.format(*ports), listeners=2
        )
    except MosquittoStartError as error:
        pytest.fail(str(error))
    try:
        phase = {"chunks": 3, "waitMs": DEADLINE_MS, "until": {"connectErrors": 3}}
        async with driver(
            f"ws://127.0.0.1:{ws}", [phase], password="wrong", reconnectPeriodMs=50
        ) as run:
            result = await run.phase()
        assert result["done"], result
        assert (result["stats"]["sent"], result["stats"]["connects"]) == (0, 0)
        said = (
            "edgemon reporter web-1: cannot reach the broker (the broker refused the connection:"
            " not authorized); retrying, events wait in the buffer"
        )
        assert result["logs"] == [said]
        async with driver(
            f"ws://127.0.0.1:{ws}", [{"chunks": 3, "waitMs": DEADLINE_MS}], password="right"
        ) as run:
            result = await run.phase()
        assert result["done"], result
        assert result["stats"]["sent"] == 4, result
    finally:
        end_process(broker)


@pytest.mark.asyncio
async def test_events_wait_for_a_broker_that_comes_back(tmp_path: Path) -> None:
    """No broker when the events are reported: they wait, and reach it, each once, when it
    starts; the failed attempts are counted."""
    require_tool("mosquitto")
    port = free_port()
    tap = WsTap(port)
    await tap.start()
    broker = None
    try:
        async with driver(
            tap.url, [{"chunks": 5, "waitMs": DEADLINE_MS}], reconnectPeriodMs=50
        ) as run:
            assert await run.line() == {"reported": 0}
            await asyncio.wait_for(tap.wait_connections(2), DEADLINE_MS / 1000)
            broker, _ = launch_mosquitto(
                tmp_path, lambda ports: plain_listener(ports[0]), ports=[port]
            )
            result = await run.line()
        assert result["done"], result
        assert result["stats"]["sent"] == 6
        assert result["stats"]["connectErrors"] >= 2
        assert chunk_seqs(tap) == list(range(5))
    finally:
        await tap.stop()
        if broker is not None:
            end_process(broker)


@pytest.mark.asyncio
async def test_a_dead_connection_is_found_by_keepalive_and_its_events_sent_again(
    tmp_path: Path,
) -> None:
    """The broker's packets stop reaching the page, the socket still open: the missing
    PINGRESP ends the connection, and the events whose PUBACK never came go again on the next
    one (each seq acknowledged once there; edgemon drops a seq it has)."""
    async with tapped(tmp_path) as tap:
        phases = [{"chunks": 2, "waitMs": DEADLINE_MS}, {"chunks": 4, "waitMs": DEADLINE_MS}]
        async with driver(tap.url, phases, keepaliveS=1) as run:
            first = await run.phase()
            assert first["done"], first
            assert first["stats"]["sent"] == 3, first
            tap.mute()
            run.next_phase()
            second = await run.phase()
        assert second["done"], second
        assert (second["stats"]["sent"], second["stats"]["connects"]) == (7, 2)
        assert any("no PINGRESP within 1 s" in line for line in second["logs"]), second["logs"]
        again = [p for p in tap.packets if p.connection == 1 and p.kind == "publish"]
        assert again, "nothing was sent again on the new connection"
        seqs = chunk_seqs(tap)
        assert sorted(set(seqs)) == list(range(6))
        assert seqs[: seqs.index(5) + 1] == list(range(6))  # the first send: all, in order
