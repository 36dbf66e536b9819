"""Players of the real loop: each streams one request from vLLM's OpenAI server and plays it.

A player makes its request when the workload says (`RequestSource`, the virtual loop's
generator: same seed, same requests), reports `start` then, and streams `/v1/completions`
with `stream=true`. It sends no length: no `ignore_eos`, and `max_tokens` only as a client
caps a request (`max_tokens`: the request's `max_frames` when its workload sets one, else a
generous cap, `generous_cap`: the workload's longest audio and half as much again; vLLM's
default for `/v1/completions` is 16 tokens, so some cap must be sent). The generated model
has no end-of-sequence token (`_real_model.py`), so the stream goes on until the player has
its request's frames (`Request.frames`, or its cap if that is lower) and closes it, as a
TTS stream ends at its end-of-speech token: vLLM aborts a request whose client left and
frees its seat at once (`tests/vllm/test_real_players.py`). Its prompt is the request's
length in token ids (seeded per request, so prompts share no prefix). Each token is one
codec frame. Frames are counted from the usage every chunk carries
(`continuous_usage_stats`), not from chunks: a chunk carries one token per step while the
API server keeps up, and every token made since the last one when it falls behind. Frames
are cut into the profile's chunks (`Frames`, the simulated engine's own cutter: a 5-frame
chunk, then 25-frame chunks), and each chunk is handed to the `Player` (its score, on its
own clock, with the simulated players' prebuffer: the announced wait for the second chunk
plus a cushion) and to the `Reporter` the moment its last token arrives.

The `eta_ms` hint is what the simulated engine announces, estimated from outside: the next
chunk's frames times the box's recent step (`StepEstimate`: an EWMA of every stream's token
intervals, the intervals of one step weighing as one step, as the engine's own estimate of
its steps would). A stream's own few intervals would not do: one prefill's stall among the
first chunk's four intervals announced a 20 s wait for the second chunk, and the player
prebuffered that long.

A refusal is what the server says it is, and the player counts it `shed`: HTTP 503 (vLLM's
own `--max-num-queued-reqs` / `--max-num-queued-tokens` at arrival, or edgemon's shedding
middleware); an SSE error event with code 503 on a stream already answered 200 (vLLM's
second admission check, after tokenizing, on a streaming request); or a stream that ends
before its first token without a `finish_reason` (edgemon's scheduler ended it,
docs/client.md). Any other error status or event stops the run (`ServerError`).

`Streams.run` drives one run on the wall clock: arrivals stop at the run's duration and, when
it drains (the default), the run goes on until every stream has ended (bounded by
`drain_limit_s`); then it scores the players, as `edgemon.simulate.realtime.Box` does for the
simulated engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
from _real_model import SPECIALS
from _real_server import MODEL_NAME

from edgemon.policy.announced import ALPHA
from edgemon.simulate.engine import Frames
from edgemon.simulate.players import Player, Score, score
from edgemon.simulate.profiles import FRAME_MS

if TYPE_CHECKING:
    from edgemon.simulate.profiles import Profile, Workload
    from edgemon.simulate.realtime import Reporting
    from edgemon.simulate.scenarios import RequestSource
    from edgemon.simulate.workload import Request

CONNECT_LIMIT = 256
"""Concurrent HTTP connections the players may hold (every stream has one)."""
CAP_MARGIN = 1.5
"""A generous cap: the workload's longest audio times this."""
DRAIN_LIMIT_S = 600.0
"""The longest a draining run goes on after its arrivals stopped (the virtual loop's
`DRAIN_LIMIT_MS`); streams still open then are scored as they are."""
UNAVAILABLE = 503


class ServerError(RuntimeError):
    """The server answered with an error that is no refusal (a bug, not a shed request)."""


def wall_ms() -> float:
    """The players' clock: Unix epoch milliseconds."""
    return time.time() * 1000.0


def prompt_ids(request: Request, seed: int, vocab_size: int) -> list[int]:
    """The request's prompt: `prompt_tokens` word ids drawn from the request's own seed."""
    rng = random.Random(f"prompt/{seed}/{request.id}")
    return [rng.randrange(len(SPECIALS), vocab_size) for _ in range(request.prompt_tokens)]


def generous_cap(workload: Workload) -> int:
    """The `max_tokens` a client sends when its workload sets none: the longest audio the
    workload makes, in frames, and half as much again (it never binds; vLLM's default, 16,
    would)."""
    return math.ceil(workload.audio_max_s * 1000.0 / FRAME_MS * CAP_MARGIN)


def request_body(request: Request, *, seed: int, vocab_size: int, cap: int) -> dict[str, Any]:
    """The completion a player asks for: the request's prompt, its client's cap (`cap` when
    the request sets none), streamed with the usage on every chunk; no length, no
    `ignore_eos`."""
    return {
        "model": MODEL_NAME,
        "prompt": prompt_ids(request, seed, vocab_size),
        "max_tokens": cap if request.max_frames is None else request.max_frames,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "temperature": 0.0,
    }


def stream_frames(request: Request) -> int:
    """The frames the player waits for: the request's speech, or its cap if that is lower
    (vLLM then ends the stream there)."""
    cap = request.max_frames
    return request.frames if cap is None else min(request.frames, cap)


@dataclass(slots=True)
class StepEstimate:
    """The box's recent step duration, from the token intervals of every stream: an EWMA in
    which the `streams` intervals of one step weigh as one step (the `ALPHA` of
    `edgemon.policy.announced`)."""

    ms: float | None = None
    streams: int = 0
    """Streams receiving tokens now."""

    def interval(self, gap_ms: float) -> None:
        """One stream's token interval ended now."""
        if self.ms is None:
            self.ms = gap_ms
            return
        self.ms += ALPHA / max(1, self.streams) * (gap_ms - self.ms)


@dataclass(slots=True)
class TokenLog:
    """Every token's arrival, for the step-time figures: (stream, arrival ms)."""

    arrivals: list[tuple[str, float]] = field(default_factory=list)
    refusals: int = 0
    cut: int = 0
    """Streams the server ended before their last frame, with some frames sent."""


class _Refused(Exception):  # noqa: N818 - a control-flow signal, not an error
    """The server refused the stream after answering 200 (an SSE error event, code 503)."""


@dataclass(slots=True, kw_only=True)
class Streams:
    """One run's players against the server at `url` (see the module doc)."""

    url: str
    profile: Profile
    arrivals: RequestSource
    seed: int
    vocab_size: int
    reporter: Reporting | None
    margin_ms: float | None = None
    drain_limit_s: float = DRAIN_LIMIT_S
    players: dict[str, Player] = field(default_factory=dict)
    log: TokenLog = field(default_factory=TokenLog)
    step: StepEstimate = field(default_factory=StepEstimate)
    requests: int = 0
    origin_ms: float = 0.0
    end_ms: float = 0.0

    @property
    def cap(self) -> int:
        """The `max_tokens` of a request whose workload sets none."""
        return generous_cap(self.arrivals.workload)

    async def run(
        self, duration_s: float, *, origin_ms: float | None = None, drain: bool = True
    ) -> Score:
        """Make every request due within `duration_s` on time, and none after; then, when the
        run drains, wait until every stream has ended (at most `drain_limit_s`). Streams
        still open are closed and scored as they are."""
        self.origin_ms = origin = wall_ms() if origin_ms is None else origin_ms
        end = origin + duration_s * 1000.0
        tasks: set[asyncio.Task[None]] = set()
        connector = aiohttp.TCPConnector(limit=CONNECT_LIMIT)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            while True:
                now = wall_ms()
                for request in self.arrivals.due(min(now, end) - origin):
                    tasks.add(asyncio.create_task(self.play(session, request, origin)))
                if now >= end:
                    break
                until = min(end, origin + self.arrivals.next_ms) - wall_ms()
                await asyncio.sleep(max(0.0, until) / 1000.0)
            if drain and tasks:
                await asyncio.wait(tasks, timeout=self.drain_limit_s)
            self.end_ms = wall_ms()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task  # a player's failure (ServerError, a lost server) stops the run
        return self.finish()

    def finish(self) -> Score:
        """End every unfinished stream as cancelled; score the players at the run's end."""
        if self.reporter is not None:
            for player in self.players.values():
                if not player.final and player.shed_ms is None:
                    self.reporter.end(player.stream, "cancelled")
        return score(self.players.values(), self.end_ms, requests=self.requests)

    async def play(self, session: aiohttp.ClientSession, request: Request, origin: float) -> None:
        """One player: request `request` (due at `origin` + its arrival), stream it until it
        has its frames, then close the stream; a refusal is counted `shed`."""
        self.requests += 1
        player = self.players[request.id] = Player(request.id, origin + request.arrival_ms)
        if self.reporter is not None:
            self.reporter.start(request.id, margin_ms=self.margin_ms)
        body = request_body(request, seed=self.seed, vocab_size=self.vocab_size, cap=self.cap)
        async with session.post(f"{self.url}/v1/completions", json=body) as answer:
            if answer.status == UNAVAILABLE:
                await answer.read()
                self._refused(player)
                return
            if answer.status != 200:
                text = (await answer.read()).decode(errors="replace")
                raise ServerError(f"{request.id}: HTTP {answer.status}: {text[:300]}")
            frames = Frames(self.profile, request.id, stream_frames(request))
            try:
                await self._listen(answer, player, frames)
            finally:
                answer.close()  # the player has what it needs: vLLM aborts the request

    async def _listen(self, answer: aiohttp.ClientResponse, player: Player, frames: Frames) -> None:
        """Each streamed token is one frame; a completed chunk reaches the player now."""
        refused = False
        try:
            await self._tokens(answer, player, frames)
        except _Refused:
            refused = True
        finally:
            if frames.emitted:
                self.step.streams -= 1
        if frames.emitted == 0 or refused:
            self._refused(player)
        elif not frames.done:
            self.log.cut += 1

    async def _tokens(self, answer: aiohttp.ClientResponse, player: Player, frames: Frames) -> None:
        """Read the stream until the player has its last frame, or the stream's end."""
        last: float | None = None
        async for line in answer.content:
            if not line.startswith(b"data: "):
                continue
            payload = line[6:].strip()
            if payload == b"[DONE]":
                break
            event = json.loads(payload)
            if "error" in event:
                _raise_error(player.stream, event["error"], started=frames.emitted > 0)
            if not event.get("choices"):
                continue
            now = wall_ms()
            # A chunk carries every token made since the last one the server sent: one per
            # step while the API server keeps up, several when it falls behind.
            count = int(event["usage"]["completion_tokens"]) - frames.emitted
            if count <= 0:
                continue
            self.log.arrivals.extend((player.stream, now) for _ in range(count))
            if last is None:
                self.step.streams += 1
            else:
                for _ in range(count):
                    self.step.interval((now - last) / count)
            last = now
            for _ in range(count):
                if self._frame(player, frames, now):
                    return

    def _frame(self, player: Player, frames: Frames, now: float) -> bool:
        """One frame arrived at `now`: the chunk it completes reaches the player and the
        reporter; whether it was the last."""
        estimate = self.step.ms
        chunk = frames.add(now, self.profile.frame_ms if estimate is None else estimate)
        if chunk is None:
            return False
        first = player.chunks == 0
        player.receive(chunk, now)
        if self.reporter is not None:
            self.reporter.chunk(
                player.stream,
                audio_ms=chunk.audio_ms,
                eta_ms=None if chunk.final else chunk.eta_ms,
                final=chunk.final,
                play_start_ms=player.start_ms if first else None,
            )
        return chunk.final

    def _refused(self, player: Player) -> None:
        player.refused(wall_ms())
        self.log.refusals += 1
        if self.reporter is not None:
            self.reporter.end(player.stream, "refused")


def _raise_error(stream: str, error: Any, *, started: bool) -> None:
    """An SSE error event: `_Refused` for code 503 before any token (vLLM's admission check
    after the 200), `ServerError` for anything else."""
    code = error.get("code") if isinstance(error, dict) else None
    if code == UNAVAILABLE and not started:
        raise _Refused
    raise ServerError(f"{stream}: the stream's error event: {json.dumps(error)[:300]}")
