"""The web player's Reporter in a real browser (`make test-browser`): Debian's headless
Chromium, driven by puppeteer-core, plays real speech (espeak-ng, made here) streamed by the
test's server, and reports it with edgemon-reporter (clients/js, the built bundle) over the
shipped Mosquitto's wss:// listener, logged in as its device; a real `edgemon run` process
applies it. A Python `Reporter` plays the same stream at the same time (the same trace).

Four web players at once, each its own device:
- `web-under`: Web Audio (`WebAudioStream`), one chunk withheld `UNDER_DELAY_MS` while the
  player holds `LEAD_MS` of audio: one underrun, which the page measures from its schedule
  and edgemon from the arrivals. `py-under` is the Python player of the same trace. Neither
  merges the chunks that arrive together (`mergeChunks`, `merge_chunks`): their slacks are
  compared whenever edgemon has applied as many chunk events of each, which is the same audio
  only if both sent one event a chunk (merging goes by each client's own timing: a burst read
  in two pieces a few ms apart merges in one and not in the other).
- `web-pause`: Web Audio, paused `PAUSE_MS` (the context suspended) after chunk
  `PAUSE_AFTER`, then a chunk withheld `PAUSE_DELAY_MS`: more than the lead, less than the
  lead and the pause, so the listener hears no gap, and edgemon, told of the pause (its play
  start moved later), counts none; had the pause not been reported it would count one.
- `web-mse`: MP3 chunks (lame) appended to an `<audio>` element's SourceBuffer
  (`MediaElementStream`).
- `web-fallback`: Web Audio, its Reporter pointed at a worker script the server does not
  have: the worker fails to start, and the Reporter reports from the page instead.
- `web-down`: Web Audio, its Reporter pointed at a port where no broker listens: the page
  plays as the others do, and the Reporter counts its failed connections and keeps the events.

Every other Reporter reports from its Web Worker (the page's main thread only hands the calls
over, each as it is made: the page counts its `postMessage` calls around each hook call). The
whole run is made twice: on a page that is not cross-origin isolated (a message a call) and on
one that is (its chunks through shared memory).

edgemon trusts the devices' clocks (`[slack] clock = "trust"`): the page's clock
(`performance.timeOrigin + performance.now()`), the Python player's and edgemon's are this
machine's. With the default estimate, each device's clock is edgemon's less the fastest
delivery it has seen, and in a device's first second that is whatever its first few messages
took on a loaded machine (tens of ms at times, for either player): the slacks compared would
differ by that, not by anything the Reporters said.

"±1 frame" is one codec frame, a chunk of `CHUNK_MS`: the page hears the late chunk when it
has scheduled it, edgemon when it arrived, and the two differ by less than a render step.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest
from shipped_broker import launch_shipped_with_websockets

from edgemon.client import Reporter

from brokers import MosquittoStartError
from pki import make_pki
from ports import Servers, end_process, free_port, reachable
from scrapes import sample
from tools import require_tool
from web_players import (
    CHUNK_MS,
    PageServer,
    mp3_chunks,
    paced,
    python_player,
    require_browser,
    run_chromium,
    speech,
)

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PASSWORDS = {
    "edgemon": "pw-edgemon",
    "web-under": "pw-web-under",
    "web-pause": "pw-web-pause",
    "web-mse": "pw-web-mse",
    "py-under": "pw-py-under",
    "web-fallback": "pw-web-fallback",
}
#: Where `web-fallback`'s Reporter looks for its worker: nothing is served there.
MISSING_WORKER = "/no-such-worker.js"
#: The chunks sent at once before the pace sets in; what the player holds ahead then.
LEAD = 4
LEAD_MS = (LEAD - 1) * CHUNK_MS
UNDER_CHUNK, UNDER_DELAY_MS = 20, 640.0
PAUSE_AFTER, PAUSE_MS = 8, 1000
PAUSE_CHUNK, PAUSE_DELAY_MS = 25, 900.0
#: One codec frame: the tolerance on an underrun's duration.
FRAME_MS = CHUNK_MS
SLACK_TOLERANCE_MS = 20.0
DEADLINE_S = 90.0
POLL_S = 0.02


@dataclass(frozen=True, slots=True)
class WebRun:
    """What one run of the three web players and the Python player left."""

    streams: dict[str, dict[str, Any]]  # device -> the page's result for its stream
    metrics: str  # edgemon's /metrics at the end
    sent: dict[str, int]  # device -> chunks the server sent it
    audio_ms: dict[str, float]  # device -> the audio of those chunks
    events: dict[str, int]  # device -> chunk events its Reporter sent (pieces merged)
    python_chunks: int
    slack: list[tuple[int, float, float]]  # (chunks, web slack, Python slack) at equal chunks
    console: list[str]  # the page's console
    down: dict[str, Any]  # the page's result for web-down's stream (no broker)
    isolated: bool  # the page was cross-origin isolated: calls through shared memory


def test_the_schedules_force_what_they_are_meant_to() -> None:
    """The withheld chunk outlasts the lead (an underrun); the paused stream's withheld chunk
    outlasts the lead alone (an underrun, were the pause not reported) but not the lead and
    the pause; the pause is over before that chunk is due."""
    assert UNDER_DELAY_MS > LEAD_MS + 2 * FRAME_MS
    assert LEAD_MS + FRAME_MS < PAUSE_DELAY_MS < LEAD_MS + PAUSE_MS - FRAME_MS
    assert (PAUSE_CHUNK - PAUSE_AFTER) * CHUNK_MS > PAUSE_MS + 2 * FRAME_MS


@pytest.fixture(scope="module", params=[False, True], ids=["messages", "shared-memory"])
def web_run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WebRun]:
    """The whole run, once for the module's tests on a page that is not cross-origin
    isolated (a message a call to the Reporters' workers) and once on one that is (shared
    memory): broker, `edgemon run`, page server, Chromium and the Python player."""
    isolated: bool = request.param
    require_browser()
    require_tool("mosquitto", "mosquitto_passwd", "openssl", "espeak-ng", "lame")
    directory = tmp_path_factory.mktemp("web")
    pki = make_pki(directory)
    try:
        broker, port, wss_port = launch_shipped_with_websockets(
            directory, PASSWORDS, cert=pki.server_cert, key=pki.server_key
        )
    except MosquittoStartError as error:
        pytest.fail(str(error))
    servers = Servers(directory, {})
    try:
        http = free_port()
        password_file = directory / "edgemon-password"
        password_file.write_text(PASSWORDS["edgemon"], encoding="utf-8")
        config = directory / "edgemon.toml"
        config.write_text(
            f'[mqtt]\nurl = "mqtt://127.0.0.1:{port}"\nclient_id = "edgemon-web"\n'
            f'username = "edgemon"\npassword_file = "{password_file}"\n'
            f'[http]\nlisten = "127.0.0.1:{http}"\n[state]\ndir = "{directory}/state"\n'
            '[log]\nformat = "json"\n[slack]\nclock = "trust"\n',
            encoding="utf-8",
        )
        servers.spawn("edgemon", sys.executable, "-m", "edgemon", "run", "--config", str(config))
        servers.wait_until("edgemon", lambda: reachable(f"http://127.0.0.1:{http}/readyz"))
        yield asyncio.run(_play(directory, port, wss_port, http, isolated=isolated))
    finally:
        servers.stop_all()
        end_process(broker)


async def _play(directory: Path, port: int, wss_port: int, http: int, *, isolated: bool) -> WebRun:
    voice = speech(directory)
    pcm = voice.chunks()
    mp3, mp3_chunk_ms = mp3_chunks(directory)
    schedules = {
        "under": paced(pcm, lead=LEAD, withhold={UNDER_CHUNK: UNDER_DELAY_MS}),
        "pause": paced(pcm, lead=LEAD, withhold={PAUSE_CHUNK: PAUSE_DELAY_MS}),
        "mse": paced(mp3, lead=LEAD, chunk_ms=mp3_chunk_ms),
        "fallback": paced(pcm, lead=LEAD),
        "down": paced(pcm, lead=LEAD),
    }
    web: dict[str, Any] = {"kind": "webaudio", "rate": voice.rate}
    players: list[dict[str, Any]] = [
        {**web, "device": "web-under", "stream": "req-under", "path": "/audio/under",
         "mergeChunks": False},
        {**web, "device": "web-pause", "stream": "req-pause", "path": "/audio/pause",
         "pauseAfter": PAUSE_AFTER, "pauseMs": PAUSE_MS},
        {"kind": "mse", "device": "web-mse", "stream": "req-mse", "path": "/audio/mse",
         "chunkMs": mp3_chunk_ms},
        {**web, "device": "web-fallback", "stream": "req-fallback", "path": "/audio/fallback",
         "workerUrl": MISSING_WORKER},
    ]  # fmt: skip
    for player in players:
        player["password"] = PASSWORDS[player["device"]]
    # No broker there: it waits for no connection and for its flush no longer than a second.
    players.append({
        **web, "device": "web-down", "stream": "req-down", "path": "/audio/down",
        "broker": f"ws://127.0.0.1:{free_port()}", "connectWaitMs": 0, "flushWaitMs": 1000,
    })  # fmt: skip
    plan = {"broker": f"wss://127.0.0.1:{wss_port}", "streams": players, "countPosts": True}
    server = PageServer(plan, schedules, isolated=isolated)
    await server.start()
    reporter = Reporter(
        f"mqtt://127.0.0.1:{port}", "py-under", username="py-under",
        password=PASSWORDS["py-under"], merge_chunks=False,
    )  # fmt: skip
    try:
        assert reporter.wait_connected(30), "the Python player did not reach the broker"
        stop = asyncio.Event()
        poller = asyncio.create_task(_poll_slack(http, stop))
        browser = asyncio.create_task(run_chromium(server.url, directory / "page.json"))
        requested = asyncio.create_task(server.requested["under"].wait())
        await asyncio.wait({browser, requested}, timeout=DEADLINE_S, return_when="FIRST_COMPLETED")
        if browser.done() or not requested.done():  # the page failed: say why
            requested.cancel()
            await asyncio.wait_for(browser, DEADLINE_S)
            pytest.fail("the test player never asked for its stream")
        python_chunks = await python_player(
            reporter, f"{server.url}audio/under", "req-under", voice.audio_format
        )
        report = await browser
        stop.set()
        slack = await poller
        assert await asyncio.to_thread(reporter.flush, 30), "the Python player's events"
        python_events = reporter.stats.events - 1  # its start
    finally:
        reporter.close()
        await server.stop()
    streams = {result["device"]: result for result in report["result"]["streams"]}
    down = streams.pop("web-down")
    down["sent"] = len(pcm)
    sent = {"web-under": len(pcm), "web-pause": len(pcm), "web-mse": len(mp3), "py-under": len(pcm)}
    sent["web-fallback"] = len(pcm)
    speech_ms = len(voice.pcm) // 2 * 1000 / voice.rate
    audio = {"web-under": speech_ms, "web-pause": speech_ms, "web-mse": len(mp3) * mp3_chunk_ms}
    audio["py-under"] = audio["web-fallback"] = speech_ms
    events = {device: result["reporter"]["events"] - 1 for device, result in streams.items()}
    events["py-under"] = python_events
    metrics = await _settled(http, events)
    return WebRun(
        streams,
        metrics,
        sent,
        audio,
        events,
        python_chunks,
        slack,
        report["console"],
        down,
        isolated,
    )


async def _poll_slack(http: int, stop: asyncio.Event) -> list[tuple[int, float, float]]:
    """edgemon's view of both players' `req-under` every `POLL_S` until `stop`: (chunks,
    web slack, Python slack) whenever both have applied the same number of chunks."""
    both: list[tuple[int, float, float]] = []
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            async with session.get(f"http://127.0.0.1:{http}/api/v1/streams") as response:
                view = await response.json()
            seen: dict[str, tuple[int, float]] = {}
            for device in view["devices"]:
                for stream in device["streams"]:
                    if stream["phase"] == "live" and stream["slack_ms"] is not None:
                        seen[device["device"]] = (stream["chunks"], stream["slack_ms"])
            web, python = seen.get("web-under"), seen.get("py-under")
            if web and python and web[0] == python[0]:
                both.append((web[0], web[1], python[1]))
            await asyncio.sleep(POLL_S)
    return both


async def _settled(http: int, sent: dict[str, int]) -> str:
    """edgemon's /metrics once every chunk event sent is applied and every stream ended."""
    deadline = time.monotonic() + DEADLINE_S
    async with aiohttp.ClientSession() as session:
        while True:
            async with session.get(f"http://127.0.0.1:{http}/metrics") as response:
                text = await response.text()
            applied = {d: sample(text, "edgemon_chunks_total", {"device": d}) for d in sent}
            active = [sample(text, "edgemon_streams_active", {"device": d}) for d in sent]
            if all(applied[d] == n for d, n in sent.items()) and not any(active):
                return text
            if time.monotonic() > deadline:
                return text  # the tests say what is missing
            await asyncio.sleep(0.2)


def _metric(run: WebRun, name: str, device: str) -> float:
    value = sample(run.metrics, name, {"device": device})
    assert value is not None, f"no {name} for {device}"
    return value


def test_every_chunk_is_applied(web_run: WebRun) -> None:
    """edgemon applied every chunk event each Reporter sent, once, and so all the audio each
    player received (chunks that arrived together are one event: the Reporter merges them);
    the web Reporters had every event acknowledged, dropped none and counted no bad call,
    conflict or error."""
    for device, count in web_run.events.items():
        assert _metric(web_run, "edgemon_chunks_total", device) == count, device
        audio_ms = _metric(web_run, "edgemon_audio_seconds_total", device) * 1000
        assert audio_ms == pytest.approx(web_run.audio_ms[device], abs=1e-6), device
    assert web_run.python_chunks == web_run.sent["py-under"]
    for device, result in web_run.streams.items():
        stats = result["reporter"]
        assert result["flushed"], device
        assert stats["sent"] == stats["events"], (device, stats)
        assert stats["events"] - 1 + stats["merged"] == web_run.sent[device], (device, stats)
        assert (stats["dropped"], stats["invalid"], stats["errors"], stats["conflicts"]) == (
            0, 0, 0, {},
        ), (device, stats)  # fmt: skip
        assert result["hook"]["chunks"] == web_run.sent[device]


def test_the_reporters_report_from_their_worker(web_run: WebRun) -> None:
    """Each web player's Reporter made its calls through its Web Worker, through shared memory
    on the isolated page, except the one whose worker could not start: that one reports from
    the page (every chunk applied all the same, `test_every_chunk_is_applied`), counted once in
    `workerFailures` and logged once."""
    for device, result in web_run.streams.items():
        stats = result["reporter"]
        in_worker = device != "web-fallback"
        expected = (in_worker, 0 if in_worker else 1, in_worker and web_run.isolated)
        got = (stats["worker"], stats["workerFailures"], stats["sharedMemory"])
        assert got == expected, (device, stats)
    said = [line for line in web_run.console if "did not start" in line]
    assert len(said) == 1, web_run.console
    assert "web-fallback" in said[0], said


def test_each_call_is_handed_to_the_worker_in_its_own_task(web_run: WebRun) -> None:
    """Each chunk a hook reported went to its Reporter's worker in one `postMessage` made
    before the hook's call returned: nothing waits on the page for a microtask or a timer
    (an event waits for the worker's `flushMs` window, nothing more). Through shared memory,
    a chunk posts nothing, but for waking a worker that slept (a second without calls: the
    first chunk may find it asleep, and one after a held-back chunk or a pause). The Reporter
    that reports from the page posts nothing."""
    for device, result in web_run.streams.items():
        posted = result["posted"]
        assert len(posted) == web_run.sent[device], (device, posted)
        if device == "web-fallback":
            assert set(posted) == {0}, posted
        elif web_run.isolated:
            assert set(posted) <= {0, 1}, (device, posted)
            assert sum(posted) <= 3, (device, posted)
        else:
            assert set(posted) == {1}, (device, posted)


def test_a_broker_that_is_down_costs_the_page_a_counter(web_run: WebRun) -> None:
    """No broker where `web-down`'s Reporter looks: the page played the whole stream as the
    others did and nothing was thrown into it; the Reporter counted its failed connections,
    said so once, kept every event (none dropped, none sent) and reported from its worker as
    the others; edgemon heard nothing of the device."""
    down, stats = web_run.down, web_run.down["reporter"]
    assert down["hook"]["chunks"] == down["sent"]
    assert not down["flushed"]
    assert stats["connectErrors"] >= 1, stats
    assert (stats["connected"], stats["connects"], stats["sent"], stats["messages"]) == (
        False, 0, 0, 0,
    ), stats  # fmt: skip
    assert stats["events"] - 1 + stats["merged"] == down["sent"], stats
    assert stats["buffered"] == stats["events"], stats
    assert (stats["dropped"], stats["invalid"], stats["errors"]) == (0, 0, 0), stats
    assert (stats["worker"], stats["sharedMemory"]) == (True, web_run.isolated), stats
    said = [line for line in web_run.console if "web-down" in line]
    assert len(said) == 1, web_run.console
    assert "cannot reach the broker" in said[0], said
    assert not [line for line in web_run.console if line.startswith("pageerror")], web_run.console
    assert sample(web_run.metrics, "edgemon_chunks_total", {"device": "web-down"}) is None


def test_slack_is_the_python_reporters(web_run: WebRun) -> None:
    """Whenever edgemon had applied as many chunks of the web player's stream as of the
    Python player's (the same trace), the two slacks were within `SLACK_TOLERANCE_MS`: the
    page's clock, its play start and its chunks' audio are what the Python client says."""
    assert len(web_run.slack) >= 20, web_run.slack
    worst = max(web_run.slack, key=lambda s: abs(s[1] - s[2]))
    print(f"slack: {len(web_run.slack)} samples, worst difference {worst[1] - worst[2]:+.1f} ms")
    assert abs(worst[1] - worst[2]) <= SLACK_TOLERANCE_MS, worst


def test_a_withheld_chunk_is_one_underrun_of_its_length(web_run: WebRun) -> None:
    """The withheld chunk made one underrun: the page measured it from its schedule, edgemon
    counted it in `edgemon_underruns_total` with the duration the page heard (±1 frame), and
    the same as for the Python player of the same trace."""
    hook = web_run.streams["web-under"]["hook"]
    assert hook["underruns"] == 1, hook
    assert _metric(web_run, "edgemon_underruns_total", "web-under") == 1
    web_ms = _metric(web_run, "edgemon_underrun_seconds_total", "web-under") * 1000
    python_ms = _metric(web_run, "edgemon_underrun_seconds_total", "py-under") * 1000
    page_ms = hook["underrunMs"]
    print(f"underrun: page {page_ms:.1f} ms, edgemon {web_ms:.1f} ms, Python {python_ms:.1f} ms")
    assert abs(web_ms - hook["underrunMs"]) <= FRAME_MS, (web_ms, hook)
    assert abs(web_ms - python_ms) <= FRAME_MS, (web_ms, python_ms)
    assert abs(web_ms - (UNDER_DELAY_MS - LEAD_MS)) <= 2 * FRAME_MS, web_ms


def test_a_pause_is_a_pause_not_an_underrun(web_run: WebRun) -> None:
    """The paused stream: the page counted one pause of at least `PAUSE_MS` and no underrun;
    edgemon, told of the pause by the play start it moved, counted no underrun, although
    the chunk withheld after it outlasted the lead (`test_the_schedules_...`)."""
    hook = web_run.streams["web-pause"]["hook"]
    assert (hook["pauses"], hook["underruns"]) == (1, 0), hook
    assert hook["pausedMs"] >= PAUSE_MS, hook
    assert _metric(web_run, "edgemon_underruns_total", "web-pause") == 0
    assert _metric(web_run, "edgemon_underrun_seconds_total", "web-pause") == 0


def test_the_media_element_player_reports_its_play_start(web_run: WebRun) -> None:
    """The MSE player: every chunk applied (above), its start at the request, and its play
    start, read from the element's clock, reported: edgemon measured one start silence."""
    hook = web_run.streams["web-mse"]["hook"]
    assert hook["playStartMs"] is not None, hook
    count = sample(web_run.metrics, "edgemon_start_silence_seconds_count", {"device": "web-mse"})
    assert count == 1
