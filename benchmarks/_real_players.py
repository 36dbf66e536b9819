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

The scenario's listeners (`listeners`: `edgemon.simulate.listeners`, drawn per request as the
virtual loop draws them) act at the player, on the wall clock, as the virtual loop's do. A
prebuffering player starts once it holds its plan's audio (a rebuffering one says so in its
`start`, and every chunk reports its play start, 2^53 until it starts). A pause, or the
player's own stall (`device`): from the player's first chunk on, a timer stops the player at
each of its plan's holds (`Player.hold`), and the next chunk's report says so
(`play_start_ms`, sent with the first chunk and with every chunk after a hold,
`edgemon.simulate.loop`'s `_report`). A Wi-Fi
stall: a chunk whose last token reached the socket during one of the link's stalls reaches the
player and its Reporter at the stall's end, after every chunk held before it; the token log
and the step estimate keep the socket's times (they stand for the network's edge, not the
player), and a stream's task ends once its held chunks are delivered. Every request carries
`X-Request-Id: <its id>`: vLLM names its engine request `cmpl-<id>-0-…` from it, which is
how edgemon's slack feed is joined to the engine's requests.

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
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp
from _real_model import SPECIALS
from _real_server import MODEL_NAME

from edgemon.policy.announced import ALPHA
from edgemon.protocol import NOT_STARTED_MS
from edgemon.simulate.engine import Frames
from edgemon.simulate.listeners import NO_PLAN
from edgemon.simulate.players import Player, Score, score
from edgemon.simulate.profiles import FRAME_MS

if TYPE_CHECKING:
    from collections.abc import Callable

    from edgemon.simulate.engine import Chunk
    from edgemon.simulate.listeners import ListenerPlan
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


class Listeners(Protocol):
    """What plans each stream's listener: a scenario's `Listening`, or a test's own plans."""

    def plan(self, seed: int, stream: str, audio_ms: float, requested_ms: float) -> ListenerPlan:
        """The listener of `stream` in the run of `seed` (times on the run's clock)."""
        ...


def _later(at_ms: float, callback: Callable[[float], None]) -> asyncio.TimerHandle:
    """Call `callback(at_ms)` at `at_ms` on the wall clock (`wall_ms`), or at once if past."""
    delay_s = max(0.0, at_ms - wall_ms()) / 1000.0
    return asyncio.get_running_loop().call_later(delay_s, callback, at_ms)


class _Listener:
    """One stream's listener on the wall clock: when each chunk reaches the player and its
    Reporter, and when the player stands still (the virtual loop's `_chunk`, `_report` and
    `_hold`). Its plan's times are on the run's clock, ms since `origin_ms`."""

    __slots__ = ("_deliveries", "_held", "_hold", "origin_ms", "plan", "player", "reporter")

    def __init__(
        self, player: Player, plan: ListenerPlan, origin_ms: float, reporter: Reporting | None
    ) -> None:
        self.player = player
        self.plan = plan
        self.origin_ms = origin_ms
        self.reporter = reporter
        #: Chunks a stall holds, with when they reach the player, in order.
        self._held: deque[tuple[float, Chunk]] = deque()
        self._deliveries: asyncio.Task[None] | None = None
        self._hold: asyncio.TimerHandle | None = None

    def arrived(self, chunk: Chunk, now: float) -> None:
        """`chunk`'s last token reached the socket at `now`: the chunk reaches the player now,
        or at the end of the link's stall, and never before a chunk held ahead of it."""
        sent = now - self.origin_ms
        until = self.plan.delivered_ms(sent)
        if until <= sent and not self._held:
            self._deliver(chunk, now)
            return
        self._held.append((self.origin_ms + until, chunk))
        if self._deliveries is None:
            name = f"deliver {self.player.stream}"
            self._deliveries = asyncio.create_task(self._deliver_held(), name=name)

    async def delivered(self) -> None:
        """Wait until every chunk a stall held has reached the player."""
        if self._deliveries is not None:
            await self._deliveries

    def close(self) -> None:
        """The stream ended: a chunk still held never arrives, a hold still due never comes
        (after the last chunk a pause changes nothing the player is scored on or reports)."""
        if self._deliveries is not None:
            self._deliveries.cancel()
        if self._hold is not None:
            self._hold.cancel()

    async def _deliver_held(self) -> None:
        """Hand the held chunks over as their stalls end: all those due at once, in order."""
        held = self._held
        while held:
            wait_ms = held[0][0] - wall_ms()
            if wait_ms > 0:
                await asyncio.sleep(wait_ms / 1000.0)
                continue
            now = wall_ms()
            while held and held[0][0] <= now:
                self._deliver(held.popleft()[1], now)
        self._deliveries = None

    def _deliver(self, chunk: Chunk, now: float) -> None:
        """`chunk` reaches the player and its Reporter now (which stamps the arrival itself);
        the player's first chunk sets its first hold."""
        player = self.player
        player.receive(chunk, now)
        holds = self.plan.holds
        if chunk.seq == 0 and holds and player.start_ms is not None:
            self._hold_at(0, player.start_ms + holds[0][0])
        if self.reporter is None:
            return
        play_start: float | None = None
        if chunk.seq == 0 or player.resumes_ms is not None or player.start_at_audio_ms:
            start = player.reported_start_ms(now)
            play_start = NOT_STARTED_MS if start is None else start
        self.reporter.chunk(
            player.stream,
            audio_ms=chunk.audio_ms,
            eta_ms=None if chunk.final else chunk.eta_ms,
            final=chunk.final,
            play_start_ms=play_start,
        )

    def _hold_at(self, index: int, at_ms: float) -> None:
        """The player stands still for its plan's hold `index` at `at_ms`; then the next."""

        def hold(due_ms: float) -> None:
            self._hold = None
            now = max(wall_ms(), due_ms)  # a timer may wake a hair early on the wall clock
            player, holds = self.player, self.plan.holds
            player.hold(now, holds[index][1])
            if index + 1 < len(holds) and not player.final and player.start_ms is not None:
                self._hold_at(index + 1, max(now, player.start_ms + holds[index + 1][0]))

        self._hold = _later(at_ms, hold)


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
    listeners: Listeners | None = None
    """The scenario's listeners (None: none does anything the server cannot see)."""
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
        plan = NO_PLAN
        if self.listeners is not None:
            at = request.arrival_ms
            plan = self.listeners.plan(self.seed, request.id, request.audio_ms, at)
        player = self.players[request.id] = Player(
            request.id,
            origin + request.arrival_ms,
            start_at_audio_ms=plan.start_at_audio_ms,
            rebuffer_step_ms=plan.rebuffer_step_ms,
        )
        listener = _Listener(player, plan, origin, self.reporter)
        if self.reporter is not None:
            kind = None if plan.rebuffer_step_ms is None else "rebuffer"
            self.reporter.start(request.id, margin_ms=self.margin_ms, player=kind)
        body = request_body(request, seed=self.seed, vocab_size=self.vocab_size, cap=self.cap)
        url, headers = f"{self.url}/v1/completions", {"X-Request-Id": request.id}
        try:
            async with session.post(url, json=body, headers=headers) as answer:
                if answer.status == UNAVAILABLE:
                    await answer.read()
                    self._refused(player)
                    return
                if answer.status != 200:
                    text = (await answer.read()).decode(errors="replace")
                    raise ServerError(f"{request.id}: HTTP {answer.status}: {text[:300]}")
                frames = Frames(self.profile, request.id, stream_frames(request))
                try:
                    await self._listen(answer, listener, frames)
                finally:
                    answer.close()  # the player has what it needs: vLLM aborts the request
            await listener.delivered()  # what a stall still holds reaches the player
        finally:
            listener.close()

    async def _listen(
        self, answer: aiohttp.ClientResponse, listener: _Listener, frames: Frames
    ) -> None:
        """Each streamed token is one frame; a completed chunk is on its way to the player."""
        player = listener.player
        refused = False
        try:
            await self._tokens(answer, listener, frames)
        except _Refused:
            refused = True
        finally:
            if frames.emitted:
                self.step.streams -= 1
        if frames.emitted == 0 or refused:
            self._refused(player)
        elif not frames.done:
            self.log.cut += 1

    async def _tokens(
        self, answer: aiohttp.ClientResponse, listener: _Listener, frames: Frames
    ) -> None:
        """Read the stream until its last frame came, or the stream's end."""
        stream = listener.player.stream
        last: float | None = None
        async for line in answer.content:
            if not line.startswith(b"data: "):
                continue
            payload = line[6:].strip()
            if payload == b"[DONE]":
                break
            event = json.loads(payload)
            if "error" in event:
                _raise_error(stream, event["error"], started=frames.emitted > 0)
            if not event.get("choices"):
                continue
            now = wall_ms()
            # A chunk carries every token made since the last one the server sent: one per
            # step while the API server keeps up, several when it falls behind.
            count = int(event["usage"]["completion_tokens"]) - frames.emitted
            if count <= 0:
                continue
            self.log.arrivals.extend((stream, now) for _ in range(count))
            if last is None:
                self.step.streams += 1
            else:
                for _ in range(count):
                    self.step.interval((now - last) / count)
            last = now
            for _ in range(count):
                if self._frame(listener, frames, now):
                    return

    def _frame(self, listener: _Listener, frames: Frames, now: float) -> bool:
        """One frame reached the socket at `now`: the chunk it completes goes on to the player
        and its Reporter (`_Listener.arrived`); whether it was the last."""
        estimate = self.step.ms
        chunk = frames.add(now, self.profile.frame_ms if estimate is None else estimate)
        if chunk is None:
            return False
        listener.arrived(chunk, now)
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
