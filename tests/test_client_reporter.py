"""The Reporter on a real Mosquitto: batching, the fields it fills, splitting, offline
buffering with a bound, close, and calls from asyncio and from many threads."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import paho.mqtt.client as mqtt
import pytest

from edgemon.client import AudioFormat, Reporter

from mqtt_probe import Probe, probe
from ports import MosquittoServer, free_port
from sockets import left_open

if TYPE_CHECKING:
    from pathlib import Path

    from brokers import Broker

pytestmark = pytest.mark.integration

TOPIC = "edgemon/v1/dev1/events"


def counting_clock(start: float = 1_700_000_000_000.0) -> Any:
    """A device clock that advances 1 ms per reading."""
    ticks = itertools.count()
    return lambda: start + next(ticks)


def poll(check: Any, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def batches(watcher: Probe, topic: str = TOPIC) -> list[list[dict[str, Any]]]:
    return [m.json() for m in watcher.seen if m.topic == topic]


def test_calls_within_flush_ms_are_one_batch(mosquitto_broker: Broker) -> None:
    """Twenty chunk calls and a start made within `flush_ms` reach the broker as ONE message
    (a JSON array) at QoS 1, with `t_ms` from the injected clock at each call, `seq` 0..19,
    `audio_ms` from PCM bytes, and `audio_total_ms` the exact running total."""
    broker = mosquitto_broker
    topic = broker.topic("dev1", "events")
    with probe(broker.host, broker.port, topic) as watcher:
        reporter = broker.reporter(
            "dev1", "r1", flush_ms=500, clock=counting_clock(), merge_chunks=False
        )
        with reporter:
            reporter.start("req-1", margin_ms=100, player="rebuffer", audio_format="s16le:24000:1")
            for _ in range(20):
                reporter.chunk("req-1", pcm_bytes=4_800, eta_ms=150)  # 100 ms of s16le 24k
            assert watcher.wait_for(lambda seen: len(seen) >= 1)  # sent when due, unasked
            assert reporter.flush(15)
            stats = reporter.stats
    assert stats.events == stats.sent == 21
    assert stats.messages == 1
    (batch,) = batches(watcher, topic)
    start, *chunks = batch
    assert start == {
        "type": "start", "stream": "req-1", "t_ms": 1_700_000_000_000.0,
        "margin_ms": 100.0, "player": "rebuffer",
    }  # fmt: skip
    assert [c["seq"] for c in chunks] == list(range(20))
    assert [c["t_ms"] for c in chunks] == [1_700_000_000_001.0 + i for i in range(20)]
    assert {c["audio_ms"] for c in chunks} == {100.0}
    assert [c["audio_total_ms"] for c in chunks] == [100.0 * (i + 1) for i in range(20)]
    assert all(c["eta_ms"] == 150.0 and c["type"] == "chunk" for c in chunks)


def test_batches_split_within_the_daemon_limits(mosquitto_broker: Broker) -> None:
    """More events than `max_batch_events`, or more bytes than `max_payload_bytes`, are split
    into several messages, each within both limits, together holding every event in order."""
    broker = mosquitto_broker
    topic = broker.topic("dev1", "events")
    with probe(broker.host, broker.port, topic) as watcher:
        with broker.reporter(
            "dev1", "r2", flush_ms=2_000, merge_chunks=False, max_batch_events=7,
            max_payload_bytes=1_024,
        ) as reporter:  # fmt: skip
            for i in range(60):
                reporter.chunk(f"stream-{i % 3}-{'x' * 90}", audio_ms=20)
            assert reporter.flush(15)
        assert watcher.wait_for(lambda seen: sum(len(m.json()) for m in seen) >= 60)
    sizes = [len(m.payload) for m in watcher.seen]
    counts = [len(batch) for batch in batches(watcher, topic)]
    assert max(counts) <= 7
    assert max(sizes) <= 1_024
    assert any(size > 700 for size in sizes)  # the byte limit, not only the count, split them
    events = [event for batch in batches(watcher, topic) for event in batch]
    for i in range(3):
        mine = [e["seq"] for e in events if e["stream"].startswith(f"stream-{i}-")]
        assert mine == list(range(20))


def test_offline_buffer_is_bounded_and_delivered_after_the_broker_starts(
    tmp_path: Path,
) -> None:
    """Reported while the broker is down: the newest `max_buffered_events` wait (the oldest are
    dropped and counted) and arrive once the broker is up; the survivors keep their `seq` and
    their exact `audio_total_ms`, so edgemon resynchronises across the gap. A later outage of a
    connected Reporter is bridged the same way after it reconnects."""
    server = MosquittoServer(tmp_path, persistence=True)
    server.start()
    try:
        with probe(server.host, server.port, TOPIC, session="probe-offline") as watcher:
            server.stop()
            reporter = Reporter(
                server.url, "dev1", client_id="r3", merge_chunks=False, max_buffered_events=5
            )
            with reporter:
                for _ in range(12):
                    reporter.chunk("s", audio_ms=40)
                stats = reporter.stats
                assert (stats.buffered, stats.dropped, stats.connected) == (5, 7, False)
                assert not reporter.flush(0.2)
                server.start()
                assert reporter.flush(30)
                assert reporter.stats.sent == 5
                server.stop()  # and once more, now that it was connected
                assert poll(lambda: not reporter.stats.connected)
                reporter.end("s", "error")
                server.start()
                assert reporter.flush(30)
                stats = reporter.stats
            assert watcher.wait_for(lambda seen: len(seen) >= 2, 30)
    finally:
        server.stop()
    assert (stats.sent, stats.dropped, stats.connects) == (6, 7, 2)
    # The broker may deliver a batch to the probe twice: stopped before the probe's PUBACK
    # reached it, it sends the batch again to the probe's persistent session (QoS 1 is at
    # least once to a subscriber). What the Reporter sent is each distinct batch.
    received = batches(watcher)
    distinct = [batch for i, batch in enumerate(received) if batch not in received[:i]]
    events = [event for batch in distinct for event in batch]
    assert [e.get("seq") for e in events] == [7, 8, 9, 10, 11, None]
    assert [e.get("audio_total_ms") for e in events] == [320.0, 360.0, 400.0, 440.0, 480.0, None]
    assert events[-1] == {
        "type": "end",
        "stream": "s",
        "t_ms": events[-1]["t_ms"],
        "reason": "error",
    }


def test_close_flushes_what_is_waiting(mosquitto_broker: Broker) -> None:
    """With a long `flush_ms`, nothing is due yet; `close()` sends it all before returning,
    and a second `close()` does nothing."""
    broker = mosquitto_broker
    topic = broker.topic("dev1", "events")
    with probe(broker.host, broker.port, topic) as watcher:
        reporter = broker.reporter("dev1", "r4", flush_ms=60_000)
        reporter.open()
        assert reporter.open() is reporter
        reporter.start("s")
        reporter.chunk("s", audio_ms=20, final=True)
        reporter.close(15)
        reporter.close()
        assert reporter.stats.sent == 2
        assert watcher.wait_for(lambda seen: len(seen) == 1)
    assert [e["type"] for e in batches(watcher, topic)[0]] == ["start", "chunk"]


def test_usable_from_asyncio(mosquitto_broker: Broker) -> None:
    """Coroutines of one event loop report without blocking it (the calls return at once),
    and `flush` runs in a worker thread; every stream's `seq` is 0..n-1 on the wire."""
    broker = mosquitto_broker
    topic = broker.topic("dev1", "events")

    async def player(reporter: Reporter, name: str) -> None:
        for _ in range(25):
            reporter.chunk(name, pcm_bytes=4_800, audio_format=AudioFormat.PCM_S16LE_24K_MONO)
            await asyncio.sleep(0)
        reporter.end(name)

    async def main(reporter: Reporter) -> bool:
        await asyncio.gather(*(player(reporter, f"a{i}") for i in range(4)))
        return await asyncio.to_thread(reporter.flush, 15)

    with probe(broker.host, broker.port, topic) as watcher:
        with broker.reporter("dev1", "r5", merge_chunks=False) as reporter:
            assert asyncio.run(main(reporter))
        assert watcher.wait_for(lambda seen: sum(len(m.json()) for m in seen) == 104)
    events = [event for batch in batches(watcher, topic) for event in batch]
    for i in range(4):
        mine = [e for e in events if e["stream"] == f"a{i}"]
        assert [e.get("seq") for e in mine] == [*range(25), None]
        assert mine[-1]["type"] == "end"
        assert mine[-2]["audio_total_ms"] == 2_500.0


def test_many_threads_at_once(mosquitto_broker: Broker) -> None:
    """Eight threads report at once, two per stream, with odd PCM sizes: nothing is lost or
    duplicated, each stream's `seq` is 0..n-1 in order with its `t_ms` never going back, and
    its last `audio_total_ms` is exactly the audio of the whole frames it was given."""
    broker = mosquitto_broker
    topic = broker.topic("dev1", "events")
    fmt = AudioFormat.PCM_F32LE_48K_STEREO
    calls = 150
    with probe(broker.host, broker.port, topic) as watcher:
        with broker.reporter("dev1", "r6", merge_chunks=False) as reporter:

            def work(stream: str, size: int) -> None:
                for _ in range(calls):
                    reporter.chunk(stream, pcm_bytes=size, audio_format=fmt)

            threads = [
                threading.Thread(target=work, args=(f"t{i % 4}", 1_000 + 13 * i)) for i in range(8)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert reporter.flush(30)
            stats = reporter.stats
        total = stats.events
        assert watcher.wait_for(lambda seen: sum(len(m.json()) for m in seen) >= total, 30)
    events = [event for batch in batches(watcher, topic) for event in batch]
    assert len(events) == total == stats.sent
    for i in range(4):
        mine = [e for e in events if e["stream"] == f"t{i}"]
        assert [e["seq"] for e in mine] == list(range(len(mine)))
        assert all(a["t_ms"] <= b["t_ms"] for a, b in itertools.pairwise(mine))
        given = calls * ((1_000 + 13 * i) + (1_000 + 13 * (i + 4)))
        frames = given // fmt.frame_bytes
        assert mine[-1]["audio_total_ms"] == float(Fraction(frames * 1000, fmt.rate))
    assert json.loads(watcher.seen[0].payload)  # every message is a JSON array of events


def test_a_failed_publish_is_retried_in_order(mosquitto_broker: Broker) -> None:
    """A publish that raises or is refused by the library (a fault a real broker does not
    produce on demand, so it is injected) loses nothing: the events go back ahead of newer
    ones and reach the broker once, in order."""
    broker = mosquitto_broker
    topic = broker.topic("dev1", "events")
    with probe(broker.host, broker.port, topic) as watcher:
        with broker.reporter("dev1", "r7", merge_chunks=False, max_batch_events=4) as reporter:
            client = reporter._sender.client
            assert client is not None
            real = client.publish
            faults: list[str] = ["raise", "refuse"]

            def flaky(*args: Any, **kwargs: Any) -> Any:
                if faults and faults[0] == "raise":
                    faults.pop(0)
                    raise OSError("injected")
                if faults:  # as paho refuses a message when its queue is full
                    faults.pop(0)
                    refused = mqtt.MQTTMessageInfo(0)
                    refused.rc = mqtt.MQTT_ERR_QUEUE_SIZE
                    return refused
                return real(*args, **kwargs)

            client.publish = flaky  # type: ignore[method-assign]
            for _ in range(10):
                reporter.chunk("s", audio_ms=20)
            assert reporter.flush(15)
            stats = reporter.stats
        assert watcher.wait_for(lambda seen: sum(len(m.json()) for m in seen) >= 10)
    assert not faults
    assert stats.sent == 10
    events = [event for batch in batches(watcher, topic) for event in batch]
    assert [e["seq"] for e in events] == list(range(10))


def test_close_without_a_broker_keeps_its_timeout() -> None:
    """With no broker to reach, `close(1)` gives up on flushing after about a second and says
    what was left unsent; the calls never waited for the network."""
    dead = f"mqtt://127.0.0.1:{free_port()}"
    reporter = Reporter(dead, "dev1", client_id="r8", merge_chunks=False).open()
    started = time.monotonic()
    for _ in range(50):
        reporter.chunk("s", audio_ms=20)
    calls_s = time.monotonic() - started
    assert not reporter.flush(0.2)
    started = time.monotonic()
    reporter.close(1.0)
    closed_s = time.monotonic() - started
    stats = reporter.stats
    assert (stats.events, stats.sent, stats.buffered, stats.connected) == (50, 0, 50, False)
    assert closed_s < 10  # generous: about 1 s
    assert calls_s < 10


def test_a_closed_reporter_leaves_no_socket_open(mosquitto_broker: Broker) -> None:
    """After `close()`, every socket the Reporter opened is closed: the connection and the
    wake-up socket pair of paho's network thread, not left for the garbage collector."""
    broker = mosquitto_broker
    with left_open() as still_open:
        reporter = broker.reporter("dev1", "r-sockets").open()
        assert poll(lambda: reporter.stats.connected)
        reporter.close(15)
        assert not still_open()  # none of the sockets it opened is still open
