"""Bounded input: a packet larger than the link reads ends the connection before its body is
read, and a packet that arrives in many pieces is reassembled in time linear in its size."""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING, Any

import pytest

from edgemon.daemon.intake import Intake
from edgemon.daemon.mqtt import LinkHooks
from edgemon.daemon.mqtt_codec import V311, varint
from edgemon.daemon.mqtt_connection import Connection

from daemons import logged
from fake_broker import publish_packet
from links import running_link, until

if TYPE_CHECKING:
    from collections.abc import MutableMapping

pytestmark = pytest.mark.asyncio

TOPIC = "edgemon/v1/d/events"


async def test_an_oversized_packet_ends_the_connection_before_its_body_is_read(
    captured_logs: list[MutableMapping[str, Any]],
) -> None:
    """The link reads packets of 4,096 bytes at most (MQTT 3.1.1: the broker is not told).
    The broker sends a PUBLISH whose header says 50 MB, and 10 bytes of it: the link does not
    wait for (or buffer) the rest, it ends the connection with an error that says the size
    and the limit, and nothing of it was applied."""
    applied: list[bytes] = []
    hooks = LinkHooks(
        on_message=lambda _topic, payload: applied.append(payload),
        status_payload=lambda state: state.encode(),
    )
    async with running_link("big", "edgemon", hooks=hooks, max_packet=4096) as (link, broker):
        await until(lambda: link.connection.subscribed, "subscribed")
        broker.send(b"\x32" + varint(50_000_000) + b"\x00\x01t\x00\x07" + b"x" * 4)
        await until(lambda: bool(logged(captured_logs, "mqtt_disconnected")), "link ended")
    (lost, *_) = logged(captured_logs, "mqtt_disconnected")
    assert "50,000,005 bytes" in lost["error"]
    assert "4,096 at most" in lost["error"]
    assert applied == []


def connection(applied: list[tuple[str, bytes]]) -> Connection:
    """A connection fed by hand (no socket), accepted, applying to `applied`."""
    intake = Intake(lambda topic, payload: applied.append((topic, payload)))
    conn = Connection(
        intake, version=V311, keepalive_s=30,
        on_accepted=lambda conn, _: intake.begin(conn, persistent=True),
    )  # fmt: skip
    conn.data_received(b"\x20\x02\x00\x00")  # CONNACK, accepted
    return conn


async def test_a_large_packet_in_one_byte_pieces_is_copied_once() -> None:
    """A 256 KiB PUBLISH handed to the connection one byte per read (the worst a socket can
    do) is applied once, whole; and the bytes the buffer copied to put it together are at
    most twice its size: linear, where joining the pieces would copy 2^35 bytes."""
    applied: list[tuple[str, bytes]] = []
    conn = connection(applied)
    payload = random.Random(1).randbytes(256 * 1024)
    packet = publish_packet(TOPIC, payload, 7)
    for i in range(len(packet)):
        conn.data_received(packet[i : i + 1])
    assert applied == [(TOPIC, payload)]
    assert conn.buffer.moved <= 2 * len(packet)
    assert conn.buffer.pending == 0


async def test_packets_in_pieces_of_any_size_come_out_whole_and_in_order() -> None:
    """Two hundred PUBLISHes of 0 to 3,000 bytes, cut into pieces of random sizes that cross
    packet boundaries anywhere (and hold more than a read's budget of 16 messages): every
    message is applied once, in order, and the buffer copied at most twice what it received."""
    rng = random.Random(2)
    messages = [(f"{TOPIC}{n}", rng.randbytes(rng.randrange(3000))) for n in range(200)]
    stream = b"".join(publish_packet(t, p, n + 1) for n, (t, p) in enumerate(messages))
    applied: list[tuple[str, bytes]] = []
    conn = connection(applied)
    pos = 0
    while pos < len(stream):
        size = rng.choice((1, 2, 3, 7, 100, 1500, 4096, 65536))
        conn.data_received(stream[pos : pos + size])
        pos += size
        await asyncio.sleep(0)  # the rest of a read beyond the budget: next loop iteration
    await until(lambda: len(applied) == len(messages), "every message applied")
    assert applied == messages
    assert conn.buffer.moved <= 2 * len(stream)
