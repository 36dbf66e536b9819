"""The demo's closed loop: simulated TTS boxes, one request stream, each serving a policy.

Three boxes run the same engine model (`--profile`) on the same seeded requests, at `--load`
times the profile's estimated capacity:

- `loop-open`: vLLM's own scheduling, as it ships (no admission limit);
- `loop-static`: the one line of vLLM's flags an operator would set without edgemon
  (`--max-num-seqs N --max-num-queued-reqs N`, N the batch whose step fits a frame: what the
  static tuning finds best, docs/explanation/does-it-help.md);
- `loop-edgemon`: the policy edgemon ships (`edgemon.simulate.policies.EDGEMON`; a gate on
  edgemon's throttle, through a real `ThrottleGate`, when that policy obeys it).

Their players report every chunk through a real `edgemon.client.Reporter`, and edgemon (the
demo's daemon) watches all three. The players score each request's outcome against the
start and gap SLOs (good, late, gappy, shed) on their own clocks, so the summary compares
goodput and what listeners heard for one seed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgemon.simulate.figures import outcome_fields
from edgemon.simulate.players import Delivery
from edgemon.simulate.policies import policy
from edgemon.simulate.realtime import Box, wall_ms
from edgemon.simulate.served import ServedEngine
from edgemon.simulate.workload import Arrivals

if TYPE_CHECKING:
    from edgemon.client import Reporter, ThrottleGate
    from edgemon.simulate.players import Score
    from edgemon.simulate.policies import Policy
    from edgemon.simulate.profiles import Profile

OPEN = "loop-open"
STATIC = "loop-static"
EDGEMON = "loop-edgemon"
DEVICES = (OPEN, STATIC, EDGEMON)
#: Client threads get this long to flush and disconnect at the end.
CLOSE_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopPlan:
    """What the boxes serve."""

    profile: Profile
    load: float
    seed: int

    @property
    def rate_rps(self) -> float:
        """Requests per second."""
        return self.load * self.profile.capacity_rps()

    def policies(self) -> dict[str, Policy]:
        """Each box's policy."""
        n = self.profile.realtime_concurrency()
        texts = {OPEN: "open", STATIC: f"queued:{n}:{n}", EDGEMON: "edgemon"}
        return {device: policy(text, self.profile) for device, text in texts.items()}


class LoopBoxes:
    """The boxes with their reporters and, if its policy obeys it, edgemon's box's gate;
    `run` serves, then closes."""

    __slots__ = ("boxes", "gate", "plan", "reporters")

    def __init__(self, plan: LoopPlan, broker_url: str, topic_prefix: str) -> None:
        self.plan = plan
        self.reporters: dict[str, Reporter] = {}
        self.gate: ThrottleGate | None = None
        self.boxes: dict[str, Box] = {}
        try:
            for device, served in plan.policies().items():
                self._add(device, served, broker_url, topic_prefix)
        except BaseException:
            self.close()
            raise

    def _add(self, device: str, served: Policy, broker_url: str, topic_prefix: str) -> None:
        """The box `device`: its reporter, its gate if its policy obeys one, its engine."""
        from edgemon.client import Reporter, ThrottleGate  # noqa: PLC0415 - paho loads here

        plan, profile = self.plan, self.plan.profile
        gate = None
        if served.gated:
            gate = self.gate = ThrottleGate(
                broker_url,
                device,
                max_hold_ms=served.max_hold_ms,
                topic_prefix=topic_prefix,
                client_id=f"edgemon-demo-gate-{plan.seed}",
            ).open()
        reporter = self.reporters[device] = Reporter(
            broker_url,
            device,
            topic_prefix=topic_prefix,
            client_id=f"edgemon-demo-{device}-{plan.seed}",
        ).open()
        self.boxes[device] = Box(
            device=device,
            engine=ServedEngine(
                profile,
                served,
                gate=None if gate is None else gate.should_throttle_prefills,
                admitted=None if gate is None else gate.admitted,
            ),
            arrivals=Arrivals(plan.rate_rps, profile.workload, seed=plan.seed),
            delivery=Delivery(profile.network_ms, profile.network_jitter_ms, plan.seed),
            reporter=reporter,
            margin_ms=profile.margin_ms,
        )

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
            device: "held" if box.status.held else "admitting" for device, box in self.boxes.items()
        }

    def held_s(self) -> float:
        """Seconds edgemon's box's gate held admissions (0 without a gate)."""
        return 0.0 if self.gate is None else self.gate.stats.held_s


def summary_lines(plan: LoopPlan, scores: dict[str, Score], held_s: float) -> list[str]:
    """The comparison for people: the three boxes, same seed."""
    profile = plan.profile
    first = scores[DEVICES[0]]
    served = plan.policies()
    lines = [
        f"  the loop, same requests (seed {plan.seed}) on three {profile.name} boxes",
        f"  at {plan.load:.0%} of estimated capacity ({plan.rate_rps:.2f} req/s):",
        (
            f"  goodput: the share of requests that start playing within "
            f"{first.start_slo_ms:g} ms of the request"
        ),
        f"  (prebuffer included) and never go silent for more than {first.gap_slo_ms:g} ms",
        f"  {'box':<13} {'goodput':>8} {'good':>5} {'late':>5} {'gappy':>6} {'shed':>5}  policy",
    ]
    for device in DEVICES:
        score = scores[device]
        lines.append(
            f"  {device:<13} {score.goodput:>8.0%} {score.good:>5} {score.late:>5} "
            f"{score.gappy:>6} {score.shed:>5}  {_describe(served[device])}"
        )
    lines.append(
        f"  {'box':<13} {'start silence':>14} {'start p99':>10} {'gap silence':>12} "
        f"{'total silence':>14}"
    )
    for device in DEVICES:
        score = scores[device]
        lines.append(
            f"  {device:<13} {score.start_silence_s:>12.1f} s "
            f"{_ms(score.start_silence_p99_ms):>10} {score.gap_silence_s:>10.1f} s "
            f"{score.total_silence_s:>12.1f} s"
        )
    static, mine = scores[STATIC], scores[EDGEMON]
    if held_s:
        lines.append(f"  edgemon's gate held admissions {held_s:.1f} s")
    lines.append(
        f"  edgemon against vLLM's own flags: goodput {static.goodput:.0%} → "
        f"{mine.goodput:.0%} ({100 * (mine.goodput - static.goodput):+.0f} points) for this "
        "seed"
    )
    return lines


def _describe(served: Policy) -> str:
    """How a box's policy reads on vLLM's command line, or what it is."""
    if served.kind == "open":
        return "vLLM's defaults"
    if served.kind == "cap":
        return f"--max-num-seqs {served.max_num_seqs} {served.serving.flags()}".strip()
    return "edgemon: real-time, start deadlines, shedding"


def summary_json(plan: LoopPlan, scores: dict[str, Score], held_s: float) -> dict[str, Any]:
    """The same, for the summary's JSON line."""
    out: dict[str, Any] = {
        "profile": plan.profile.name,
        "load": plan.load,
        "rate_rps": round(plan.rate_rps, 3),
        "held_s": round(held_s, 3),
        "policies": {device: p.label for device, p in plan.policies().items()},
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
