"""The real engine's players (`benchmarks/_real_players.py`) against a completions endpoint
that answers as vLLM's does (`completions.Streamer`): what they send (no length), when they
close a stream, what they count `shed`, and a draining run. Against the real server:
`tests/vllm/test_real_players.py`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _real_players import ServerError, Streams, generous_cap, wall_ms  # noqa: E402
from completions import Refusal, Streamer, serving  # noqa: E402

from edgemon.simulate.profiles import CPU_VLLM  # noqa: E402
from edgemon.simulate.scenarios import RequestSource  # noqa: E402
from edgemon.simulate.workload import Request  # noqa: E402

if TYPE_CHECKING:
    from edgemon.simulate.players import Score

VOCAB = 64


def streams(url: str, *, rate_rps: float = 1.0) -> Streams:
    """Players against `url` for `CPU_VLLM`'s workload, no reporter."""
    return Streams(
        url=url,
        profile=CPU_VLLM,
        arrivals=RequestSource(rate_rps, CPU_VLLM.workload, seed=3),
        seed=3,
        vocab_size=VOCAB,
        reporter=None,
    )


async def play(streamer: Streamer, request: Request) -> Streams:
    """One player of `request` against `streamer`, to its end."""
    async with serving(streamer) as url, aiohttp.ClientSession() as session:
        players = streams(url)
        await players.play(session, request, wall_ms())
    return players


@pytest.mark.asyncio
async def test_a_player_sends_no_length_and_closes_its_stream_once_it_has_its_frames() -> None:
    """A 12-frame request without a cap: the player asks for a generous `max_tokens` (the
    workload's longest audio and half again: 563 frames, not vLLM's default 16), sends no
    `ignore_eos`, ends final with its 12 frames and closes the stream, which the server sees
    its client leave long before the cap."""
    streamer = Streamer(step_s=0.005)
    players = await play(streamer, Request("r", 0.0, prompt_tokens=20, frames=12))
    (body,) = streamer.bodies
    assert body["max_tokens"] == generous_cap(CPU_VLLM.workload) == 563
    assert "ignore_eos" not in body
    assert len(body["prompt"]) == 20
    player = players.players["r"]
    assert player.final
    assert player.audio_ms == 12 * CPU_VLLM.frame_ms
    assert (players.log.cut, players.log.refusals) == (0, 0)
    assert streamer.left == 1
    assert 12 <= streamer.sent[0] < 563


@pytest.mark.asyncio
async def test_a_request_with_a_cap_asks_for_it_and_plays_what_it_allows() -> None:
    """A client's cap below the speech (`max_frames` 10 of 40 frames): `max_tokens` is 10,
    the server ends the stream there, and the player ends final with 10 frames (not `cut`)."""
    streamer = Streamer(step_s=0.005)
    players = await play(streamer, Request("r", 0.0, prompt_tokens=20, frames=40, max_frames=10))
    assert streamer.bodies[0]["max_tokens"] == 10
    player = players.players["r"]
    assert player.final
    assert player.audio_ms == 10 * CPU_VLLM.frame_ms
    assert players.log.cut == 0


@pytest.mark.asyncio
@pytest.mark.parametrize("refusal", ["done", "http-503", "event-503"])
async def test_every_refusal_vllm_and_edgemon_answer_is_shed(refusal: Refusal) -> None:
    """HTTP 503 (vLLM's admission limits, edgemon's middleware), an SSE error event with
    code 503 after the 200 (vLLM's admission check after tokenizing) and a stream ended
    before its first token (edgemon's scheduler): the player is `shed`, counted once."""
    players = await play(Streamer([refusal]), Request("r", 0.0, prompt_tokens=5, frames=12))
    assert players.players["r"].shed_ms is not None
    assert players.log.refusals == 1


@pytest.mark.asyncio
async def test_an_error_event_that_is_no_refusal_stops_the_run() -> None:
    """An SSE error event with another code (500) is a server failure, not a shed request:
    `ServerError` naming the request."""
    with pytest.raises(ServerError, match="r: the stream's error event"):
        await play(Streamer(["event-500"]), Request("r", 0.0, prompt_tokens=5, frames=12))


async def run(drain: bool) -> tuple[Streams, Score]:
    """A run of 0.3 s of arrivals at 30 requests a second (each about 100 frames, 20 ms
    a frame here: 2 s a stream), drained or not."""
    async with serving(Streamer(step_s=0.02)) as url:
        players = streams(url, rate_rps=30.0)
        origin = wall_ms()
        result = await players.run(0.3, origin_ms=origin, drain=drain)
    return players, result


@pytest.mark.asyncio
async def test_a_draining_run_ends_when_every_stream_has_ended() -> None:
    """Drained: arrivals stop at 0.3 s, and the run goes on until every player has all its
    frames: no request is unfinished, and the run ended after its last stream did. Not
    drained: the run ends at 0.3 s, streams under way are unfinished."""
    players, drained = await run(drain=True)
    assert drained.requests > 1
    assert drained.unfinished == 0
    assert drained.completed == drained.requests
    assert all(p.final for p in players.players.values())
    assert players.end_ms >= max(p.last_ms for p in players.players.values())
    players, stopped = await run(drain=False)
    assert stopped.unfinished > 0
    assert not all(p.final for p in players.players.values())
