"""What an operator would configure, and the load a box serves within its SLO.

**SLO capacity** (`slo_capacity`): the highest load (a share of the profile's estimated
capacity) at which at least `target` of the offered requests are good: DistServe's goodput,
the rate a box can be sized for. Found by bisection over load for one seed: the load
`low` must meet the target and `high` miss it (else the figure is `low`'s "below" or
`high`'s "at least"), then the interval is halved until it is `tolerance` wide. Goodput
against load is not strictly monotone from one seed's requests to another's, so the figure
is a crossing, the highest load found to meet the target with a higher one found to miss.

**The tuned static configuration** (`static_grid`, `tune`): the one line of vLLM flags an
operator could set without edgemon (`--max-num-seqs N` with `--max-num-queued-reqs M`, or
with `--max-num-queued-tokens T`, and chunked prefill's `--max-num-batched-tokens B
--long-prefill-token-threshold L`), chosen by the best mean goodput across the scenarios and
loads on training seeds. The grid: N from N*−3 to N*+1; M − N in {0, 2, 4, 8, 16} and no M;
T in {1, 2, 4, 8} mean prompts; then chunked prefill (B in {128, 256}, L none or 64) on the
three best of those.

Runs go to a process pool (`jobs`), each a pure virtual run: the figures do not depend on
how many run at once.
"""

from __future__ import annotations

import json
import math
import statistics
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgemon.simulate.figures import run_virtual
from edgemon.simulate.policies import policy

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from typing import TextIO

    from edgemon.simulate.profiles import Profile
    from edgemon.simulate.scenarios import Scenario

QUEUE_EXTRA = (0, 2, 4, 8, 16)
"""`--max-num-queued-reqs` − `--max-num-seqs` on the grid."""
PROMPTS = (1, 2, 4, 8)
"""`--max-num-queued-tokens` on the grid, in mean prompts."""
CHUNKED = ("chunked:128", "chunked:256", "chunked:128:64", "chunked:256:64")
"""Chunked prefill's settings, tried on the best of the rest."""
CHUNKED_ON = 3
"""How many of the best configurations chunked prefill is tried on."""


@dataclass(frozen=True, slots=True)
class Point:
    """One virtual run: what it is run on, and how."""

    profile: Profile
    engine_profile: Profile
    """The profile the engine steps by (`--steps`), load staying a share of `profile`'s."""
    policy: str
    scenario: Scenario
    load: float
    seed: int
    duration_s: float
    lengths_known: bool = False
    start_slo_ms: float | None = None


def goodput(point: Point) -> float:
    """The goodput of one run (in a worker process)."""
    options: dict[str, Any] = {}
    if point.start_slo_ms is not None:
        options["start_slo_ms"] = point.start_slo_ms
    result = run_virtual(
        point.engine_profile,
        policy(point.policy, point.profile),
        point.scenario,
        rate_rps=point.load * point.profile.capacity_rps(),
        seed=point.seed,
        duration_s=point.duration_s,
        lengths_known=point.lengths_known,
        **options,
    )
    return result.score.goodput


class Runner:
    """Runs points, `jobs` at a time, and remembers each goodput (a point runs once)."""

    __slots__ = ("_done", "_pool")

    def __init__(self, jobs: int) -> None:
        self._pool = ProcessPoolExecutor(max_workers=jobs) if jobs > 1 else None
        self._done: dict[Point, float] = {}

    def __enter__(self) -> Runner:  # noqa: PYI034 - a final class
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)

    def run(self, points: Iterable[Point]) -> list[float]:
        """The goodput of each point, in order."""
        wanted = list(points)
        todo = list(dict.fromkeys(p for p in wanted if p not in self._done))
        if self._pool is None:
            results: Iterable[float] = map(goodput, todo)
        else:
            results = self._pool.map(goodput, todo, chunksize=max(1, len(todo) // 64))
        self._done.update(zip(todo, results, strict=True))
        return [self._done[p] for p in wanted]


@dataclass(slots=True)
class Search:
    """One bisection: the loads tried and their goodput."""

    target: float
    tried: dict[float, float] = field(default_factory=dict)
    capacity: float = 0.0
    bound: str = ""
    """`below` (not even the low bound met the target), `at least` (the high bound did), or
    empty: a crossing was found."""


def slo_capacities(
    measure: Callable[[Iterable[Point]], list[float]],
    base: Sequence[Point],
    target: float,
    *,
    low: float,
    high: float,
    tolerance: float,
) -> list[Search]:
    """Each base point's SLO capacity at `target` (their `load` is replaced), searched side by
    side so that each round of bisection runs as one batch."""
    searches = [Search(target) for _ in base]
    bounds = [[low, high] for _ in base]

    def at(index: int, load: float) -> Point:
        point = base[index]
        return Point(
            point.profile,
            point.engine_profile,
            point.policy,
            point.scenario,
            round(load, 4),
            point.seed,
            point.duration_s,
            point.lengths_known,
            point.start_slo_ms,
        )

    edges = measure([at(i, x) for i in range(len(base)) for x in (low, high)])
    open_ = []
    for i, search in enumerate(searches):
        g_low, g_high = edges[2 * i], edges[2 * i + 1]
        search.tried.update({low: g_low, high: g_high})
        if g_low < target:
            search.capacity, search.bound = low, "below"
        elif g_high >= target:
            search.capacity, search.bound = high, "at least"
        else:
            open_.append(i)
    while open_:
        mids = [round((bounds[i][0] + bounds[i][1]) / 2, 4) for i in open_]
        found = measure([at(i, mid) for i, mid in zip(open_, mids, strict=True)])
        still = []
        for i, mid, got in zip(open_, mids, found, strict=True):
            searches[i].tried[mid] = got
            bounds[i][0 if got >= target else 1] = mid
            if bounds[i][1] - bounds[i][0] > tolerance:
                still.append(i)
        open_ = still
    for i, search in enumerate(searches):
        if not search.bound:
            search.capacity = bounds[i][0]
    return searches


def static_grid(profile: Profile) -> list[str]:
    """The static configurations the tuning tries first (see the module doc)."""
    n_star = profile.realtime_concurrency()
    prompt = profile.workload.mean_prompt_tokens()
    out: list[str] = []
    for n in range(max(1, n_star - 3), n_star + 2):
        out.append(f"cap:{n}")
        out.extend(f"queued:{n}:{n + extra}" for extra in QUEUE_EXTRA)
        out.extend(f"tokens:{n}:{math.ceil(k * prompt)}" for k in PROMPTS)
    return out


def tune(
    measure: Callable[[Iterable[Point]], list[float]],
    points_of: Callable[[str], list[Point]],
    grid: Sequence[str],
) -> list[tuple[float, str]]:
    """Every configuration of `grid` and chunked prefill on the best of them, by mean goodput
    over their points (`points_of(policy)`, measured by `measure`), best first."""
    ranked = _ranked(measure, points_of, grid)
    chunked = [f"{label}+{c}" for _, label in ranked[:CHUNKED_ON] for c in CHUNKED]
    return _best_first([*ranked, *_ranked(measure, points_of, chunked)])


def _best_first(ranked: list[tuple[float, str]]) -> list[tuple[float, str]]:
    """By mean goodput, best first; on a tie, the configuration with fewer flags first."""
    return sorted(ranked, key=lambda item: (-item[0], item[1].count("+"), item[1]))


def _ranked(
    measure: Callable[[Iterable[Point]], list[float]],
    points_of: Callable[[str], list[Point]],
    labels: Sequence[str],
) -> list[tuple[float, str]]:
    per = [points_of(label) for label in labels]
    flat = measure(p for points in per for p in points)
    out: list[tuple[float, str]] = []
    start = 0
    for label, points in zip(labels, per, strict=True):
        out.append((statistics.fmean(flat[start : start + len(points)]), label))
        start += len(points)
    return _best_first(out)


def run_searches(args: Any, say: TextIO) -> list[dict[str, Any]]:
    """`closed_loop.py --tune-static` and `--slo-capacity`: print and return their rows."""
    rows: list[dict[str, Any]] = []
    common = {
        "mode": "virtual",
        "profile": args.profile_used.name,
        "lengths": args.lengths,
        "duration_s": args.duration,
        "start_slo_ms": args.start_slo_ms,
        "gap_slo_ms": args.gap_slo_ms,
        "seeds": args.seeds,
    }

    def point(label: str, scene: Scenario, load: float, seed: int) -> Point:
        return Point(
            args.profile_used,
            args.engine_profile,
            label,
            scene,
            load,
            seed,
            args.duration,
            args.lengths == "known",
            args.start_slo_ms,
        )

    with Runner(args.jobs) as runner:
        if args.tune_static:

            def points_of(label: str) -> list[Point]:
                return [
                    point(label, scene, load, seed)
                    for scene in args.scenarios
                    for load in args.load_list
                    for seed in args.seed_list
                ]

            ranked = tune(runner.run, points_of, static_grid(args.profile_used))
            rows.append(
                {
                    "kind": "tuned",
                    **common,
                    "policy": ranked[0][1],
                    "mean_goodput": round(ranked[0][0], 4),
                    "scenarios": [scene.name for scene in args.scenarios],
                    "loads": args.load_list,
                    "ranking": [[label, round(mean, 4)] for mean, label in ranked],
                }
            )
            print(json.dumps(rows[-1]), file=say, flush=True)
        for target in args.slo_targets:
            base = [
                point(setting.label, scene, 1.0, seed)
                for setting in args.policies
                for scene in args.scenarios
                for seed in args.seed_list
            ]
            searches = slo_capacities(
                runner.run,
                base,
                target,
                low=args.slo_low,
                high=args.slo_high,
                tolerance=args.slo_tolerance,
            )
            for at, search in zip(base, searches, strict=True):
                rows.append(
                    {
                        "kind": "slo_capacity",
                        **common,
                        "policy": at.policy,
                        "scenario": at.scenario.name,
                        "scenario_params": at.scenario.describe(),
                        "seed": at.seed,
                        "target": target,
                        "slo_capacity": search.capacity,
                        "bound": search.bound,
                        "tried": sorted([load, round(g, 4)] for load, g in search.tried.items()),
                    }
                )
                print(json.dumps(rows[-1]), file=say, flush=True)
    return rows
