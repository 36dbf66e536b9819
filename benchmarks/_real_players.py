"""Players of the real loop: each streams one request from vLLM's OpenAI server and plays it.

A player makes its request when the workload says (`RequestSource`, the virtual loop's
generator: same seed, same requests), reports `start` then, and streams `/v1/completions`
with `stream=true`, `ignore_eos` and `max_tokens` = the request's frames; its prompt is the
request's length in token ids (seeded per request, so prompts share no prefix). Each token
is one codec frame. Frames are counted from the usage every chunk carries
(`continuous_usage_stats`), not from chunks: a chunk carries one token per step while the
API server keeps up, and every token made since the last one when it falls behind. Frames
are cut into the profile's chunks (`Frames`, the simulated engine's own cutter: a 5-frame
chunk, then 25-frame chunks), and each chunk is handed to the `Player` (its score, on its
own clock, with the prebuffer the README recommends: the announced wait for the next chunk
plus a cushion) and to the `Reporter` the moment its last token arrives.

The `eta_ms` hint is what the simulated engine announces, estimated from outside: the next
chunk's frames times the box's recent step (`StepEstimate`: an EWMA of every stream's token
intervals, the intervals of one step weighing as one step, as the engine's own estimate of
its steps would). A stream's own few intervals would not do: one prefill's stall among the
first chunk's four intervals announced a 20 s wait for the second chunk, and the player
prebuffered that long.

A refusal is what the server says it is: HTTP 503 (the shedding middleware) or a stream
that ends before its first token without a `finish_reason` (the scheduler ended it,
docs/client.md); the player counts it `shed`.

`Streams.run` drives one run on the wall clock and scores the players at its end, as
`edgemon.simulate.realtime.Box` does for the simulated engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import aiohttp
from _real_model import SPECIALS
from _real_server import MODEL_NAME

from edgemon.integrations.announced import ALPHA
from edgemon.simulate.engine import Frames
from edgemon.simulate.players import Player, Score, score

if TYPE_CHECKING:
    from edgemon.simulate.profiles import Profile
    from edgemon.simulate.realtime import Reporting
    from edgemon.simulate.scenarios import RequestSource
    from edgemon.simulate.workload import Request

CONNECT_LIMIT = 256
"""Concurrent HTTP connections the players may hold (every stream has one)."""


def wall_ms() -> float:
    """The players' clock: Unix epoch milliseconds."""
    return time.time() * 1000.0


def prompt_ids(request: Request, seed: int, vocab_size: int) -> list[int]:
    """The request's prompt: `prompt_tokens` word ids drawn from the request's own seed."""
    rng = random.Random(f"prompt/{seed}/{request.id}")
    return [rng.randrange(len(SPECIALS), vocab_size) for _ in range(request.prompt_tokens)]


@dataclass(slots=True)
class StepEstimate:
    """The box's recent step duration, from the token intervals of every stream: an EWMA in
    which the `streams` intervals of one step weigh as one step (the `ALPHA` of
    `edgemon.integrations.announced`)."""

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
    players: dict[str, Player] = field(default_factory=dict)
    log: TokenLog = field(default_factory=TokenLog)
    step: StepEstimate = field(default_factory=StepEstimate)
    requests: int = 0
    origin_ms: float = 0.0
    end_ms: float = 0.0

    async def run(self, duration_s: float, *, origin_ms: float | None = None) -> Score:
        """Make every request due within `duration_s` on time; score the players at the end."""
        self.origin_ms = origin = wall_ms() if origin_ms is None else origin_ms
        end = origin + duration_s * 1000.0
        tasks: set[asyncio.Task[None]] = set()
        connector = aiohttp.TCPConnector(limit=CONNECT_LIMIT)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            while True:
                now = wall_ms()
                for request in self.arrivals.due(min(now, end) - origin):
                    tasks.add(asyncio.create_task(self._play(session, request, origin)))
                if now >= end:
                    break
                until = min(end, origin + self.arrivals.next_ms) - wall_ms()
                await asyncio.sleep(max(0.0, until) / 1000.0)
            self.end_ms = wall_ms()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        return self.finish()

    def finish(self) -> Score:
        """End every unfinished stream as cancelled; score the players at the run's end."""
        if self.reporter is not None:
            for player in self.players.values():
                if not player.final and player.shed_ms is None:
                    self.reporter.end(player.stream, "cancelled")
        return score(self.players.values(), self.end_ms, requests=self.requests)

    async def _play(self, session: aiohttp.ClientSession, request: Request, origin: float) -> None:
        self.requests += 1
        player = self.players[request.id] = Player(request.id, origin + request.arrival_ms)
        if self.reporter is not None:
            self.reporter.start(request.id, margin_ms=self.margin_ms)
        body = {
            "model": MODEL_NAME,
            "prompt": prompt_ids(request, self.seed, self.vocab_size),
            "max_tokens": request.frames,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "temperature": 0.0,
        }
        async with session.post(f"{self.url}/v1/completions", json=body) as answer:
            if answer.status == 503:
                await answer.read()
                self._refused(player)
                return
            answer.raise_for_status()
            frames = Frames(self.profile, request.id, request.frames)
            await self._listen(answer, player, frames)

    async def _listen(self, answer: aiohttp.ClientResponse, player: Player, frames: Frames) -> None:
        """Each streamed token is one frame; a completed chunk reaches the player now."""
        try:
            await self._tokens(answer, player, frames)
        finally:
            if frames.emitted:
                self.step.streams -= 1
        if frames.emitted == 0:
            self._refused(player)
        elif not frames.done:
            self.log.cut += 1

    async def _tokens(self, answer: aiohttp.ClientResponse, player: Player, frames: Frames) -> None:
        """Read the stream until its last frame or its end."""
        last: float | None = None
        async for line in answer.content:
            if not line.startswith(b"data: "):
                continue
            payload = line[6:].strip()
            if payload == b"[DONE]":
                break
            event = json.loads(payload)
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
