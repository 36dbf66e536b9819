"""What an operator would configure, and the load a box serves within its SLO.

**SLO capacity** (`slo_capacities`): the highest load (a share of the profile's estimated
capacity) at which at least `target` of the offered requests are good: DistServe's goodput,
the rate a box can be sized for. Found by bisection over load for each seed
(`_slo_capacity.Bisection`, the real engine's search too), many searches side by side.

**The tuned static configuration** (`static_grid`, `tune`): the one line of vLLM flags an
operator could set without edgemon (`--max-num-seqs N` with `--max-num-queued-reqs M`, or
with `--max-num-queued-tokens T`, and chunked prefill's `--max-num-batched-tokens B
--long-prefill-token-threshold L`), chosen by the best mean goodput across the scenarios and
loads on training seeds. The grid: N from N*−3 to N*+1 (widened two at a time while the
best N lies on its edge); M − N in {0, 2, 4, 8, 16} and no M; T in {1, 2, 4, 8} mean prompts;
then chunked prefill (B 128 or 256, with 256 a threshold L of a quarter or half the mean
prompt) on the three best of those.

Runs go to a process pool (`jobs`), each a pure virtual run: the figures do not depend on
how many run at once.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from _points import Point, Runner
from _slo_capacity import Bisection

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from typing import TextIO

    from edgemon.simulate.profiles import Profile
    from edgemon.simulate.scenarios import Scenario

QUEUE_EXTRA = (0, 2, 4, 8, 16)
"""`--max-num-queued-reqs` − `--max-num-seqs` on the grid."""
PROMPTS = (1, 2, 4, 8)
"""`--max-num-queued-tokens` on the grid, in mean prompts."""


def chunked_settings(profile: Profile) -> list[str]:
    """Chunked prefill's settings, tried on the best of the rest: a token budget of 128 or 256,
    and with 256 a long-prefill threshold of a quarter or half the mean prompt."""
    prompt = profile.workload.mean_prompt_tokens()
    thresholds = (math.ceil(prompt / 4), math.ceil(prompt / 2))
    return ["chunked:128", "chunked:256", *(f"chunked:256:{t}" for t in thresholds)]


CHUNKED_ON = 3
"""How many of the best configurations chunked prefill is tried on."""


def slo_capacities(
    measure: Callable[[Iterable[Point]], list[float]],
    base: Sequence[Point],
    target: float,
    *,
    low: float,
    high: float,
    tolerance: float,
) -> list[Bisection]:
    """Each base point's SLO capacity at `target` (`_slo_capacity.Bisection`; their `load`
    is replaced), the searches run side by side so that each round is one batch of runs."""
    searches = [Bisection(target, low, high, tolerance) for _ in base]
    while asked := [(i, load) for i, s in enumerate(searches) if (load := s.next_load())]:
        found = measure(replace(base[i], load=load) for i, load in asked)
        for (i, load), got in zip(asked, found, strict=True):
            searches[i].record(load, got)
    return searches


def static_grid(profile: Profile, sizes: Iterable[int] | None = None) -> list[str]:
    """The static configurations the tuning tries first, for each batch size N of `sizes`
    (default N*−3 to N*+1; see the module doc)."""
    n_star = profile.realtime_concurrency()
    prompt = profile.workload.mean_prompt_tokens()
    out: list[str] = []
    for n in range(max(1, n_star - 3), n_star + 2) if sizes is None else sizes:
        out.append(f"cap:{n}")
        out.extend(f"queued:{n}:{n + extra}" for extra in QUEUE_EXTRA)
        out.extend(f"tokens:{n}:{math.ceil(k * prompt)}" for k in PROMPTS)
    return out


def tune(
    measure: Callable[[Iterable[Point]], list[float]],
    points_of: Callable[[str], list[Point]],
    profile: Profile,
) -> list[tuple[float, str]]:
    """The grid of `profile`, widened by two batch sizes at a time while the best
    configuration's `--max-num-seqs` lies on its edge, then chunked prefill on the three best;
    every configuration by mean goodput over its points (`points_of(policy)`, measured by
    `measure`), best first."""
    n_star = profile.realtime_concurrency()
    sizes = list(range(max(1, n_star - 3), n_star + 2))
    ranked = _ranked(measure, points_of, static_grid(profile, sizes))
    while True:
        best = _batch_size(ranked[0][1])
        wider = [n for n in (best - 2, best - 1, best + 1, best + 2) if n >= 1 and n not in sizes]
        if not wider or min(sizes) < best < max(sizes):
            break
        sizes += wider
        ranked = _best_first([*ranked, *_ranked(measure, points_of, static_grid(profile, wider))])
    options = chunked_settings(profile)
    chunked = [f"{label}+{c}" for _, label in ranked[:CHUNKED_ON] for c in options]
    return _best_first([*ranked, *_ranked(measure, points_of, chunked)])


def _batch_size(label: str) -> int:
    """The `--max-num-seqs` of a static configuration (`cap:N`, `queued:N:M`, `tokens:N:T`)."""
    return int(label.split("+", 1)[0].split(":", 2)[1])


def _best_first(ranked: list[tuple[float, str]]) -> list[tuple[float, str]]:
    """By mean goodput, best first; within a tenth of a point, the configuration with fewer
    flags first."""
    return sorted(ranked, key=lambda item: (-round(item[0], 3), item[1].count("+"), item[1]))


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


def point_of(args: Any, label: str, scene: Scenario, load: float, seed: int) -> Point:
    """The run of `closed_loop.py`'s arguments `args` with this policy, scenario, load and
    seed."""
    return Point(
        args.profile_used,
        label,
        scene,
        load,
        seed,
        args.duration,
        lengths_known=args.lengths == "known",
        start_slo_ms=args.start_slo_ms,
        gap_slo_ms=args.gap_slo_ms,
        drain=args.drain,
        measured=args.steps is not None,
    )


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
        return point_of(args, label, scene, load, seed)

    with Runner(args.jobs) as runner:
        if args.tune_static:

            def points_of(label: str) -> list[Point]:
                return [
                    point(label, scene, load, seed)
                    for scene in args.scenarios
                    for load in args.load_list
                    for seed in args.seed_list
                ]

            ranked = tune(runner.goodput, points_of, args.profile_used)
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
                runner.goodput,
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
                        **search.fields(),
                    }
                )
                print(json.dumps(rows[-1]), file=say, flush=True)
    return rows
