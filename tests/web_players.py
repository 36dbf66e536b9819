"""The web players' tier (`make test-browser`), written once for its tests and its benchmark:
real speech made at test time, the test server that streams it on a schedule, the Python
`Reporter` playing the same stream, and the test player run in Debian's headless Chromium.

- `speech(directory)`: a sentence spoken by espeak-ng, as PCM s16le mono (22,050 Hz).
- `paced(chunks, ...)`: a TTS engine's delivery: the first `lead` chunks at once after the
  time to first audio, then one chunk per chunk of audio (real time), a chunk held back when
  asked (the chunks due meanwhile arrive with it, as after a network stall).
- `PageServer`: aiohttp serving the test player (clients/js/test/page), the built bundle,
  `/plan.json` and each stream on its schedule, as frames (u32 length, u8 final, bytes). Every
  request of one stream shares the schedule's start, so two players that ask a few
  milliseconds apart get each chunk at the same instant: the same trace. `isolated`: every
  response says COOP `same-origin` and COEP `require-corp`, so the page is cross-origin
  isolated (its Reporter hands its calls to its worker through shared memory).
- `python_player`: what a Python player does with the same stream: `start` at the request,
  `chunk(pcm_bytes=...)` at each arrival.
- `run_chromium`: clients/js/test/drive.mjs (puppeteer-core) on a page URL; its JSON.
"""

from __future__ import annotations

import asyncio
import functools
import json
import shutil
import socket
import struct
import subprocess
import wave
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from tools import require_tool

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping, Sequence

    from edgemon.client import Reporter

ROOT = Path(__file__).resolve().parent.parent
JS = ROOT / "clients" / "js"
PAGE = JS / "test" / "page"
BUNDLE = JS / "dist" / "edgemon-reporter.min.js"
#: The bundle's worker (the Reporter's core and its MQTT client), served next to it.
WORKER_BUNDLE = JS / "dist" / "edgemon-reporter-worker.min.js"
DRIVER = JS / "test" / "drive.mjs"
CHROMIUM = "/usr/bin/chromium"
#: What espeak-ng says (about 4.7 s of speech at its default rate).
SENTENCE = "Streaming speech reaches the player in chunks, and edgemon hears when each one arrived."
#: One chunk of audio: a codec frame of the TTS engines edgemon serves (12.5 chunks a second).
CHUNK_MS = 80
FRAME_HEADER = struct.Struct("<IB")


@dataclass(frozen=True, slots=True)
class Speech:
    """Mono PCM s16le at `rate` Hz."""

    pcm: bytes
    rate: int

    @property
    def audio_format(self) -> str:
        """The format as the Reporter takes it."""
        return f"s16le:{self.rate}:1"

    def chunks(self, chunk_ms: int = CHUNK_MS) -> list[bytes]:
        """The audio cut into chunks of `chunk_ms` (the last one shorter)."""
        size = self.rate * chunk_ms // 1000 * 2
        return [self.pcm[i : i + size] for i in range(0, len(self.pcm), size)]


def speech(directory: Path) -> Speech:
    """`SENTENCE` spoken by espeak-ng into `directory/speech.wav`."""
    wav = directory / "speech.wav"
    subprocess.run([require_tool("espeak-ng"), "-w", str(wav), SENTENCE], check=True, timeout=60)
    with wave.open(str(wav), "rb") as audio:
        assert (audio.getnchannels(), audio.getsampwidth()) == (1, 2), "espeak-ng: mono s16"
        return Speech(audio.readframes(audio.getnframes()), audio.getframerate())


def mp3_chunks(directory: Path, frames_per_chunk: int = 3) -> tuple[list[bytes], float]:
    """`directory/speech.wav` encoded by lame (CBR, no tag frame) and cut at MP3 frame
    boundaries, `frames_per_chunk` frames a chunk: (chunks, the audio of one chunk in ms)."""
    mp3 = directory / "speech.mp3"
    subprocess.run(
        [
            require_tool("lame"),
            "--quiet",
            "-t",
            "--cbr",
            "-b",
            "32",
            str(directory / "speech.wav"),
            str(mp3),
        ],
        check=True,
        timeout=60,
    )
    data = mp3.read_bytes()
    frames, rate, samples = _mp3_frames(data)
    chunks = [
        b"".join(frames[i : i + frames_per_chunk]) for i in range(0, len(frames), frames_per_chunk)
    ]
    return chunks, frames_per_chunk * samples * 1000 / rate


#: MPEG-1 and MPEG-2 Layer III: bit rates (kbit/s) by index, sample rates by index.
_BITRATES = {
    3: (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    2: (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
_RATES = {3: (44_100, 48_000, 32_000), 2: (22_050, 24_000, 16_000)}


def _mp3_frames(data: bytes) -> tuple[list[bytes], int, int]:
    """The MPEG Layer III frames of `data`: (frames, sample rate, samples per frame)."""
    frames: list[bytes] = []
    at = data.find(b"\xff")
    rate = samples = 0
    while at + 4 <= len(data):
        header = int.from_bytes(data[at : at + 4], "big")
        assert header >> 21 == 0x7FF, f"no MP3 frame at byte {at}"
        version = (header >> 19) & 3
        rate = _RATES[version][(header >> 10) & 3]
        bitrate = _BITRATES[version][(header >> 12) & 15] * 1000
        padding = (header >> 9) & 1
        samples = 1152 if version == 3 else 576
        size = samples // 8 * bitrate // rate + padding
        frames.append(data[at : at + size])
        at += size
    return frames, rate, samples


@dataclass(frozen=True, slots=True)
class Schedule:
    """When each chunk is sent, in ms from the stream's first request."""

    chunks: Sequence[bytes]
    at_ms: Sequence[float]


def paced(
    chunks: Sequence[bytes],
    *,
    first_ms: float = 200.0,
    lead: int = 4,
    chunk_ms: float = CHUNK_MS,
    withhold: Mapping[int, float] | None = None,
) -> Schedule:
    """Chunks 0…`lead`−1 at `first_ms`, then one every `chunk_ms`; chunk i of `withhold`
    held back `withhold[i]` ms, and the chunks due meanwhile come with it (a stall: what was
    held arrives at once), the pace going on after them as before."""
    delays = withhold or {}
    at: list[float] = []
    held_until = 0.0
    for index in range(len(chunks)):
        due = first_ms + max(0, index - lead + 1) * chunk_ms
        if index in delays:
            held_until = due + delays[index]
        at.append(max(due, held_until))
    return Schedule(chunks, at)


@dataclass(slots=True)
class PageServer:
    """The test player's server (see the module docstring); `url` once started."""

    plan: dict[str, Any]
    schedules: dict[str, Schedule]
    isolated: bool = False
    port: int = 0
    requested: dict[str, asyncio.Event] = field(default_factory=dict)
    _bases: dict[str, float] = field(default_factory=dict)
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        """The page's address."""
        return f"http://127.0.0.1:{self.port}/"

    async def start(self) -> None:
        """Serve on a free port of 127.0.0.1."""
        for bundle in (BUNDLE, WORKER_BUNDLE):
            assert bundle.is_file(), f"{bundle} is missing: build it (`make test-browser` does)"
        for name in self.schedules:
            self.requested[name] = asyncio.Event()
        files = {
            "/": (PAGE / "index.html", "text/html"),
            "/player.js": (PAGE / "player.js", "text/javascript"),
            "/edgemon-reporter.min.js": (BUNDLE, "text/javascript"),
            "/edgemon-reporter-worker.min.js": (WORKER_BUNDLE, "text/javascript"),
        }
        app = web.Application()
        if self.isolated:
            app.on_response_prepare.append(_isolate)
        for route, (path, kind) in files.items():
            app.router.add_get(route, _serve(path.read_bytes(), kind))
        app.router.add_get("/plan.json", self._plan)
        app.router.add_get("/audio/{name}", self._audio)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        listening = socket.socket()
        listening.bind(("127.0.0.1", 0))
        self.port = listening.getsockname()[1]
        await web.SockSite(self._runner, listening).start()

    async def stop(self) -> None:
        """Stop serving."""
        if self._runner is not None:
            await self._runner.cleanup()

    async def _plan(self, _request: web.Request) -> web.Response:
        return web.json_response(self.plan)

    async def _audio(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        schedule = self.schedules[name]
        loop = asyncio.get_running_loop()
        base = self._bases.setdefault(name, loop.time())
        self.requested[name].set()
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await response.prepare(request)
        last = len(schedule.chunks) - 1
        for index, (chunk, at_ms) in enumerate(zip(schedule.chunks, schedule.at_ms, strict=True)):
            delay = base + at_ms / 1000 - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await response.write(FRAME_HEADER.pack(len(chunk), index == last) + chunk)
        await response.write_eof()
        return response


async def _isolate(_request: web.Request, response: web.StreamResponse) -> None:
    """Make the page cross-origin isolated (each response, before its headers go out)."""
    response.headers["Cross-Origin-Opener-Policy"] = "same-origin"
    response.headers["Cross-Origin-Embedder-Policy"] = "require-corp"


def _serve(body: bytes, kind: str) -> Any:
    async def handler(_request: web.Request) -> web.Response:
        return web.Response(body=body, content_type=kind)

    return handler


async def frames(response: aiohttp.ClientResponse) -> AsyncIterator[tuple[bytes, bool]]:
    """The frames of a stream as they arrive: (bytes, final)."""
    while True:
        try:
            header = await response.content.readexactly(FRAME_HEADER.size)
        except asyncio.IncompleteReadError:
            return
        size, final = FRAME_HEADER.unpack(header)
        yield await response.content.readexactly(size), bool(final)


async def python_player(reporter: Reporter, url: str, stream: str, audio_format: str) -> int:
    """Play `url` as a Python player reports it: `start` at the request (a `rebuffer`
    player, as the web player), each chunk when it arrived. The number of chunks."""
    count = 0
    async with aiohttp.ClientSession() as session:
        reporter.start(stream, player="rebuffer")
        async with session.get(url) as response:
            async for data, final in frames(response):
                reporter.chunk(stream, pcm_bytes=len(data), audio_format=audio_format, final=final)
                count += 1
    return count


def require_browser() -> tuple[str, str]:
    """node and Chromium, and the package's node modules (`npm ci` in clients/js)."""
    node = require_tool("node")
    chromium = require_tool("chromium")
    assert (JS / "node_modules" / "puppeteer-core").is_dir(), (
        f"{JS}/node_modules is missing: run `npm ci` there (`make test-browser` does)"
    )
    return node, chromium


@functools.cache
def node_command() -> list[str]:
    """Node, with the WHATWG WebSocket the Reporter's link uses: Node has it from 22 on, 20
    behind a flag."""
    node, _ = require_browser()
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True)
    major = int(version.stdout.strip().lstrip("v").split(".")[0])
    return [node] if major >= 22 else [node, "--experimental-websocket"]


async def run_chromium(url: str, out: Path, *, timeout_s: float = 120.0) -> dict[str, Any]:
    """The test player at `url` in headless Chromium (drive.mjs): its JSON (`result`,
    `phases`, `console`); AssertionError with the page's console if it failed."""
    node, _ = require_browser()
    process = await asyncio.create_subprocess_exec(
        node, str(DRIVER), url, str(out), "--timeout-s", str(int(timeout_s)),
        cwd=str(JS), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await asyncio.wait_for(process.communicate(), timeout_s + 60)
    report: dict[str, Any] = await asyncio.to_thread(_read_report, out)
    result = report.get("result") or {}
    failed = (
        f"the test player failed ({process.returncode}): {result.get('error')}\n"
        f"console: {report.get('console')}\n{output.decode(errors='replace')}"
    )
    assert process.returncode == 0, failed
    assert "error" not in result, failed
    return report


def _read_report(path: Path) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    return report


def espeak_available() -> bool:
    """Whether espeak-ng is installed (the benchmark checks before it starts anything)."""
    return shutil.which("espeak-ng") is not None
