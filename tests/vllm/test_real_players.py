"""The real engine's players against vLLM's OpenAI server as `benchmarks/real_engine.py`
starts it (`_real_server.VllmServer`), on the benchmark's tiny generated model (no EOS token,
`_real_model.py`), with vLLM's own admission flags (`queued:1:2`: `--max-num-seqs 1
--max-num-queued-reqs 2`): a stream runs until its client closes it, a client that closes
its stream frees its seat at once, and vLLM's 503 is what the players count `shed`.

Measured by the engine's own counters (`/metrics`: tokens generated, admission refusals),
never by the wall clock."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from typing import TYPE_CHECKING

import pytest

pytest.importorskip("vllm.entrypoints.openai.api_server", exc_type=ImportError)
pytest.importorskip("transformers")

import aiohttp
from _real_model import write_model
from _real_players import Streams, generous_cap, request_body
from _real_server import MODEL_NAME, VllmServer, server_options

from edgemon.simulate.profiles import CPU_VLLM
from edgemon.simulate.scenarios import RequestSource
from edgemon.simulate.workload import Request

from scrapes import total

if TYPE_CHECKING:
    from collections.abc import Iterator

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


def streams(server: VllmServer) -> Streams:
    """The benchmark's players against `server` (no reporter: no edgemon here)."""
    return Streams(
        url=server.url,
        profile=CPU_VLLM,
        arrivals=RequestSource(1.0, CPU_VLLM.workload, seed=1),
        seed=1,
        vocab_size=VOCAB,
        reporter=None,
    )


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
