"""The closed-loop benchmark's figures: one JSON row per run, one dump line per request.

A row (the contract of `benchmarks/closed_loop.py`): `policy`, `scenario`, `load`, `seed`,
`requests`, `completed`; `start_silence_s`, `start_silence_p50_ms`, `start_silence_p99_ms`,
`ttfa_p50_ms`, `ttfa_p99_ms`; `gap_silence_s`, `gaps`, `total_silence_s`; and besides them
`mode`, `profile`, `duration_s`, `gaps_per_stream_min`; and the service level against the
SLOs (`start_slo_ms`, `gap_slo_ms`): `offered`, `good`, `late`, `gappy`, `shed`,
`unfinished`, `goodput` (good / offered), `shed_p99_ms` (how long refusals took to reach the
player), `longest_gap_p95_ms`. Start silence figures leave refused requests out. A dump line
lets anyone recompute them: `policy`, `scenario`, `seed`, `request`, `requested_ms`,
`play_start_ms` (null if playback never started), `chunks` (`[arrival_ms, audio_ms]` each),
`final`, `end_ms`, `start_ms` (start silence), `longest_gap_ms`, `shed_ms` (how long the
refusal took; null if not refused) and `outcome` (`good`, `late`, `gappy`, `shed`,
`unfinished`).

`run_virtual` runs one point on the virtual clock (`edgemon.simulate.loop`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgemon.policy.deadlines import GAP_SLO_MS, START_SLO_MS
from edgemon.simulate.loop import LoopPlan, LoopResult, run_loop

if TYPE_CHECKING:
    from collections.abc import Iterable

    from edgemon.simulate.players import Player, Score
    from edgemon.simulate.policies import Policy
    from edgemon.simulate.profiles import Profile
    from edgemon.simulate.scenarios import Scenario


def run_virtual(  # noqa: PLR0913 - keyword-only knobs of one run
    profile: Profile,
    policy: Policy,
    scenario: Scenario,
    *,
    rate_rps: float,
    seed: int,
    duration_s: float,
    start_slo_ms: float = START_SLO_MS,
    gap_slo_ms: float = GAP_SLO_MS,
    lengths_known: bool = False,
    drain: bool = True,
) -> LoopResult:
    """One run of `policy` under `scenario` with `rate_rps` requests a second, its players
    scored against the start and gap SLOs (`lengths_known`, `drain`: as `LoopPlan`'s)."""
    return run_loop(
        LoopPlan(
            profile=profile,
            rate_rps=rate_rps,
            seed=seed,
            duration_ms=duration_s * 1000.0,
            policy=policy,
            scenario=scenario,
            start_slo_ms=start_slo_ms,
            gap_slo_ms=gap_slo_ms,
            lengths_known=lengths_known,
            drain=drain,
        )
    )


def row(
    score: Score,
    *,
    mode: str,
    profile: str,
    policy: str,
    scenario: str,
    load: float,
    seed: int,
    duration_s: float,
) -> dict[str, Any]:
    """A run's JSON row."""
    return {
        "mode": mode,
        "profile": profile,
        "policy": policy,
        "scenario": scenario,
        "load": load,
        "seed": seed,
        "duration_s": duration_s,
        "requests": score.requests,
        "completed": score.completed,
        "start_silence_s": round(score.start_silence_s, 3),
        "start_silence_p50_ms": _round(score.start_silence_p50_ms),
        "start_silence_p99_ms": _round(score.start_silence_p99_ms),
        "ttfa_p50_ms": _round(score.ttfa_p50_ms),
        "ttfa_p99_ms": _round(score.ttfa_p99_ms),
        "gap_silence_s": round(score.gap_silence_s, 3),
        "gaps": score.gaps,
        "gaps_per_stream_min": round(score.underruns_per_stream_minute, 3),
        "total_silence_s": round(score.total_silence_s, 3),
        **outcome_fields(score),
        "longest_gap_p95_ms": _round(score.longest_gap_p95_ms),
    }


def outcome_fields(score: Score) -> dict[str, Any]:
    """The SLOs a run was judged by, each outcome's count and the goodput (rows and the demo's
    summary)."""
    return {
        "start_slo_ms": score.start_slo_ms,
        "gap_slo_ms": score.gap_slo_ms,
        "offered": score.offered,
        "good": score.good,
        "late": score.late,
        "gappy": score.gappy,
        "shed": score.shed,
        "unfinished": score.unfinished,
        "goodput": round(score.goodput, 4),
        "shed_p99_ms": _round(score.shed_p99_ms),
    }


def dump_lines(
    players: Iterable[Player],
    *,
    policy: str,
    scenario: str,
    seed: int,
    origin_ms: float,
    end_ms: float,
    start_slo_ms: float = START_SLO_MS,
    gap_slo_ms: float = GAP_SLO_MS,
) -> list[dict[str, Any]]:
    """One line per request; times in ms since the run's start (`origin_ms`)."""
    return [
        {
            "policy": policy,
            "scenario": scenario,
            "seed": seed,
            "request": player.stream,
            "requested_ms": round(player.requested_ms - origin_ms, 3),
            "play_start_ms": None
            if player.start_ms is None
            else round(player.start_ms - origin_ms, 3),
            "chunks": [[round(t - origin_ms, 3), audio] for t, audio in player.arrivals],
            "final": player.final,
            "end_ms": round(end_ms - origin_ms, 3),
            "start_ms": round(player.start_silence_ms(end_ms), 3),
            "longest_gap_ms": round(player.longest_gap_ms, 3),
            "shed_ms": None if player.shed_latency_ms is None else round(player.shed_latency_ms, 3),
            "outcome": player.outcome(end_ms, start_slo_ms=start_slo_ms, gap_slo_ms=gap_slo_ms),
        }
        for player in players
    ]


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
