"""Bounded input: a packet larger than the link reads is never held (MQTT 5: it ends the
connection; MQTT 3.1.1: a PUBLISH is dropped unread and acknowledged), and a packet that
arrives in many pieces is reassembled in time linear in its size."""

from __future__ import annotations

import asyncio
import gc
import random
import tracemalloc
from typing import TYPE_CHECKING, Any

import pytest
from sessions import connect_request

from edgemon.daemon import Daemon
from edgemon.daemon.intake import Intake
from edgemon.daemon.mqtt import LinkHooks
from edgemon.daemon.mqtt_codec import varint
from edgemon.daemon.mqtt_connection import Connection
from edgemon.settings import HttpSettings, LimitsSettings, MqttSettings, Settings

from clients import scrape
from daemons import logged, running
from fake_broker import FakeBroker, publish_packet
from links import running_link, until
from scrapes import samples

if TYPE_CHECKING:
    from collections.abc import Callable, MutableMapping

pytestmark = pytest.mark.asyncio

TOPIC = "edgemon/v1/d/events"


async def test_a_v5_packet_over_the_declared_size_ends_the_connection(
    captured_logs: list[MutableMapping[str, Any]],
) -> None:
    """On MQTT 5 the link declared its Maximum Packet Size (4,096 bytes here), so a larger
    packet is a protocol error: the broker sends a PUBLISH whose header says 50 MB, and 10
    bytes of it, and the link ends the connection at once (it neither waits for nor buffers
    the rest) with an error that says the size and the limit. Nothing of it was applied."""
    applied: list[bytes] = []
    hooks = LinkHooks(
        on_message=lambda _topic, payload: applied.append(payload),
        status_payload=lambda state: state.encode(),
    )
    async with running_link("big", "edgemon", hooks=hooks, max_packet=4096, protocol="5") as (
        link,
        broker,
    ):
        await until(lambda: link.connection.subscribed, "subscribed")
        broker.send(b"\x32" + varint(50_000_000) + b"\x00\x01t\x00\x07\x00" + b"x" * 4)
        await until(lambda: bool(logged(captured_logs, "mqtt_disconnected")), "link ended")
    (lost, *_) = logged(captured_logs, "mqtt_disconnected")
    assert "50,000,005 bytes" in lost["error"]
    assert "4,096 at most" in lost["error"]
    assert applied == []


async def test_a_3_1_1_message_too_large_is_dropped_unread_and_acknowledged_in_turn() -> None:
    """On MQTT 3.1.1 the broker cannot be told a limit, and a message it delivers again on
    every connection must not stop the link for every device. A daemon whose
    `[limits] max_payload_bytes` is 1,000 gets a 3 MB PUBLISH (id 5) between two chunks (ids 4
    and 6): it is dropped as it arrives (never held whole), counted as `oversized`, and
    acknowledged in its turn: PUBACKs 4, 5, 6 in that order, on the one connection."""
    broker = FakeBroker()
    settings = Settings(
        mqtt=MqttSettings(url=f"mqtt://127.0.0.1:{broker.port}", client_id="edgemon-big"),
        http=HttpSettings(listen="127.0.0.1:0"),
        limits=LimitsSettings(max_payload_bytes=1000),
    )
    chunk = b'{"type":"chunk","stream":"s","t_ms":%d,"seq":%d,"audio_ms":100}'
    daemon = Daemon(settings, environ={}, install_signal_handlers=False)
    try:
        async with running(daemon):
            http = daemon.http_port
            assert http is not None
            broker.publish([(TOPIC, b'{"type":"start","stream":"s","t_ms":0}', 3)])
            broker.publish([(TOPIC, chunk % (10, 0), 4)])
            broker.publish([(TOPIC, b"x" * 3_000_000, 5)])
            broker.publish([(TOPIC, chunk % (20, 1), 6)])
            await until(lambda: len(broker.pubacks()) == 4, "every PUBACK")
            metrics = (await scrape(http, "/metrics"))[1]
    finally:
        broker.close()
    assert [ack.mid for ack in broker.pubacks()] == [3, 4, 5, 6]
    results = {dict(k)["result"]: v for k, v in samples(metrics, "edgemon_messages_total").items()}
    assert results["oversized"] == 1
    assert samples(metrics, "edgemon_chunks_total") == {(("device", "d"),): 2.0}
    assert broker.connections == 1


async def test_a_message_too_large_is_never_held_whole() -> None:
    """A 3.1.1 connection that reads 4,096 bytes at most, fed a 5 MB PUBLISH in 64 KiB reads
    and then a small one: the large one is reported (topic, size) and never held (the buffer
    holds one read at most), the small one applied."""
    applied: list[tuple[str, bytes]] = []
    too_large: list[tuple[str, int]] = []
    intake = Intake(
        lambda topic, payload: applied.append((topic, payload)),
        too_large=lambda topic, size: too_large.append((topic, size)),
    )
    conn = Connection(
        intake, connect_request(), max_packet=4096,
        on_accepted=lambda conn, _: intake.begin(conn, persistent=True),
    )  # fmt: skip
    conn.data_received(b"\x20\x02\x00\x00")  # CONNACK, accepted
    big = publish_packet(TOPIC, bytes(5_000_000), 1)
    stream = big + publish_packet(TOPIC, b"small", 2)
    for pos in range(0, len(stream), 65536):
        conn.data_received(stream[pos : pos + 65536])
    assert too_large == [(TOPIC, len(big))]
    assert applied == [(TOPIC, b"small")]
    assert conn.buffer.peak <= 65536


def connection(applied: list[tuple[str, bytes]]) -> Connection:
    """A connection fed by hand (no socket), accepted, applying to `applied`."""
    intake = Intake(lambda topic, payload: applied.append((topic, payload)))
    conn = Connection(
        intake, connect_request(), on_accepted=lambda conn, _: intake.begin(conn, persistent=True)
    )
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


async def test_acknowledged_messages_are_remembered_by_digest_not_payload() -> None:
    """256 QoS 1 messages of 256 KiB (64 MiB) applied and acknowledged, then the session
    ends: what the intake keeps to recognise their redelivery (the last 4,096 acknowledged,
    and at the end those expected again) is a digest each, a few kB in all, never the
    payloads (before: every payload, up to 4,096 × 256 KiB = 1 GiB)."""
    applied: list[int] = []
    intake = Intake(lambda _topic, payload: applied.append(len(payload)))
    conn = Connection(
        intake, connect_request(), on_accepted=lambda conn, _: intake.begin(conn, persistent=True)
    )
    conn.data_received(b"\x20\x02\x00\x00")  # CONNACK, accepted
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(256):
            conn.data_received(publish_packet(TOPIC, bytes([n]) * 256 * 1024, n + 1))
            await asyncio.sleep(0)  # the batch's acknowledgements go out
        intake.end(persistent=True)  # the last acknowledged are expected again
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert applied == [256 * 1024] * 256
    assert grown < 1024 * 1024, f"{grown:,} bytes kept for 256 acknowledged messages"
    assert intake.pending == intake.pending_bytes == 0


async def test_qos_0_messages_awaiting_the_log_count_toward_pausing() -> None:
    """QoS 0 messages are logged too: while the log holds them, they count toward the
    intake's limit, and reading pauses there (before, only QoS 1 counted: a QoS 0 flood
    while the log could not write grew its memory without bound)."""
    held: list[Callable[[], None]] = []
    intake = Intake(lambda *_: None, when_durable=held.append, pending_limits=(8, 1 << 40))
    conn = Connection(
        intake, connect_request(), on_accepted=lambda conn, _: intake.begin(conn, persistent=True)
    )
    conn.data_received(b"\x20\x02\x00\x00")  # CONNACK, accepted
    for n in range(8):
        conn.data_received(publish_packet(TOPIC, b"%d" % n, n + 1, qos=0))
    assert intake.paused
    assert intake.pending == 8
    for callback in held:
        callback()
    assert not intake.paused
    assert intake.pending == 0
