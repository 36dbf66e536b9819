"""An engine serving a policy: the simulated engine with the policy's measured parts.

`ServedEngine` builds, from a `Policy` (`edgemon.simulate.policies`), the simulated engine
(`TtsEngine`) with what the policy adds: a static cap and vLLM's other flags, the peers'
pacing, edgemon's gate (a callable the caller owns: the virtual loop's `HoldGate`, or a real
`ThrottleGate`), real-time admission and the deadline policy. Real-time admission learns
from the steps, so `step` feeds it each one, as the vLLM schedulers do. The virtual loop
(`edgemon.simulate.loop`) and the demo's boxes in real time (`edgemon.cli.demo_loop`) serve
through it, so a policy is built one way wherever it runs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from edgemon.policy.deadlines import OPEN, START_SLO_MS, Deadlines
from edgemon.policy.realtime import RealtimeAdmission
from edgemon.simulate.engine import DeadlineHook, TtsEngine
from edgemon.simulate.parked import FedParking
from edgemon.simulate.players import PLAYER_CUSHION_MS

if TYPE_CHECKING:
    from collections.abc import Callable

    from edgemon.engine.feed import SlackEntry
    from edgemon.policy.deadlines import Throttle
    from edgemon.simulate.engine import Step
    from edgemon.simulate.estimated import Pacing
    from edgemon.simulate.policies import Policy
    from edgemon.simulate.profiles import Profile
    from edgemon.simulate.workload import Request


def prebuffer_ms(profile: Profile) -> float:
    """The fixed part of what the players' first audio still needs after the engine made it:
    the delivery (median plus mean jitter) and the player's cushion (its wait for the second
    chunk is the deadline policy's `second_chunk_frames`)."""
    return profile.network_ms + profile.network_jitter_ms + PLAYER_CUSHION_MS


class ServedEngine:
    """The simulated engine with `policy`'s parts; see the module doc.

    `gate`: edgemon's gate, asked at every step with requests waiting (used only when the
    policy obeys it); `throttle`: edgemon's throttle state as the deadline policy sees it;
    the rest as `TtsEngine` takes them.
    """

    __slots__ = ("deadlines", "engine", "realtime")

    def __init__(  # noqa: PLR0913 - keyword-only parts, each the caller's
        self,
        profile: Profile,
        policy: Policy,
        *,
        start_slo_ms: float = START_SLO_MS,
        gate: Callable[[], bool] | None = None,
        admitted: Callable[[], None] | None = None,
        throttle: Callable[[], Throttle] = lambda: OPEN,
        fits: Callable[[Request, int], bool] | None = None,
        step_factor: Callable[[float], float] | None = None,
        lengths_known: bool = False,
        measured: Callable[[str], SlackEntry | None] = lambda _stream: None,
    ) -> None:
        frames = policy.realtime_frames
        self.realtime = RealtimeAdmission(profile.frame_ms * frames) if policy.realtime else None
        self.deadlines = _deadlines(profile, policy, start_slo_ms, self.realtime)
        self.engine = TtsEngine(
            profile,
            gate=gate if policy.gated else None,
            admitted=admitted,
            fits=fits,
            max_num_seqs=policy.max_num_seqs,
            seats=None if self.realtime is None else self.realtime.admissible,
            step_factor=step_factor,
            deadlines=None if self.deadlines is None else DeadlineHook(self.deadlines, throttle),
            lengths_known=lengths_known,
            serving=policy.serving,
            pacing=self._pacing(profile, policy, start_slo_ms, measured),
        )

    def _pacing(
        self,
        profile: Profile,
        policy: Policy,
        start_slo_ms: float,
        measured: Callable[[str], SlackEntry | None],
    ) -> Pacing | None:
        """The peers' pacing, or edgemon's parking on its feed (`measured`: a stream's entry
        in edgemon's slack feed, None if not in it), if the policy has either."""
        if policy.pacing is not None:
            return policy.pacing.make(start_slo_ms)
        if policy.parking is None:
            return None
        return FedParking(
            policy.parking,
            measured=measured,
            step_ms=lambda: self.engine.step_estimate_ms,
            margin_ms=profile.margin_ms,
            delivery_ms=profile.network_ms + profile.network_jitter_ms,
        )

    @property
    def waiting(self) -> int:
        """Requests not yet admitted."""
        return self.engine.waiting

    @property
    def running(self) -> int:
        """Requests admitted and not finished."""
        return self.engine.running

    def submit(self, request: Request, now_ms: float | None = None) -> bool:
        """Queue `request`; False if it was refused at once."""
        return self.engine.submit(request, now_ms)

    def refused(self) -> list[str]:
        """The waiting requests refused since the last call."""
        return self.engine.refused()

    def step(self, now_ms: float) -> Step | None:
        """One step of the engine, which real-time admission then learns from."""
        step = self.engine.step(now_ms)
        if step is not None and self.realtime is not None:
            self.realtime.observe(step.decode_seqs, step.prefill_tokens, step.ms)
        return step


def _deadlines(
    profile: Profile, policy: Policy, start_slo_ms: float, realtime: RealtimeAdmission | None
) -> Deadlines | None:
    """The policy's deadline part, told what the profile's engine and players do."""
    if policy.deadlines is None:
        return None
    settings = replace(
        policy.deadlines,
        start_slo_ms=start_slo_ms,
        prebuffer_ms=prebuffer_ms(profile),
        first_chunk_frames=profile.chunk_size(0),
        second_chunk_frames=profile.chunk_size(1),
        token_budget=policy.serving.max_num_batched_tokens or profile.max_num_batched_tokens,
        frame_ms=profile.frame_ms,
    )
    cap = profile.max_num_seqs if policy.max_num_seqs is None else policy.max_num_seqs
    return Deadlines(settings, realtime, max_num_seqs=cap)
