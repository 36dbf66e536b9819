"""One virtual run as a value (`Point`), its row, and a pool that runs many.

`closed_loop.py --virtual` runs every fixed-load point through `point_row`, and its searches
(`_tuning.py`: SLO capacity, the static tuning) run theirs through a `Runner`: one code path
from a point to its row, whichever asks. A `Runner` with `jobs` > 1 runs points on that many
processes; each run is pure, so the rows do not depend on how many run at once.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgemon.policy.deadlines import GAP_SLO_MS, START_SLO_MS
from edgemon.simulate.figures import row, run_virtual
from edgemon.simulate.policies import policy

if TYPE_CHECKING:
    from collections.abc import Iterable

    from edgemon.simulate.loop import LoopResult
    from edgemon.simulate.profiles import Profile
    from edgemon.simulate.scenarios import Scenario


@dataclass(frozen=True, slots=True)
class Point:
    """One virtual run: what it is run on, and how."""

    profile: Profile
    policy: str
    scenario: Scenario
    load: float
    seed: int
    duration_s: float
    lengths_known: bool = False
    start_slo_ms: float = START_SLO_MS
    gap_slo_ms: float = GAP_SLO_MS
    drain: bool = True
    measured: bool = False
    """`profile`'s steps are a shape measured on a real box (`--steps`): the row says which."""


def run_point(point: Point) -> LoopResult:
    """Run `point` on the virtual clock."""
    return run_virtual(
        point.profile,
        policy(point.policy, point.profile),
        point.scenario,
        rate_rps=point.load * point.profile.capacity_rps(),
        seed=point.seed,
        duration_s=point.duration_s,
        start_slo_ms=point.start_slo_ms,
        gap_slo_ms=point.gap_slo_ms,
        lengths_known=point.lengths_known,
        drain=point.drain,
    )


def point_row(point: Point, result: LoopResult) -> dict[str, Any]:
    """The JSON row of `point`'s run (`edgemon.simulate.figures.row`, and how it ran)."""
    profile = point.profile
    line = row(
        result.score,
        mode="virtual",
        profile=profile.name,
        policy=point.policy,
        scenario=point.scenario.name,
        load=point.load,
        seed=point.seed,
        duration_s=round(result.end_ms / 1000.0, 3),
    )
    line["scenario_params"] = point.scenario.describe()
    line["lengths"] = "known" if point.lengths_known else "eos"
    line["drain"] = point.drain
    line["chunks"] = ",".join(map(str, profile.chunk_schedule))
    line["frame_ms"] = profile.frame_ms
    if point.measured:
        line["steps"] = steps_label(profile)
    return line


def steps_label(profile: Profile) -> str:
    """The step model a row ran on, as its `steps` field says it."""
    step = profile.step
    return (
        f"{step.base_ms:g} + {step.per_decode_seq_ms:g}·n ms, "
        f"{step.per_prefill_token_ms:g} ms/token"
    )


def row_of(point: Point) -> dict[str, Any]:
    """Run `point` and return its row (in a worker process)."""
    return point_row(point, run_point(point))


class Runner:
    """Runs points, `jobs` at a time, and remembers each row (a point runs once)."""

    __slots__ = ("_done", "_pool")

    def __init__(self, jobs: int) -> None:
        self._pool = ProcessPoolExecutor(max_workers=jobs) if jobs > 1 else None
        self._done: dict[Point, dict[str, Any]] = {}

    def __enter__(self) -> Runner:  # noqa: PYI034 - a final class
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)

    def rows(self, points: Iterable[Point]) -> list[dict[str, Any]]:
        """Each point's row, in order."""
        wanted = list(points)
        todo = list(dict.fromkeys(p for p in wanted if p not in self._done))
        if self._pool is None:
            done: Iterable[dict[str, Any]] = map(row_of, todo)
        else:
            done = self._pool.map(row_of, todo, chunksize=max(1, len(todo) // 64))
        self._done.update(zip(todo, done, strict=True))
        return [self._done[p] for p in wanted]

    def goodput(self, points: Iterable[Point]) -> list[float]:
        """Each point's goodput, in order."""
        return [float(r["goodput"]) for r in self.rows(points)]
