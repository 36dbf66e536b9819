"""The README's player example, run as written against a local HTTP server that streams PCM
the way a TTS server does (a 320 ms chunk every 320 ms, each written in two pieces a few
milliseconds apart, so `read1()` returns them separately), reporting to `edgemon run`.

edgemon must see the rhythm the player saw: each chunk stamped at the instant the player got
it, after the server sent it and before the player played it (the Reporter merges the pieces of
one chunk; a piece it could not merge is no gap to edgemon), and the healthy stream is never
throttled (the example prebuffers and says so with `play_start_ms`). No bound on the machine's
speed: a loaded machine delivers late, and edgemon must see exactly that lateness."""

from __future__ import annotations

import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from mqtt_probe import probe
from processes import edgemon_run, poll, samples

if TYPE_CHECKING:
    from brokers import Broker

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parent.parent / "README.md"
INTERVAL_MS = 320.0
CHUNKS = 12
CHUNK_BYTES = 15_360  # 320 ms of s16le 24 kHz mono
BYTES_PER_MS = 48
FIRST_PIECE = 8_192
SPLIT_S = 0.003


def player_example() -> str:
    """The first Python block of the README's "The player: `Reporter`" section."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("### The player: `Reporter`") :]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None
    return match.group(1)


class PacedServer(ThreadingHTTPServer):
    """The TTS server: `sent` holds when each chunk's first write began (wall ms),
    `request_ids` each request's `X-Request-Id`."""

    sent: list[float]
    request_ids: list[str | None]


class PacedPcm(BaseHTTPRequestHandler):
    """`POST /v1/audio/speech`: CHUNKS chunks of silence, one every INTERVAL_MS, each in two
    writes SPLIT_S apart; the response ends with the connection (no length)."""

    server: PacedServer

    protocol_version = "HTTP/1.0"

    def do_POST(self) -> None:
        """Stream the chunks on their schedule."""
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.request_ids.append(self.headers.get("X-Request-Id"))
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        started = time.monotonic()
        for i in range(CHUNKS):
            delay = started + i * INTERVAL_MS / 1000 - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # the server's pacing, not a wait before an assertion
            self.server.sent.append(time.time() * 1000)
            self.wfile.write(b"\0" * FIRST_PIECE)
            self.wfile.flush()
            time.sleep(SPLIT_S)
            self.wfile.write(b"\0" * (CHUNK_BYTES - FIRST_PIECE))
            self.wfile.flush()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        """Quiet."""


def test_readme_example_gives_edgemon_the_servers_rhythm(
    mosquitto_broker: Broker, tmp_path: Path
) -> None:
    """Each chunk reaches edgemon stamped between the server's sending it and the player's
    playing it, one gap per chunk (the pieces merged or too close to count), edgemon's gaps
    adding up to the span the wire shows; the audio is all counted, and the healthy stream
    never throttles its device."""
    broker = mosquitto_broker
    server = PacedServer(("127.0.0.1", 0), PacedPcm)
    server.sent = []
    server.request_ids = []
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    namespace: dict[str, Any] = {}
    exec(compile(player_example(), str(README), "exec"), namespace)
    played = bytearray()
    handed: list[tuple[int, float]] = []  # (offset of the bytes in the stream, wall ms)

    def play(pcm: bytes) -> None:
        handed.append((len(played), time.time() * 1000))
        played.extend(pcm)

    try:
        with (
            edgemon_run(broker, tmp_path) as http,
            probe(broker.host, broker.port, broker.topic("kitchen-speaker", "events")) as watcher,
        ):
            with broker.reporter("kitchen-speaker", audio_format=namespace["QWEN_PCM"]) as reporter:
                namespace["speak"](
                    reporter, "req-42", "Hello!", play=play,
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
    assert server.request_ids == ["req-42"]  # the slack feed's stream is the request's id
    assert stats.conflicts == {}
    assert audio == pytest.approx(CHUNKS * INTERVAL_MS / 1000)
    assert engagements == 0
    # The chunks as they were on the wire. Pieces the Reporter could not merge (the second
    # came after its flush window: how many depends on the machine's timing) are events of
    # their own, starting inside a server chunk; edgemon counts one gap per event after the
    # first. A merged event is stamped with its last piece's arrival. So each chunk's event
    # (the one starting at the chunk's offset in the stream) is stamped after the server
    # began sending the chunk and no later than the player was handed the event's last
    # piece: edgemon's gaps are the player's own.
    events = [e for m in watcher.seen for e in m.json() if e["type"] == "chunk"]
    times = [e["t_ms"] for e in events]
    spans = {  # the event's bytes in the stream (48 bytes a millisecond) and its stamp
        round((e["audio_total_ms"] - e["audio_ms"]) * BYTES_PER_MS): (
            round(e["audio_total_ms"] * BYTES_PER_MS),
            e["t_ms"],
        )
        for e in events
    }
    assert len(events) == chunks
    assert gaps["+Inf"] == chunks - 1
    assert sorted(offset for offset in spans if offset % CHUNK_BYTES == 0) == [
        i * CHUNK_BYTES for i in range(CHUNKS)
    ]
    for i, sent_ms in enumerate(server.sent):
        end, stamped = spans[i * CHUNK_BYTES]
        last_piece_ms = max(ms for offset, ms in handed if offset < end)
        assert sent_ms <= stamped <= last_piece_ms, (i, sent_ms, stamped, last_piece_ms)
    assert gap_sum == pytest.approx((times[-1] - times[0]) / 1000)
