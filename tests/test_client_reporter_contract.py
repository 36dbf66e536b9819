"""The Reporter's contract with a player, on a real Mosquitto: split reads merged into one
arrival, offline overflow that keeps starts and ends, `play_start_ms` on a chunk, sessions that
two Reporters of one device never take from each other, an unreachable broker said once,
lazy opening, and nothing lost when a player exits without `close()`."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import time
from typing import TYPE_CHECKING, Any

import pytest

from edgemon.client import Reporter

from mqtt_probe import Probe, probe
from ports import MosquittoServer, free_port

if TYPE_CHECKING:
    from pathlib import Path

    from brokers import Broker

pytestmark = pytest.mark.integration

TOPIC = "edgemon/v1/dev1/events"


def events(watcher: Probe, topic: str = TOPIC) -> list[dict[str, Any]]:
    """Every event the watcher saw on `topic`, in order."""
    return [event for m in watcher.seen if m.topic == topic for event in m.json()]


class StepClock:
    """A device clock the test moves by hand (epoch ms)."""

    def __init__(self, now: float = 1_700_000_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_pieces_within_a_flush_window_are_one_chunk(mosquitto_broker: Broker) -> None:
    """Two `chunk()` calls of one stream within one flush window (one server chunk read in two
    pieces) go out as ONE chunk event: audio summed, `t_ms` the later piece's arrival (so the
    audio never counts before all of it was there), `eta_ms` kept as the same instant, one
    `seq`; a piece after the window, or of another stream, is its own event."""
    broker = mosquitto_broker
    topic = broker.topic("dev1", "events")
    clock = StepClock()
    t0 = clock.now
    with probe(broker.host, broker.port, topic) as watcher:
        with broker.reporter(
            "dev1", flush_ms=10_000, clock=clock, audio_format="s16le:24000:1"
        ) as reporter:
            reporter.chunk("a", pcm_bytes=8_192, eta_ms=320)
            clock.now += 4
            reporter.chunk("a", pcm_bytes=7_168)  # 15,360 B in all: 320 ms
            reporter.chunk("b", audio_ms=80)
            assert reporter.flush(15)
            clock.now += 320
            reporter.chunk("a", pcm_bytes=15_360, final=True)
            assert reporter.flush(15)
            stats = reporter.stats
        assert watcher.wait_for(lambda seen: sum(len(m.json()) for m in seen) >= 3)
    a0, b0, a1 = events(watcher, topic)
    assert a0 == {
        "type": "chunk", "stream": "a", "t_ms": t0 + 4, "seq": 0, "audio_ms": 320.0,
        "audio_total_ms": 320.0, "eta_ms": 316.0,
    }  # fmt: skip
    assert (b0["stream"], b0["seq"], b0["audio_ms"]) == ("b", 0, 80.0)
    assert (a1["seq"], a1["audio_ms"], a1["audio_total_ms"], a1["final"]) == (1, 320.0, 640.0, True)
    assert (stats.events, stats.merged, stats.sent) == (3, 1, 3)


def test_offline_overflow_drops_chunks_never_starts_or_ends(tmp_path: Path) -> None:
    """While the broker is down and the buffer is full, the oldest CHUNKS go; every stream's
    `start` and `end` is delivered once the broker is back. `play_start_ms` given on a chunk
    is carried on the wire."""
    server = MosquittoServer(tmp_path)
    server.start()
    server.stop()
    reporter = Reporter(server.url, "dev1", max_buffered_events=6, merge_chunks=False)
    with reporter:
        reporter.start("s1")
        for i in range(5):
            reporter.chunk("s1", audio_ms=40, play_start_ms=1_000.0 if i == 0 else None)
        reporter.start("s2")
        reporter.end("s1")
        reporter.chunk("s2", audio_ms=40, play_start_ms=2_000.0)
        reporter.end("s2", "cancelled")
        assert reporter.stats.dropped == 4
        server.start()
        try:
            with probe(server.host, server.port, TOPIC) as watcher:
                assert reporter.flush(30)
                # The probe subscribed after the flush began: what it saw may be partial, so
                # the Reporter's own word counts, and the next messages are watched below.
                stats = reporter.stats
                reporter.start("s3")
                reporter.chunk("s3", audio_ms=40, play_start_ms=3_000.0)
                assert reporter.flush(30)
                assert watcher.wait_for(lambda seen: len(events(watcher)) >= 2)
        finally:
            server.stop()
    assert (stats.events, stats.dropped, stats.sent) == (10, 4, 6)
    assert [e["type"] for e in events(watcher)[-2:]] == ["start", "chunk"]
    assert events(watcher)[-1]["play_start_ms"] == 3_000.0


def test_overflow_keeps_start_and_end_on_the_wire(tmp_path: Path) -> None:
    """The same overflow seen by a watcher that was there all along (a persistent session the
    broker queues for): starts and ends all arrive, the surviving chunks are the newest."""
    server = MosquittoServer(tmp_path, persistence=True)
    server.start()
    try:
        with probe(server.host, server.port, TOPIC, session="overflow-watch") as watcher:
            server.stop()
            with Reporter(server.url, "dev1", max_buffered_events=4, merge_chunks=False) as r:
                r.start("s")
                for _ in range(6):
                    r.chunk("s", audio_ms=40)
                r.end("s")
                server.start()
                assert r.flush(30)
            assert watcher.wait_for(lambda seen: len(events(watcher)) >= 4, 30)
    finally:
        server.stop()
    seen = events(watcher)
    assert [e["type"] for e in seen] == ["start", "chunk", "chunk", "end"]
    assert [e.get("seq") for e in seen] == [None, 4, 5, None]


def test_two_reporters_of_one_device_keep_their_sessions(mosquitto_broker: Broker) -> None:
    """Two Reporters for one device in one process (default client ids) both stay connected
    and both deliver: the default is a clean session with a unique client id."""
    broker = mosquitto_broker
    topic = broker.topic("dev1", "events")
    with probe(broker.host, broker.port, topic) as watcher:
        with broker.reporter("dev1") as one, broker.reporter("dev1") as two:
            assert one.wait_connected(15)
            assert two.wait_connected(15)
            one.chunk("one", audio_ms=40)
            two.chunk("two", audio_ms=40)
            assert one.flush(15)
            assert two.flush(15)
            assert (one.stats.connects, two.stats.connects) == (1, 1)
        assert watcher.wait_for(lambda seen: len(events(watcher, topic)) >= 2)
    assert {e["stream"] for e in events(watcher, topic)} == {"one", "two"}


def test_an_unreachable_broker_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    """A Reporter whose broker is unreachable logs ONE warning naming the broker, however many
    attempts fail; `wait_connected` says False when its time is up; an unopened Reporter's
    first call opens it (and says so)."""
    caplog.set_level(logging.DEBUG, logger="edgemon.client")
    port = free_port()
    reporter = Reporter(f"mqtt://127.0.0.1:{port}", "dev1")
    try:
        reporter.chunk("s", audio_ms=40)  # never opened: this opens it
        assert not reporter.wait_connected(2.5)  # at least two attempts (1 s apart, then 2 s)
        deadline = time.monotonic() + 30
        while sum("Connection failed" in r.message for r in caplog.records) < 2:
            assert time.monotonic() < deadline, [r.message for r in caplog.records]
            time.sleep(0.05)
    finally:
        reporter.close(0.1)
    warnings = [r.message for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert f"127.0.0.1:{port}" in warnings[0]
    assert any("opened by its first call" in r.message for r in caplog.records)


def test_exiting_without_close_loses_nothing(mosquitto_broker: Broker, tmp_path: Path) -> None:
    """A player that exits right after `end()` without `close()` still delivers the `end`:
    the Reporter flushes at interpreter exit."""
    broker = mosquitto_broker
    topic = broker.topic("dev1", "events")
    script = tmp_path / "player.py"
    script.write_text(
        textwrap.dedent(
            f"""
            from edgemon.client import Reporter
            reporter = Reporter(
                "{broker.url}", "dev1", topic_prefix="{broker.prefix}", flush_ms=60_000
            ).open()
            reporter.chunk("s", audio_ms=40)
            reporter.end("s")
            """
        ),
        encoding="utf-8",
    )
    with probe(broker.host, broker.port, topic) as watcher:
        subprocess.run([sys.executable, str(script)], check=True, timeout=60)
        assert watcher.wait_for(lambda seen: len(events(watcher, topic)) >= 2)
    assert [e["type"] for e in events(watcher, topic)] == ["chunk", "end"]
