"""The real-time box keeps the model's timeline: a driver whose every sleep overshoots (a busy
machine) still runs steps that last what the model says, so its figures match the virtual
loop's. Found by the closed-loop spot checks: overshoots of a few ms a step made real-time
steps ~6 % longer than modelled, and real-time runs had 2-10 times the virtual gap silence."""

from __future__ import annotations

import asyncio

from edgemon.simulate.engine import Step, TtsEngine
from edgemon.simulate.players import Delivery
from edgemon.simulate.profiles import JETSON
from edgemon.simulate.realtime import Box
from edgemon.simulate.workload import Arrivals, Request


class FakeTime:
    """A clock (ms) that moves only when the box sleeps, each sleep `overshoot_ms` too long."""

    def __init__(self, overshoot_ms: float) -> None:
        self.now_ms = 1_000_000.0
        self.overshoot_ms = overshoot_ms

    def clock(self) -> float:
        return self.now_ms

    async def sleep(self, stop: asyncio.Event, seconds: float) -> None:
        del stop
        self.now_ms += seconds * 1000.0 + self.overshoot_ms
        await asyncio.sleep(0)


class Timed:
    """A `TtsEngine` that adds up the modelled time of the steps it runs."""

    def __init__(self) -> None:
        self.engine = TtsEngine(JETSON)
        self.modelled_ms = 0.0

    @property
    def waiting(self) -> int:
        return self.engine.waiting

    @property
    def running(self) -> int:
        return self.engine.running

    def submit(self, request: Request) -> None:
        self.engine.submit(request)

    def step(self, now_ms: float) -> Step | None:
        step = self.engine.step(now_ms)
        if step is not None:
            self.modelled_ms += step.ms
        return step


def steps_in(seconds: float, overshoot_ms: float) -> tuple[int, float]:
    """Steps a box at 95 % of the jetson profile's capacity runs, and their modelled time."""
    time = FakeTime(overshoot_ms)
    engine = Timed()
    box = Box(
        device="b",
        engine=engine,
        arrivals=Arrivals(0.95 * JETSON.capacity_rps(), JETSON.workload, seed=5),
        delivery=Delivery(JETSON.network_ms, JETSON.network_jitter_ms, 5),
        reporter=None,
        clock=time.clock,
        sleep=time.sleep,
    )
    asyncio.run(box.run(seconds))
    return box.status.steps, engine.modelled_ms


def test_sleep_overshoots_do_not_stretch_the_steps() -> None:
    """Every sleep 3 ms too long: the box still runs the steps of a driver that never
    overshoots, within one, and their modelled time fills the run as before."""
    exact_steps, exact_ms = steps_in(60.0, 0.0)
    late_steps, late_ms = steps_in(60.0, 3.0)
    assert exact_steps > 500
    assert abs(late_steps - exact_steps) <= 1
    assert abs(late_ms - exact_ms) <= 200.0
