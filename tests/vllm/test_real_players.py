"""The real engine's players against vLLM's OpenAI server as `benchmarks/real_engine.py`
starts it (`_real_server.VllmServer`), on the benchmark's tiny generated model (no EOS token,
`_real_model.py`), with vLLM's own admission flags (`queued:1:2`: `--max-num-seqs 1
--max-num-queued-reqs 2`): a stream runs until its client closes it, a client that closes
its stream frees its seat at once, and vLLM's 503 is what the players count `shed`. Its
engine logs each request it adds (`--enable-log-requests`), by the name vLLM gives it from
the player's `X-Request-Id`. The scenarios' listeners, from fixed plans: a pause holds the
player and moves the play start it reports; a Wi-Fi stall holds the chunks back until its end.

Measured by the engine's own counters (`/metrics`: tokens generated, admission refusals) and
log, never by the wall clock; the listeners' times are the players' own."""

from __future__ import annotations

import asyncio
import json
import math
import re
import urllib.request
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import pytest

pytest.importorskip("vllm.entrypoints.openai.api_server", exc_type=ImportError)
pytest.importorskip("transformers")

import aiohttp
from _real_model import write_model
from _real_players import Listeners, Streams, generous_cap, request_body, wall_ms
from _real_server import MODEL_NAME, VllmServer, server_options

from edgemon.protocol import NOT_STARTED_MS
from edgemon.simulate.listeners import ListenerPlan
from edgemon.simulate.profiles import CPU_VLLM
from edgemon.simulate.scenarios import RequestSource
from edgemon.simulate.workload import Request

from scrapes import total

if TYPE_CHECKING:
    from collections.abc import Iterator

    from edgemon.simulate.realtime import Reporting

pytestmark = [pytest.mark.integration, pytest.mark.slow]

T = 120.0  # generous: a loaded 2-core machine
CAP = 4000
"""A cap far beyond what any test here reads (the model's length is 4,096)."""
POLICY = "queued:1:2"
VOCAB = 2048  # the tiny model's


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """The tiny model served with `--max-num-seqs 1 --max-num-queued-reqs 2`, started."""
    directory = tmp_path_factory.mktemp("real-players")
    write_model(directory / "model", "tiny")
    options = server_options(POLICY, CPU_VLLM, broker_url="", device="", start_slo_ms=3000.0)
    assert options.args[-4:] == ("--max-num-seqs", "1", "--max-num-queued-reqs", "2")
    options = replace(options, args=(*options.args, "--enable-log-requests"))
    served = VllmServer(directory / "model", directory / "server", options, dtype="float32")
    served.start()
    try:
        yield served
    finally:
        served.close()


def counter(server: VllmServer, name: str, **labels: str) -> float:
    """A counter from the server's `/metrics`, summed over the series with `labels`."""
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as answer:
        return total(answer.read().decode(), name, **labels)


async def wait_for(check: object, what: str) -> None:
    """Wait until `check()` is true (generous deadline); fail naming `what` otherwise."""
    assert callable(check)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + T
    while not await asyncio.to_thread(check):
        assert loop.time() < deadline, f"never: {what}"
        await asyncio.sleep(0.05)


def body(max_tokens: int, prompt: list[int]) -> dict[str, object]:
    """A streamed completion without `ignore_eos`, the usage on every chunk."""
    return {
        "model": MODEL_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "temperature": 0.0,
    }


async def read_tokens(answer: aiohttp.ClientResponse, count: int | None = None) -> int:
    """Read the stream until `count` tokens came (None: its end); the tokens read."""
    made = 0
    async for line in answer.content:
        if line.startswith(b"data: {"):
            made = max(made, int(json.loads(line[6:])["usage"]["completion_tokens"]))
            if count is not None and made >= count:
                break
    return made


def streams(
    server: VllmServer, reporter: Reporting | None = None, listeners: Listeners | None = None
) -> Streams:
    """The benchmark's players against `server` (no edgemon here: `reporter` records)."""
    return Streams(
        url=server.url,
        profile=CPU_VLLM,
        arrivals=RequestSource(1.0, CPU_VLLM.workload, seed=1),
        seed=1,
        vocab_size=VOCAB,
        reporter=reporter,
        listeners=listeners,
    )


@dataclass(frozen=True, slots=True)
class Plans:
    """Listeners who all do what `chosen` says."""

    chosen: ListenerPlan

    def plan(self, seed: int, stream: str, audio_ms: float, requested_ms: float) -> ListenerPlan:
        """The same plan for every stream."""
        return self.chosen


@dataclass(frozen=True, slots=True)
class Reported:
    """One chunk as the player's Reporter was told of it, and when (wall ms)."""

    t_ms: float
    audio_ms: float | None
    final: bool
    play_start_ms: float | None


@dataclass(slots=True)
class Reports:
    """A player's Reporter that records the chunks it is told of."""

    chunks: list[Reported] = field(default_factory=list)

    def start(
        self,
        stream: str,
        *,
        play_start_ms: float | None = None,
        margin_ms: float | None = None,
        player: str | None = None,
    ) -> None:
        """The request was made: nothing to record."""

    def chunk(
        self,
        stream: str,
        *,
        audio_ms: float | None = None,
        eta_ms: float | None = None,
        final: bool = False,
        play_start_ms: float | None = None,
    ) -> None:
        """A chunk reached the player now."""
        self.chunks.append(Reported(wall_ms(), audio_ms, final, play_start_ms))

    def end(self, stream: str, reason: str = "completed") -> None:
        """The stream ended: nothing to record."""


@pytest.mark.asyncio
async def test_a_stream_without_a_length_runs_to_its_cap(server: VllmServer) -> None:
    """No `ignore_eos`, no EOS in the model: a stream of 300 `max_tokens` gets all 300 tokens
    and ends for its length, not at a sampled end-of-sequence token (so a player's stream
    ends when the player closes it)."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{server.url}/v1/completions", json=body(300, [5, 6, 7])) as answer,
    ):
        assert answer.status == 200
        reasons: list[str] = []
        made = 0
        async for line in answer.content:
            if line.startswith(b"data: {"):
                event = json.loads(line[6:])
                made = int(event["usage"]["completion_tokens"])
                reasons += [c["finish_reason"] for c in event["choices"] if c["finish_reason"]]
    assert (made, reasons) == (300, ["length"])


@pytest.mark.asyncio
async def test_a_client_that_closes_its_stream_frees_its_seat_at_once(server: VllmServer) -> None:
    """The only seat (`--max-num-seqs 1`) is taken by A (a cap of 4,000 tokens); B waits for
    it. A's client reads 10 tokens and closes its stream: vLLM aborts A, B runs its 5
    tokens, and the engine made for A only the tokens in flight when its client left, far
    below its cap (fewer than a tenth of it beyond what the client read; holding its seat
    to the cap, A would have made 3,990 more before B started)."""
    await wait_for(lambda: server.load() == (0, 0), "the server idle")
    made_before = counter(server, "vllm:generation_tokens_total")
    async with aiohttp.ClientSession() as session:
        first = await session.post(f"{server.url}/v1/completions", json=body(CAP, [9, 10, 11]))
        assert first.status == 200
        read = await read_tokens(first, 10)
        second = await session.post(f"{server.url}/v1/completions", json=body(5, [12, 13]))
        assert second.status == 200
        await wait_for(lambda: server.load() == (1, 1), "A running and B waiting")
        first.close()  # the client leaves
        assert await read_tokens(second) == 5
        second.close()
    await wait_for(lambda: server.load() == (0, 0), "the server idle again")
    made_for_first = counter(server, "vllm:generation_tokens_total") - made_before - 5
    assert read <= made_for_first < read + CAP // 10


@pytest.mark.asyncio
async def test_a_player_closes_its_stream_at_its_length_and_counts_a_503_as_shed(
    server: VllmServer,
) -> None:
    """The benchmark's player of a 30-frame request (no `max_frames`: the generous cap)
    receives its 30 frames, ends final and closes its stream, and the engine made about that
    many for it, not its cap. With two requests in flight (`--max-num-queued-reqs 2`), vLLM
    answers a third with 503, counted by the engine as a refusal for `max_num_queued_reqs`:
    the player counts it `shed`."""
    players = streams(server)
    await wait_for(lambda: server.load() == (0, 0), "the server idle")
    made_before = counter(server, "vllm:generation_tokens_total")
    request = Request("r-30", 0.0, prompt_tokens=20, frames=30)
    assert request_body(request, seed=1, vocab_size=VOCAB, cap=players.cap)["max_tokens"] == (
        generous_cap(CPU_VLLM.workload)
    )
    async with aiohttp.ClientSession() as session:
        await players.play(session, request, 0.0)
    player = players.players["r-30"]
    assert player.final
    assert (player.shed_ms, players.log.cut, players.log.refusals) == (None, 0, 0)
    await wait_for(lambda: server.load() == (0, 0), "the player's request ended")
    made = counter(server, "vllm:generation_tokens_total") - made_before
    assert 30 <= made < players.cap

    refused_before = counter(
        server, "vllm:admission_rejections_total", reason="max_num_queued_reqs"
    )
    async with aiohttp.ClientSession() as session:
        holders = [
            await session.post(f"{server.url}/v1/completions", json=body(CAP, [20 + i]))
            for i in range(2)
        ]
        try:
            await wait_for(lambda: server.load() == (1, 1), "two requests in flight")
            await players.play(session, Request("r-late", 0.0, prompt_tokens=20, frames=30), 0.0)
        finally:
            for holder in holders:
                holder.close()
    assert players.players["r-late"].shed_ms is not None
    assert players.log.refusals == 1
    refused = counter(server, "vllm:admission_rejections_total", reason="max_num_queued_reqs")
    assert refused == refused_before + 1
    await wait_for(lambda: server.load() == (0, 0), "the holders aborted")


@pytest.mark.asyncio
async def test_every_request_carries_its_id_and_vllm_names_its_engine_request_from_it(
    server: VllmServer,
) -> None:
    """A player sends `X-Request-Id: <request id>`: the engine adds the request as
    `cmpl-<id>-0-` and 8 characters of its own (its log), the name edgemon's slack feed is
    joined to the engine's requests by."""
    players = streams(server)
    await wait_for(lambda: server.load() == (0, 0), "the server idle")
    async with aiohttp.ClientSession() as session:
        await players.play(session, Request("r-named", 0.0, prompt_tokens=20, frames=30), 0.0)
    assert players.players["r-named"].final
    added = re.compile(r"Added request cmpl-r-named-0-[0-9a-f]{8}\.")
    await wait_for(
        lambda: added.search(server.log_path.read_text(encoding="utf-8", errors="replace")),
        "the engine's request named from the player's X-Request-Id in its log",
    )


PAUSE = ListenerPlan(holds=((50.0, 300.0),))
"""A listener who pauses for 300 ms once the player has played 50 ms."""


@pytest.mark.asyncio
async def test_a_paused_listener_holds_its_player_and_reports_its_start_moved_by_the_pause(
    server: VllmServer,
) -> None:
    """The player of 1,500 frames (its cap: a few seconds of streaming) pauses for
    300 ms after 50 ms of playback, on a timer set by its first chunk: it stood 300 ms, and
    its Reporter was told the play start with the first chunk, nothing with the chunks before
    the pause, the start moved by the pause so far with each chunk during it (growing), and
    the first start plus the whole pause with each chunk after it (the virtual loop's
    reports)."""
    reports = Reports()
    players = streams(server, reports, Plans(PAUSE))
    await wait_for(lambda: server.load() == (0, 0), "the server idle")
    request = Request("r-pause", 0.0, prompt_tokens=20, frames=1500, max_frames=1500)
    async with aiohttp.ClientSession() as session:
        await players.play(session, request, wall_ms())
    player = players.players["r-pause"]
    assert player.final
    assert player.stood_ms == 300.0
    assert player.resumes_ms is not None
    paused = player.resumes_ms - 300.0
    first, *rest = reports.chunks
    assert first.play_start_ms is not None
    assert paused >= first.play_start_ms + 50.0
    before = [r for r in rest if r.t_ms < paused]
    during = [r for r in rest if paused <= r.t_ms < player.resumes_ms]
    after = [r for r in rest if r.t_ms >= player.resumes_ms]
    assert after, "the stream ended before the pause did"
    assert all(r.play_start_ms is None for r in before)
    starts = [r.play_start_ms for r in during if r.play_start_ms is not None]
    assert len(starts) == len(during)
    assert all(first.play_start_ms < s < first.play_start_ms + 300.0 for s in starts)
    assert starts == sorted(starts)
    moved = first.play_start_ms + 300.0
    assert [r.play_start_ms for r in after] == pytest.approx([moved] * len(after))


STALL_MS = 5000.0
"""A Wi-Fi stall from the run's start: far longer than a 60-frame stream takes."""


@pytest.mark.asyncio
async def test_chunks_that_reach_the_socket_in_a_wifi_stall_reach_the_player_at_its_end(
    server: VllmServer,
) -> None:
    """The player of 60 frames (4 chunks: the profile's 5, 25, 25, then 5) whose link
    stalls for the first 5 s of the run: every token reached the socket during the stall
    (the token log keeps those times), and the 4 chunks reached the player and its Reporter
    all at once, in order, at the stall's end; the player's stream ended only once they
    had."""
    reports = Reports()
    players = streams(server, reports, Plans(ListenerPlan(stalls=((0.0, STALL_MS),))))
    await wait_for(lambda: server.load() == (0, 0), "the server idle")
    origin = wall_ms()
    async with aiohttp.ClientSession() as session:
        await players.play(session, Request("r-wifi", 0.0, prompt_tokens=20, frames=60), origin)
    ended = wall_ms()
    stall_end = origin + STALL_MS
    sockets = [t for stream, t in players.log.arrivals if stream == "r-wifi"]
    assert len(sockets) >= 60
    assert max(sockets) < stall_end, "the stream outlasted the stall: no chunk was held"
    player = players.players["r-wifi"]
    assert player.final
    assert CPU_VLLM.chunk_schedule == (5, 25)
    audio = [frames * CPU_VLLM.frame_ms for frames in (5, 25, 25, 5)]
    assert [a for _, a in player.arrivals] == audio
    (delivered,) = {t for t, _ in player.arrivals}
    assert stall_end <= delivered <= ended
    assert player.first_ms == delivered
    assert [(r.audio_ms, r.final) for r in reports.chunks] == [
        (a, i == 3) for i, a in enumerate(audio)
    ]
    assert all(stall_end <= r.t_ms <= ended for r in reports.chunks)


@pytest.mark.asyncio
async def test_a_player_that_buffers_the_whole_stream_reports_no_start_until_its_end(
    server: VllmServer,
) -> None:
    """A `prebuffer` player that waits for the whole stream: every chunk before the last
    reports the play start 2^53 (not yet, as the protocol says), and the last reports the
    start it then took, no earlier than that chunk's arrival."""
    reports = Reports()
    plan = ListenerPlan(start_at_audio_ms=math.inf)
    players = streams(server, reports, Plans(plan))
    await wait_for(lambda: server.load() == (0, 0), "the server idle")
    request = Request("r-whole", 0.0, prompt_tokens=20, frames=60)
    async with aiohttp.ClientSession() as session:
        await players.play(session, request, wall_ms())
    *before, last = reports.chunks
    assert before
    assert [r.play_start_ms for r in before] == [NOT_STARTED_MS] * len(before)
    assert last.final
    assert last.play_start_ms is not None
    assert NOT_STARTED_MS > last.play_start_ms >= players.players["r-whole"].arrivals[-1][0]
