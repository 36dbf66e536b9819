"""Runs that stop their arrivals and drain: no request is left `unfinished`."""

from __future__ import annotations

import dataclasses
import math

from edgemon.simulate.loop import LoopPlan, run_loop
from edgemon.simulate.profiles import JETSON
from edgemon.simulate.scenarios import RequestSource


def test_no_request_arrives_after_the_source_stops() -> None:
    """`until_ms`: the same requests as an endless source up to it, none after, and no next
    arrival once past it."""
    endless = RequestSource(2.0, JETSON.workload, seed=4).due(60_000.0)
    stopped = RequestSource(2.0, JETSON.workload, seed=4, until_ms=30_000.0)
    got = stopped.due(60_000.0)
    assert got == [r for r in endless if r.arrival_ms <= 30_000.0]
    assert stopped.next_ms == math.inf


def test_a_draining_run_ends_every_request_and_one_that_stops_does_not() -> None:
    """Overloaded (1.2 of capacity) for 60 s: drained, every request of the 60 s ended
    (finished or refused) and the run went on past its duration; stopped at 60 s, some are
    unfinished."""
    plan = LoopPlan(
        profile=JETSON, rate_rps=1.2 * JETSON.capacity_rps(), seed=5, duration_ms=60_000.0
    )  # fmt: skip
    drained = run_loop(plan)
    stopped = run_loop(dataclasses.replace(plan, drain=False))
    due = RequestSource(plan.rate_rps, JETSON.workload, seed=5).due(plan.duration_ms)
    assert drained.score.requests == len(due)
    assert drained.score.unfinished == 0
    assert drained.score.completed + drained.score.shed == drained.score.requests
    assert drained.end_ms > plan.duration_ms
    assert stopped.score.unfinished > 0
    assert stopped.end_ms == plan.duration_ms
