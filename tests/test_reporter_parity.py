"""Parity (issue 41's target): the same trace of calls replayed through the Python `Reporter`
and through edgemon-reporter (clients/js, run by Node: clients/js/test/replay.mjs) gives
byte-identical events on the wire, through a real Mosquitto.

The trace exercises what could set the two apart: PCM byte counts that end inside a frame (the
partial frame carried), audio given in ms that no double holds exactly (the exact total),
PCM and ms mixed in one stream, pieces within one flush window (merged, `eta_ms` kept as the
same instant), `play_start_ms` on a start and on a chunk, a number Python writes with an
exponent (`1e-05`), a time near 2^53, a non-ASCII reason (escaped), a chunk after `end()`
(a conflict: nothing sent) and an `end()` after a final chunk (nothing sent). Both Reporters
read the trace's `t_ms` from their clock and are called at the trace's instants (`at_ms`,
real time: merging and batching follow the calls' spacing). Normalising: the device ids differ
(they are in the topic, not in the events); stream ids and clocks are the trace's own.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from typing import TYPE_CHECKING, Any

import aiomqtt
import pytest

from edgemon.client import Reporter

from brokers import Broker, MosquittoStartError, end_process, launch_mosquitto, ws_listener
from tools import require_tool
from web_players import JS, node_command

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = [pytest.mark.integration, pytest.mark.slow]

T = 1_700_000_000_000.0
FORMAT = "s16le:22050:1"
#: (at_ms, t_ms, call, stream, options): at_ms real time from the replay's start.
TRACE: list[tuple[float, float, str, str, dict[str, Any]]] = [
    (0, T, "start", "s1", {"play_start_ms": T + 400.0, "margin_ms": 120.0, "player": "rebuffer"}),
    (50, T + 100.25, "chunk", "s1", {"pcm_bytes": 3529, "eta_ms": 80.5}),
    (51, T + 100.75, "chunk", "s1", {"pcm_bytes": 3527}),
    (150, T + 183.0, "chunk", "s2", {"audio_ms": 83.33333333333333}),
    (250, T + 263.5, "chunk", "s2", {"audio_ms": 0.1}),
    (350, T + 343.0, "chunk", "s2", {"audio_ms": 0.2, "eta_ms": 1e-05}),
    (450, T + 420.0, "chunk", "s1", {"pcm_bytes": 3528, "play_start_ms": T + 410.5}),
    (550, T + 500.0, "end", "s2", {"reason": "annulé ✓"}),
    (570, T + 520.0, "chunk", "s2", {"audio_ms": 80.0}),
    (650, T + 600.0, "chunk", "s1", {"audio_ms": 80.0, "final": True}),
    (750, T + 700.0, "start", "s3", {}),
    (752, T + 701.0, "end", "s3", {"reason": "cancelled"}),
    (850, T + 800.0, "end", "s1", {"reason": "completed"}),
    (950, 9_007_199_254_740_000.0, "chunk", "s4", {"audio_ms": 40.0, "final": True}),
]
FLUSH_MS = 20.0


def events(payloads: list[bytes]) -> list[str]:
    """Each event of the JSON arrays, as the bytes it was written with."""
    decoder = json.JSONDecoder()
    texts: list[str] = []
    for payload in payloads:
        text = payload.decode()
        assert text.startswith("["), text
        assert text.endswith("]"), text
        at = 1
        while at < len(text) - 1:
            _, end = decoder.raw_decode(text, at)
            texts.append(text[at:end])
            at = end + 1  # the comma
    return texts


def replay_python(url: str, device: str) -> None:
    """The trace through the Python Reporter."""
    now = [0.0]
    reporter = Reporter(url, device, flush_ms=FLUSH_MS, audio_format=FORMAT, clock=lambda: now[0])
    try:
        assert reporter.wait_connected(10)
        start = time.monotonic()
        for at_ms, t_ms, call, stream, options in TRACE:
            time.sleep(max(0.0, start + at_ms / 1000 - time.monotonic()))
            now[0] = t_ms
            if call == "start":
                reporter.start(stream, **options)
            elif call == "chunk":
                reporter.chunk(stream, **options)
            else:
                reporter.end(stream, **options)
        assert reporter.flush(10)
    finally:
        reporter.close()


@pytest.fixture
def web_broker(tmp_path: Path) -> Iterator[tuple[Broker, str]]:
    """A Mosquitto of the test's own: its plain listener, and the ws:// URL of its WebSocket
    one (the JS Reporter speaks MQTT over WebSocket only)."""
    require_tool("mosquitto")
    try:
        process, (port, ws) = launch_mosquitto(tmp_path, ws_listener, listeners=2)
    except MosquittoStartError as error:
        pytest.fail(str(error))
    try:
        yield Broker("127.0.0.1", port), f"ws://127.0.0.1:{ws}"
    finally:
        end_process(process)


def replay_js(url: str, device: str, directory: Path) -> dict[str, Any]:
    """The trace through edgemon-reporter on Node (replay.mjs) to `url` (ws://): its stats."""
    calls = [
        {"at_ms": at, "t_ms": t, "call": call, "stream": stream, "options": options}
        for at, t, call, stream, options in TRACE
    ]
    trace = directory / "trace.json"
    trace.write_text(json.dumps({
        "broker": url, "device": device, "flush_ms": FLUSH_MS, "audio_format": FORMAT,
        "calls": calls,
    }))  # fmt: skip
    done = subprocess.run(
        [*node_command(), str(JS / "test" / "replay.mjs"), str(trace)],
        cwd=JS, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.mark.asyncio
async def test_both_reporters_send_the_same_events(
    web_broker: tuple[Broker, str], tmp_path: Path
) -> None:
    """The events each Reporter sent for the trace are the same, byte for byte, in the same
    order; the conflict sent nothing from either; the JS Reporter counted it (as Python's)."""
    broker, ws_url = web_broker
    host, port, url = broker.host, broker.port, broker.url
    received: dict[str, list[bytes]] = {"py-parity": [], "js-parity": []}
    # start s1, s1 (two pieces merged), 3 x s2, s1 with its play start, end s2, s1's final,
    # start and end s3, s4's final
    expected = 11
    enough = asyncio.Event()
    async with aiomqtt.Client(host, port, identifier="parity-watch") as watcher:
        await watcher.subscribe("edgemon/v1/+/events", qos=1)

        async def collect() -> None:
            async for message in watcher.messages:
                assert isinstance(message.payload, bytes)
                received[str(message.topic).split("/")[2]].append(message.payload)
                if all(len(events(payloads)) >= expected for payloads in received.values()):
                    enough.set()

        collecting = asyncio.create_task(collect())
        await asyncio.to_thread(replay_python, url, "py-parity")
        js = await asyncio.to_thread(replay_js, ws_url, "js-parity", tmp_path)
        await asyncio.wait_for(enough.wait(), 30)
        collecting.cancel()
    python, javascript = events(received["py-parity"]), events(received["js-parity"])
    assert javascript == python
    assert len(python) == expected, python
    assert js["flushed"]
    assert js["stats"]["conflicts"] == {"ended": 1}, js
    assert js["stats"]["merged"] == 1, js
