"""The README's player example, run as written against a local HTTP server that streams PCM
the way a TTS server does (a 320 ms chunk every 320 ms, each written in two pieces a few
milliseconds apart, so `read1()` returns them separately), reporting to `edgemon run`.

edgemon must see the server's rhythm: its chunk gaps within 10 % of 320 ms (the Reporter
merges the pieces of one chunk; a piece it could not merge is no gap to edgemon), and the
healthy stream is never throttled (the example prebuffers and says so with `play_start_ms`)."""

from __future__ import annotations

import itertools
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from edgemon.client import Reporter
from edgemon.engine.stream import BURST_GAP_MS

from mqtt_probe import probe
from processes import edgemon_run, poll, samples

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parent.parent / "README.md"
INTERVAL_MS = 320.0
CHUNKS = 12
CHUNK_BYTES = 15_360  # 320 ms of s16le 24 kHz mono
FIRST_PIECE = 8_192
SPLIT_S = 0.003


def player_example() -> str:
    """The first Python block of the README's "The player: `Reporter`" section."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("### The player: `Reporter`") :]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None
    return match.group(1)


class PacedPcm(BaseHTTPRequestHandler):
    """`POST /v1/audio/speech`: CHUNKS chunks of silence, one every INTERVAL_MS, each in two
    writes SPLIT_S apart; the response ends with the connection (no length)."""

    protocol_version = "HTTP/1.0"

    def do_POST(self) -> None:
        """Stream the chunks on their schedule."""
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        started = time.monotonic()
        for i in range(CHUNKS):
            delay = started + i * INTERVAL_MS / 1000 - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # the server's pacing, not a wait before an assertion
            self.wfile.write(b"\0" * FIRST_PIECE)
            self.wfile.flush()
            time.sleep(SPLIT_S)
            self.wfile.write(b"\0" * (CHUNK_BYTES - FIRST_PIECE))
            self.wfile.flush()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        """Quiet."""


def test_readme_example_gives_edgemon_the_servers_rhythm(
    mosquitto_broker: tuple[str, int], tmp_path: Path
) -> None:
    """Every chunk gap edgemon observes is within 10 % of the server's 320 ms interval, the
    audio is all counted, and the healthy stream never throttles its device."""
    host, port = mosquitto_broker
    server = ThreadingHTTPServer(("127.0.0.1", 0), PacedPcm)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    namespace: dict[str, Any] = {}
    exec(compile(player_example(), str(README), "exec"), namespace)
    played = bytearray()
    try:
        with (
            edgemon_run(port, tmp_path) as http,
            probe(host, port, "edgemon/v1/kitchen-speaker/events") as watcher,
        ):
            with Reporter(
                f"mqtt://{host}:{port}", "kitchen-speaker", audio_format=namespace["QWEN_PCM"]
            ) as reporter:
                namespace["speak"](
                    reporter, "req-42", "Hello!", play=played.extend,
                    port=server.server_address[1],
                )  # fmt: skip
                assert reporter.flush(30)
                stats = reporter.stats
            device = (("device", "kitchen-speaker"),)
            chunks = stats.events - 2  # all but the start and the end
            assert poll(lambda: samples(http, "edgemon_chunks_total").get(device) == chunks)
            gaps = {
                dict(labels)["le"]: value
                for labels, value in samples(http, "edgemon_chunk_gap_seconds_bucket").items()
                if dict(labels)["device"] == "kitchen-speaker"
            }
            gap_sum = samples(http, "edgemon_chunk_gap_seconds_sum")[device]
            audio = samples(http, "edgemon_audio_seconds_total")[device]
            engagements = samples(http, "edgemon_throttle_engagements_total")[device]
    finally:
        server.shutdown()
        server.server_close()
    assert len(played) == CHUNKS * CHUNK_BYTES
    assert stats.conflicts == {}
    assert audio == pytest.approx(CHUNKS * INTERVAL_MS / 1000)
    # Pieces the Reporter could not merge (the second one came after the flush window: how
    # many depends on the machine's timing) are one event each beyond the server's chunks,
    # and each is a gap under 25 ms, which edgemon's estimate skips (BURST_GAP_MS); the
    # deliveries are one gap each, together spanning the stream.
    pieces = gaps["0.025"]
    assert pieces == chunks - CHUNKS
    assert gaps["+Inf"] - pieces == CHUNKS - 1
    assert gaps["0.2"] == pieces  # no delivery gap under 200 ms
    assert gap_sum / (CHUNKS - 1) == pytest.approx(INTERVAL_MS / 1000, rel=0.1)
    assert engagements == 0
    # Each gap edgemon's estimate takes (docs/semantics.md: 20 ms apart or more), from the
    # chunks as they were on the wire: within 10 % of the server's interval.
    times = [e["t_ms"] for m in watcher.seen for e in m.json() if e["type"] == "chunk"]
    gaps_ms = [b - a for a, b in itertools.pairwise(times) if b - a >= BURST_GAP_MS]
    assert len(gaps_ms) == CHUNKS - 1
    assert all(abs(gap - INTERVAL_MS) <= 0.1 * INTERVAL_MS for gap in gaps_ms), gaps_ms
