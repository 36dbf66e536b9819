"""The demo's closed loop: two simulated TTS boxes, one request stream, one obeys edgemon.

Both boxes run the same engine model (`--profile`) on the same seeded requests, at `--load`
times the profile's estimated capacity. Their players report every chunk through a real
`edgemon.client.Reporter`; edgemon (the demo's daemon) judges both and publishes a throttle for
both. `loop-closed` reads it through a real `ThrottleGate` and holds new prefills while it
says so; `loop-open` ignores it. The players score silence on their own clocks (before the
first word, from the request to the playback start; and in mid-sentence gaps) and each
request's outcome against the start and gap SLOs (good, late, gappy, shed, unfinished), so
the summary compares goodput and what listeners heard with the loop closed and open, for one
seed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgemon.simulate.engine import TtsEngine
from edgemon.simulate.figures import outcome_fields
from edgemon.simulate.players import Delivery
from edgemon.simulate.realtime import Box, wall_ms
from edgemon.simulate.workload import Arrivals

if TYPE_CHECKING:
    from edgemon.client import Reporter, ThrottleGate
    from edgemon.simulate.players import Score
    from edgemon.simulate.profiles import Profile

OPEN = "loop-open"
CLOSED = "loop-closed"
DEVICES = (OPEN, CLOSED)
#: Client threads get this long to flush and disconnect at the end.
CLOSE_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopPlan:
    """What the two boxes serve."""

    profile: Profile
    load: float
    seed: int
    max_hold_ms: float

    @property
    def rate_rps(self) -> float:
        """Requests per second."""
        return self.load * self.profile.capacity_rps()


class LoopBoxes:
    """The two boxes with their reporters and the closed one's gate; `run` serves, then closes."""

    __slots__ = ("boxes", "gate", "plan", "reporters")

    def __init__(self, plan: LoopPlan, broker_url: str, topic_prefix: str) -> None:
        from edgemon.client import Reporter, ThrottleGate  # noqa: PLC0415 - paho loads here

        self.plan = plan
        self.reporters: dict[str, Reporter] = {}
        self.gate: ThrottleGate | None = None
        self.boxes: dict[str, Box] = {}
        try:
            self.gate = ThrottleGate(
                broker_url,
                CLOSED,
                max_hold_ms=plan.max_hold_ms,
                topic_prefix=topic_prefix,
                client_id=f"edgemon-demo-gate-{plan.seed}",
            ).open()
            for device in DEVICES:
                reporter = Reporter(
                    broker_url,
                    device,
                    topic_prefix=topic_prefix,
                    client_id=f"edgemon-demo-{device}-{plan.seed}",
                ).open()
                self.reporters[device] = reporter
                gate = self.gate.should_throttle_prefills if device == CLOSED else None
                admitted = self.gate.admitted if device == CLOSED else None
                self.boxes[device] = Box(
                    device=device,
                    engine=TtsEngine(plan.profile, gate=gate, admitted=admitted),
                    arrivals=Arrivals(plan.rate_rps, plan.profile.workload, seed=plan.seed),
                    delivery=Delivery(
                        plan.profile.network_ms, plan.profile.network_jitter_ms, plan.seed
                    ),
                    reporter=reporter,
                    margin_ms=plan.profile.margin_ms,
                )
        except BaseException:
            self.close()
            raise

    async def run(self, duration_s: float, stop: asyncio.Event) -> dict[str, Score]:
        """Serve for `duration_s` (or until `stop`); close the clients; each box's score."""
        origin = wall_ms()
        try:
            scores = await asyncio.gather(
                *(box.run(duration_s, stop, origin_ms=origin) for box in self.boxes.values())
            )
        finally:
            await asyncio.to_thread(self.close)
        return dict(zip(self.boxes, scores, strict=True))

    def close(self) -> None:
        """Flush and disconnect every client (idempotent)."""
        for reporter in self.reporters.values():
            reporter.close(CLOSE_TIMEOUT_S)
        if self.gate is not None:
            self.gate.close(CLOSE_TIMEOUT_S)

    def prefills(self) -> dict[str, str]:
        """Per box, for the live view: is its engine holding new prefills right now?"""
        return {
            device: "ignored" if device == OPEN else "held" if box.status.held else "admitting"
            for device, box in self.boxes.items()
        }

    def held_s(self) -> float:
        """Seconds the closed box's gate held admissions."""
        return 0.0 if self.gate is None else self.gate.stats.held_s


def summary_lines(plan: LoopPlan, scores: dict[str, Score], held_s: float) -> list[str]:
    """The comparison for people: the loop open next to closed, same seed."""
    profile = plan.profile
    title = (
        f"  the loop, same requests (seed {plan.seed}) on two {profile.name} boxes at "
        f"{plan.load:.0%} of estimated capacity ({plan.rate_rps:.2f} req/s):"
    )
    first = scores[DEVICES[0]]
    slos = (
        f"  goodput: the share of requests that start within {first.start_slo_ms:g} ms "
        f"(request → playback, prebuffer included) with no gap over {first.gap_slo_ms:g} ms"
    )
    outcomes = (
        f"  {'box':<12} {'goodput':>8} {'good':>5} {'late':>5} {'gappy':>6} {'shed':>5} "
        f"{'unfinished':>11}"
    )
    header = (
        f"  {'box':<12} {'requests':>8} {'start silence':>14} {'start p99':>10} "
        f"{'gap silence':>12} {'gaps':>5} {'total silence':>14} {'TTFA p99':>9} {'held s':>7}"
    )
    lines = [title, slos, outcomes]
    for device in DEVICES:
        score = scores[device]
        lines.append(
            f"  {device:<12} {score.goodput:>8.0%} {score.good:>5} {score.late:>5} "
            f"{score.gappy:>6} {score.shed:>5} {score.unfinished:>11}"
        )
    lines.append(header)
    for device in DEVICES:
        score = scores[device]
        held = f"{held_s:7.1f}" if device == CLOSED else f"{'–':>7}"
        lines.append(
            f"  {device:<12} {score.requests:>8} {score.start_silence_s:>12.1f} s "
            f"{_ms(score.start_silence_p99_ms):>10} {score.gap_silence_s:>10.1f} s "
            f"{score.gaps:>5} {score.total_silence_s:>12.1f} s "
            f"{_ms(score.ttfa_p99_ms):>9} {held}"
        )
    opened, closed = scores[OPEN], scores[CLOSED]
    if opened.underrun_s > 0:
        lines.append(f"  closing the loop {_change(opened.underrun_s, closed.underrun_s)}")
    lines.append(
        "  silence before the first word "
        f"{opened.start_silence_s:.1f} s → {closed.start_silence_s:.1f} s, in mid-sentence gaps "
        f"{opened.gap_silence_s:.1f} s → {closed.gap_silence_s:.1f} s, in all "
        f"{opened.total_silence_s:.1f} s → {closed.total_silence_s:.1f} s (open → closed)"
    )
    return lines


def _change(opened_s: float, closed_s: float) -> str:
    """What closing the loop did to underrun time (gap silence), in words (no "cut by
    -0%")."""
    cut = round(1.0 - closed_s / opened_s, 2)
    if cut > 0:
        return f"cut underrun time by {cut:.0%} for this seed"
    if cut < 0:
        return f"added {-cut:.0%} to underrun time for this seed"
    return "left underrun time as it was for this seed"


def summary_json(plan: LoopPlan, scores: dict[str, Score], held_s: float) -> dict[str, Any]:
    """The same, for the summary's JSON line."""
    out: dict[str, Any] = {
        "profile": plan.profile.name,
        "load": plan.load,
        "rate_rps": round(plan.rate_rps, 3),
        "held_s": round(held_s, 3),
    }
    for device, score in scores.items():
        out[device] = {
            "requests": score.requests,
            "streams": score.streams,
            "completed": score.completed,
            "underruns": score.underruns,
            "underruns_per_stream_minute": round(score.underruns_per_stream_minute, 3),
            "underrun_s": round(score.underrun_s, 3),
            "ttfa_p50_ms": _round(score.ttfa_p50_ms),
            "ttfa_p99_ms": _round(score.ttfa_p99_ms),
            "start_silence_s": round(score.start_silence_s, 3),
            "start_silence_p50_ms": _round(score.start_silence_p50_ms),
            "start_silence_p99_ms": _round(score.start_silence_p99_ms),
            "gap_silence_s": round(score.gap_silence_s, 3),
            "gaps": score.gaps,
            "total_silence_s": round(score.total_silence_s, 3),
            **outcome_fields(score),
        }
    return out


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f} ms"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
