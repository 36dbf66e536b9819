"""A simulated box in real time: engine steps take their modelled time, players report.

`Box.run()` is the asyncio driver the demo and the benchmark share. Requests arrive on the
wall clock (`Arrivals` offsets from the run's start); the engine steps, and the driver sleeps
each step's modelled duration; every chunk reaches its player after the network delay, and the
player hands it to its reporter (a real `edgemon.client.Reporter` in the demo and benchmark)
at that instant, so `t_ms` is stamped on the player's clock. Which engine runs, and whether it
obeys a gate, is the caller's choice: anything with `submit`/`step`/`waiting`/`running`.

Each stream is reported as the loop expects it: `start` when the request is made (with the
margin the player asks for), a `chunk` per arrival with the engine's `eta_ms` hint (the first
one also says when the player starts playback, `play_start_ms`), `final` on the last; at the
end of a run every unfinished stream is ended as `cancelled`, and the players are scored at
that instant. A request the engine refuses (`submit` returns False, or an engine with
`refused()` hands it out after a step) is counted `shed` by its player when the driver
learns of it, and ended as `refused`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from edgemon.simulate.players import Delivery, Player, Score, score

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from edgemon.simulate.engine import Chunk, Step
    from edgemon.simulate.scenarios import RequestSource
    from edgemon.simulate.workload import Arrivals, Request

IDLE_POLL_S = 0.005
"""How often an engine with everything held asks its gate again."""
CATCH_UP_MS = 50.0
"""A step that begins at most this late after its predecessor's modelled end begins, on the
model's timeline, at that end (steps last what the model says on average, not that plus the
driver's overshoot); later than that, the driver was stalled and the timeline restarts now."""


class Engine(Protocol):
    """What the driver needs of an engine (`TtsEngine`, or vLLM's scheduler in a wrapper)."""

    @property
    def waiting(self) -> int: ...

    @property
    def running(self) -> int: ...

    def submit(self, request: Request) -> bool | None:
        """Queue `request`; False if the engine refused it at once (shed)."""
        ...

    def step(self, now_ms: float) -> Step | None: ...


class Reporting(Protocol):
    """The part of `edgemon.client.Reporter` a player uses."""

    def start(
        self,
        stream: str,
        *,
        play_start_ms: float | None = None,
        margin_ms: float | None = None,
        player: str | None = None,
    ) -> None: ...

    def chunk(
        self,
        stream: str,
        *,
        audio_ms: float | None = None,
        eta_ms: float | None = None,
        final: bool = False,
        play_start_ms: float | None = None,
    ) -> None: ...

    def end(self, stream: str, reason: str = "completed") -> None: ...


def wall_ms() -> float:
    """The players' and engine's clock: Unix epoch milliseconds."""
    return time.time() * 1000.0


@dataclass(slots=True)
class BoxStatus:
    """What the engine is doing now, for a live view."""

    held: bool = False
    """The last step (or idle poll) was held by the gate with requests waiting."""
    waiting: int = 0
    running: int = 0
    steps: int = 0
    held_steps: int = 0
    requests: int = 0
    last_step_ms: float = 0.0
    max_lag_ms: float = 0.0
    """The latest a step began after its predecessor's modelled end: how far the driver fell
    behind the model (a loaded machine, a blocked event loop). Steps of a run are only as
    long as modelled while this stays small."""


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    if seconds <= 0:
        await asyncio.sleep(0)
        return
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return


@dataclass(slots=True, kw_only=True)
class Box:
    """One simulated box: an engine, its request stream, its players and their reporter."""

    device: str
    engine: Engine
    arrivals: Arrivals | RequestSource
    delivery: Delivery
    reporter: Reporting | None
    margin_ms: float | None = None
    eta_hints: bool = True
    clock: Callable[[], float] = wall_ms
    sleep: Callable[[asyncio.Event, float], Awaitable[None]] = _sleep_or_stop
    """Waits the given seconds or until the event is set (a test can step a fake clock)."""
    players: dict[str, Player] = field(default_factory=dict)
    status: BoxStatus = field(default_factory=BoxStatus)
    origin_ms: float = 0.0
    end_ms: float = 0.0

    async def run(
        self,
        duration_s: float,
        stop: asyncio.Event | None = None,
        *,
        origin_ms: float | None = None,
    ) -> Score:
        """Serve requests for `duration_s` (or until `stop`), then score the players.

        Requests arrive at `origin_ms` (default: now) plus their offsets; boxes given one
        origin see the same requests up to the same end, every request due by then counted.
        """
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        self.origin_ms = origin = self.clock() if origin_ms is None else origin_ms
        end = origin + duration_s * 1000.0
        engine, status = self.engine, self.status
        modelled: float | None = None  # when the last step ends on the model's timeline
        while not stop.is_set():
            now = self.clock()
            if modelled is not None and now - modelled < CATCH_UP_MS:
                # The next step begins where the last one ended in the model: the driver's
                # own delays (a sleep that overshoots, a scheduler call) are not step time.
                now = modelled
            if now >= end:
                break
            for request in self.arrivals.due(now - origin):
                self._arrive(request, origin)
            step = engine.step(now)
            self._refusals()
            status.waiting, status.running = engine.waiting, engine.running
            if step is None:
                modelled = None
                status.held = engine.waiting > 0
                busy = engine.waiting or engine.running  # held, or parked by a pacing rule
                wait_ms = IDLE_POLL_S * 1000.0 if busy else self._until_next(now)
                await self.sleep(stop, min(wait_ms, end - now) / 1000.0)
                continue
            status.steps += 1
            status.held = step.held
            status.held_steps += step.held
            status.last_step_ms = step.ms
            for chunk in step.chunks:
                delay = self.delivery.arrival_ms(chunk) - self.clock()
                loop.call_later(max(0.0, delay) / 1000.0, self._deliver, chunk)
            await self.sleep(stop, max(0.0, step.end_ms - self.clock()) / 1000.0)
            status.max_lag_ms = max(status.max_lag_ms, self.clock() - step.end_ms)
            modelled = step.end_ms
        for request in self.arrivals.due(min(self.clock(), end) - origin):
            self._arrive(request, origin)  # arrived by the end, never served
        return self.finish()

    def finish(self) -> Score:
        """End every unfinished stream as cancelled; score the players now."""
        self.end_ms = now = self.clock()
        if self.reporter is not None:
            for player in self.players.values():
                if not player.final and player.shed_ms is None:  # a refusal ended it already
                    self.reporter.end(player.stream, "cancelled")
        return score(self.players.values(), now, requests=self.status.requests)

    def _until_next(self, now: float) -> float:
        return max(0.0, self.origin_ms + self.arrivals.next_ms - now)

    def _arrive(self, request: Request, origin: float) -> None:
        self.status.requests += 1
        arrived = origin + request.arrival_ms
        self.players[request.id] = Player(request.id, arrived)
        # The engine's clock is the driver's: its deadlines count from the arrival on it.
        accepted = self.engine.submit(replace(request, arrival_ms=arrived))
        if self.reporter is not None:
            self.reporter.start(request.id, margin_ms=self.margin_ms)
        if accepted is False:
            self._refuse(request.id)

    def _refusals(self) -> None:
        """Requests the engine refused from its queue since the last step, if it says."""
        refused = getattr(self.engine, "refused", None)
        if callable(refused):
            for stream in refused():
                self._refuse(stream)

    def _refuse(self, stream: str) -> None:
        """The engine refused `stream`: its player hears it now."""
        self.players[stream].refused(self.clock())
        if self.reporter is not None:
            self.reporter.end(stream, "refused")

    def _deliver(self, chunk: Chunk) -> None:
        """The chunk reaches its player now (after the run ended: dropped, nobody listens)."""
        if self.end_ms:
            return
        player = self.players[chunk.request]
        first = player.chunks == 0
        player.receive(chunk, self.clock())
        reporter = self.reporter
        if reporter is None:
            return
        eta = chunk.eta_ms if self.eta_hints and not chunk.final else None
        reporter.chunk(
            player.stream,
            audio_ms=chunk.audio_ms,
            eta_ms=eta,
            final=chunk.final,
            play_start_ms=player.start_ms if first else None,
        )
