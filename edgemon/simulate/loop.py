"""The whole loop on a virtual clock: engine, network, players, edgemon's monitor, the gate.

Pure and deterministic, for tests and for choosing loads: a run of minutes takes a fraction of
a second. It drives the same parts the demo and the benchmark run in real time, except the two
ends that need a broker: what a `Reporter` would publish is handed to edgemon's `Monitor`
after `report_latency_ms`, and edgemon's throttle changes reach a `HoldGate` (the
`ThrottleGate` rules, `edgemon.simulate.hold_gate`) after `gate_latency_ms`. A policy fed what
the players measured (`feed:measured`, `park:measured`) gets edgemon's slack feed every
`FEED_PERIOD_MS`, one `gate_latency_ms` after edgemon published it.

What the engine does besides (`LoopPlan`): a static cap (`max_num_seqs`), a release after
`max_hold_ms` that lasts until a step admits a waiting request or the queue is empty
(`lasting`), real-time admission (`realtime`: `edgemon.policy.realtime`, the code the
vLLM scheduler runs, fed the simulated steps), the deadline policy (`deadlines`:
`edgemon.policy.deadlines`, fed the same real-time admission and edgemon's throttle
objects: it may refuse a request when the engine first sees it, or later while it waits), and
a `Scenario` (a slowdown, bursts, a slow network: `edgemon.simulate.scenarios`).

A refusal reaches its player one network delay after the engine decided (an HTTP 503 on its
way back); the player counts the request `shed` with how long that took, and reports its end
(`refused`) to edgemon. Players are scored against the start and gap SLOs of the plan. The
scenario's listeners (`edgemon.simulate.listeners`) pause, stall or prebuffer on the players'
side, and their Reporters say so with each chunk's `play_start_ms`.
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgemon.engine import EngineConfig
from edgemon.engine.feed import SlackEntry, slack_feed
from edgemon.engine.outputs import ThrottleChanged
from edgemon.monitor import Monitor
from edgemon.policy.deadlines import GAP_SLO_MS, START_SLO_MS, Throttle
from edgemon.protocol import NOT_STARTED_MS
from edgemon.simulate.budget import SpendableBudget
from edgemon.simulate.hold_gate import HoldGate
from edgemon.simulate.listeners import NO_PLAN
from edgemon.simulate.players import Delivery, Player, Score, score
from edgemon.simulate.policies import OPEN_POLICY, Policy
from edgemon.simulate.scenarios import STEADY, RequestSource
from edgemon.simulate.served import ServedEngine

if TYPE_CHECKING:
    from collections.abc import Callable

    from edgemon.engine.outputs import Output
    from edgemon.simulate.engine import Chunk
    from edgemon.simulate.listeners import ListenerPlan
    from edgemon.simulate.profiles import Profile
    from edgemon.simulate.scenarios import Scenario
    from edgemon.simulate.workload import Request

DEVICE = "box"
TOPIC = f"edgemon/v1/{DEVICE}/events"
IDLE_POLL_MS = 5.0
"""How often an engine with everything held asks the gate again."""
DRAIN_LIMIT_MS = 600_000.0
"""The longest a draining run goes on after its arrivals stopped (requests then still open
are scored as they are)."""
FEED_PERIOD_MS = 150.0
"""How often edgemon's slack feed reaches the engine: the daemon's `[mqtt] feed_ms` default,
at which a device whose streams keep changing is published (`edgemon.daemon.slack_feed`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopResult:
    """A virtual run: what the players heard and how much edgemon throttled."""

    score: Score
    throttle_share: float
    """Share of the run edgemon's throttle was on."""
    holds: int
    steps: int
    peak_running: int = 0
    """The most requests the engine ran at once."""
    players: tuple[Player, ...] = ()
    """Every request's player, in request order (settled at the run's end)."""
    monitor: Monitor | None = None
    """edgemon's monitor as the run left it (its device `box` has the daemon's statistics)."""
    end_ms: float = 0.0
    """When the run ended and its players were scored (past the duration when it drained)."""
    parked_steps: int = 0
    """Steps running streams sat out, summed over the streams (a pacing rule's parking)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopPlan:
    """One virtual run."""

    profile: Profile
    rate_rps: float
    seed: int
    duration_ms: float
    policy: Policy = field(default_factory=lambda: OPEN_POLICY)
    """What the engine does with new requests (`edgemon.simulate.policies`)."""
    eta_hints: bool = True
    report_latency_ms: float = 6.0
    gate_latency_ms: float = 3.0
    scenario: Scenario = STEADY
    start_slo_ms: float = START_SLO_MS
    gap_slo_ms: float = GAP_SLO_MS
    lengths_known: bool = False
    """The deadline policy is shown each request's length (`--lengths known`, an oracle);
    False: it predicts lengths from prompts, as a real server must (`--lengths eos`)."""
    drain: bool = True
    """Arrivals stop at `duration_ms` and the run goes on until every request has ended
    (finished or refused), so that none is scored `unfinished`; False: the run stops at
    `duration_ms` and requests still under way are scored as they are."""


def run_loop(plan: LoopPlan) -> LoopResult:
    """Run `plan` to its end; players are scored then (`duration_ms`, or when the last
    request ended for a draining run)."""
    return _VirtualLoop(plan).run()


class _VirtualLoop:
    """One run's state: a time-ordered queue of what happens next, handled kind by kind."""

    __slots__ = (
        "arrivals",
        "budget",
        "delivery",
        "engine",
        "fed",
        "fed_spendable",
        "fresh_step",
        "gate",
        "listeners",
        "margin_ms",
        "monitor",
        "now",
        "open",
        "order",
        "peak_running",
        "plan",
        "players",
        "queue",
        "refusing_since",
        "requests",
        "spendable",
        "steps",
        "throttle_since",
        "throttled_ms",
        "timer_at",
    )

    def __init__(self, plan: LoopPlan) -> None:
        profile, policy = plan.profile, plan.policy
        self.plan = plan
        self.margin_ms = profile.margin_ms if policy.margin_ms is None else policy.margin_ms
        self.now = 0.0
        self.gate = HoldGate(policy.max_hold_ms, lasting=policy.lasting)
        scenario = plan.scenario
        self.budget = (
            None
            if policy.budget is None
            else SpendableBudget(policy.budget, frame_ms=profile.frame_ms)
        )
        self.refusing_since: float | None = None
        self.fresh_step = -1
        self.spendable: float | None = None
        #: edgemon's slack feed as the engine last received it, and the spendable headroom
        #: it implied then.
        self.fed: dict[str, SlackEntry] = {}
        self.fed_spendable: float | None = None
        self.engine = ServedEngine(
            profile,
            policy,
            start_slo_ms=plan.start_slo_ms,
            gate=lambda: self.gate.should_throttle(self.now),
            throttle=self._throttle_state,
            fits=None if self.budget is None else self._fits,
            step_factor=None if scenario.slowdown is None else scenario.step_factor,
            lengths_known=plan.lengths_known,
            measured=self._oracle if plan.policy.parking == "oracle" else self.fed.get,
        )
        self.arrivals = RequestSource(
            plan.rate_rps,
            profile.workload,
            seed=plan.seed,
            burst=scenario.burst,
            until_ms=plan.duration_ms if plan.drain else math.inf,
        )
        self.delivery = Delivery(profile.network_ms, profile.network_jitter_ms, plan.seed)
        self.monitor = Monitor(EngineConfig())
        self.players: dict[str, Player] = {}
        self.listeners: dict[str, ListenerPlan] = {}
        self.queue: list[tuple[float, int, str, Any]] = []
        self.order = itertools.count()
        self.throttle_since: float | None = None
        self.timer_at: float | None = None
        self.throttled_ms = 0.0
        self.steps = 0
        self.peak_running = 0
        self.requests = 0
        self.open = 0  # requests neither finished nor refused

    def _throttle_state(self) -> Throttle:
        """edgemon's throttle as the engine's gate knows it (no side effects), with the
        headroom the policy is fed."""
        gate, feed = self.gate, self.plan.policy.feed
        held = self.plan.policy.gated and gate.throttle and not gate.releasing
        if feed in {"measured", "oracle"}:
            return Throttle(held=held, headroom_ms=self.fed_spendable)
        return Throttle(held=held, headroom_ms=None if feed == "none" else self.spendable)

    def _oracle(self, stream: str) -> SlackEntry | None:
        """`stream`'s player as it truly is now (the oracle feed): the time until it runs dry
        once it has started (a pause counted whole as it begins), its audio before."""
        player, now = self.players[stream], self.now
        if player.start_ms is None:
            return SlackEntry(stream, player.audio_ms, math.inf, now)
        if player.stopped:
            return SlackEntry(stream, player.slack_ms(now), math.inf, now)
        return SlackEntry(stream, player.start_ms + player.audio_ms - now, now, now)

    def run(self) -> LoopResult:
        plan = self.plan
        handlers: dict[str, Callable[[Any], None]] = {
            "engine": self._engine,
            "chunk": self._chunk,
            "message": self._message,
            "timer": self._timer,
            "gate": self._gate,
            "hold": self._hold,
            "feed": self._feed,
            "fed": self._fed,
        }
        self._at(0.0, "engine")
        policy = plan.policy
        if {policy.parking, policy.feed} & {"measured", "oracle"}:
            self._at(FEED_PERIOD_MS, "feed")
        end = plan.duration_ms
        while self.queue:
            t, _, kind, value = heapq.heappop(self.queue)
            if t > end and not self._draining(t):
                break
            self.now = t
            handlers[kind](value)
        end = max(end, self.now)
        if self.throttle_since is not None:
            self.throttled_ms += end - self.throttle_since
        return LoopResult(
            score=score(
                self.players.values(),
                end,
                requests=self.requests,
                start_slo_ms=plan.start_slo_ms,
                gap_slo_ms=plan.gap_slo_ms,
            ),
            throttle_share=self.throttled_ms / end,
            holds=self.gate.holds,
            steps=self.steps,
            peak_running=self.peak_running,
            players=tuple(self.players.values()),
            monitor=self.monitor,
            end_ms=end,
            parked_steps=self.engine.engine.parked_steps,
        )

    def _draining(self, t: float) -> bool:
        """Whether a run past its duration goes on at `t`: it drains, requests are still
        open, and the drain has not gone on for `DRAIN_LIMIT_MS`."""
        plan = self.plan
        return plan.drain and self.open > 0 and t <= plan.duration_ms + DRAIN_LIMIT_MS

    def _at(self, t: float, kind: str, value: Any = None) -> None:
        heapq.heappush(self.queue, (t, next(self.order), kind, value))

    def _engine(self, _: Any) -> None:
        t, engine = self.now, self.engine
        for request in self.arrivals.due(t):
            self.requests += 1
            self.open += 1
            listeners = self.plan.scenario.listeners
            link = NO_PLAN
            if listeners is not None:
                at = request.arrival_ms
                link = listeners.plan(self.plan.seed, request.id, request.audio_ms, at)
                self.listeners[request.id] = link
            self.players[request.id] = Player(
                request.id,
                request.arrival_ms,
                start_at_audio_ms=link.start_at_audio_ms,
                rebuffer_step_ms=link.rebuffer_step_ms,
            )
            self._request_made(request.id, request.arrival_ms)
            if not engine.submit(request, t):
                self._refuse(request.id)
        step = engine.step(t)
        for stream in engine.refused():
            self._refuse(stream)
        if step is None:
            # Held requests, or running ones a pacing rule parked: ask again shortly.
            busy = engine.waiting or engine.running
            self._at(t + IDLE_POLL_MS if busy else self.arrivals.next_ms, "engine")
            return
        self.steps += 1
        self.peak_running = max(self.peak_running, engine.running + len(step.finished))
        if self.budget is not None:
            self.budget.observe(step.decode_seqs, step.prefill_tokens, step.ms)
        if step.admitted or not engine.waiting:
            self.gate.admitted()
        network = self.plan.scenario.network
        for chunk in step.chunks:
            extra = 0.0 if network is None else network.extra_ms(chunk.t_ms)
            link = self.listeners.get(chunk.request, NO_PLAN)
            self._at(link.delivered_ms(self.delivery.arrival_ms(chunk, extra)), "chunk", chunk)
        self._at(step.end_ms, "engine")

    def _refuse(self, stream: str) -> None:
        """The engine refused `stream` now: the refusal reaches its player one network delay
        later, and the player ends the stream it reported."""
        at = self.now + self.plan.profile.network_ms
        self.players[stream].refused(at)
        self.open -= 1
        end = {"type": "end", "stream": stream, "t_ms": at, "reason": "refused"}
        self._at(at + self.plan.report_latency_ms, "message", json.dumps([end]).encode())

    def _chunk(self, chunk: Chunk) -> None:
        player = self.players[chunk.request]
        player.receive(chunk, self.now)
        self.open -= chunk.final
        holds = self.listeners.get(chunk.request, NO_PLAN).holds
        if chunk.seq == 0 and holds and player.start_ms is not None:
            self._at(player.start_ms + holds[0][0], "hold", (chunk.request, 0))
        body = json.dumps(self._report(player, chunk)).encode()
        self._at(self.now + self.plan.report_latency_ms, "message", body)

    def _request_made(self, stream: str, t_ms: float) -> None:
        """The player sends `start` when it makes the request (as the README's player does)."""
        start: dict[str, Any] = {
            "type": "start",
            "stream": stream,
            "t_ms": t_ms,
            "margin_ms": self.margin_ms,
        }
        if self.players[stream].rebuffer_step_ms is not None:
            start["player"] = "rebuffer"
        self._at(t_ms + self.plan.report_latency_ms, "message", json.dumps([start]).encode())

    def _report(self, player: Player, chunk: Chunk) -> list[dict[str, Any]]:
        """The batch a Reporter would publish for this arrival; the first chunk says when
        the player starts playback."""
        event: dict[str, Any] = {
            "type": "chunk",
            "stream": player.stream,
            "t_ms": self.now,
            "seq": chunk.seq,
            "audio_ms": chunk.audio_ms,
            "audio_total_ms": player.audio_ms,
        }
        if chunk.seq == 0 or player.resumes_ms is not None or player.start_at_audio_ms:
            start = player.reported_start_ms(self.now)
            event["play_start_ms"] = NOT_STARTED_MS if start is None else start
        if chunk.final:
            event["final"] = True
        elif self.plan.eta_hints and chunk.eta_ms is not None:
            event["eta_ms"] = chunk.eta_ms
        return [event]

    def _hold(self, which: tuple[str, int]) -> None:
        """The listener pauses, or the player stalls, now; the next one is set up."""
        stream, index = which
        player = self.players[stream]
        holds = self.listeners[stream].holds
        player.hold(self.now, holds[index][1])
        if index + 1 < len(holds) and not player.final and player.start_ms is not None:
            at = max(self.now, player.start_ms + holds[index + 1][0])
            self._at(at, "hold", (stream, index + 1))

    def _feed(self, _: Any) -> None:
        """edgemon publishes its slack feed; the engine has it one gate latency later."""
        device = self.monitor.engine.device(DEVICE)
        entries = () if device is None else slack_feed(device.streams.values(), self.now)
        change = ({e.stream: e for e in entries}, self._spendable())
        self._at(self.now + self.plan.gate_latency_ms, "fed", change)
        self._at(self.now + FEED_PERIOD_MS, "feed")

    def _fed(self, change: tuple[dict[str, SlackEntry], float | None]) -> None:
        """The slack feed reaches the engine."""
        entries, self.fed_spendable = change
        self.fed.clear()
        self.fed.update(entries)

    def _message(self, body: bytes) -> None:
        out: list[Output] = []
        self.monitor.handle(TOPIC, body, self.now, out)
        self._outputs(out)

    def _timer(self, at: float) -> None:
        if at != self.timer_at:
            return  # superseded by an earlier deadline, which advanced the monitor past it
        self.timer_at = None
        out: list[Output] = []
        self.monitor.advance(self.now, out)
        self._outputs(out)

    def _outputs(self, out: list[Output]) -> None:
        for output in out:
            if isinstance(output, ThrottleChanged):
                low = output.min_headroom_ms
                budget = None if low is None else low - output.margin_ms
                self._at(self.now + self.plan.gate_latency_ms, "gate", (output.active, budget))
        deadline = self.monitor.next_deadline()
        if deadline is not None:
            at = max(deadline, self.now)
            if self.timer_at is None or at < self.timer_at:
                # One timer pending at a time, the earliest (the daemon's deadline task).
                self.timer_at = at
                self._at(at, "timer", at)

    def _fits(self, request: Request, running: int) -> bool:
        """Budget-aware admission of the queue's head; a refusal lasts `max_hold_ms` at most
        (then the head is admitted and its cost spent), and nothing running means no limit."""
        budget = self.budget
        assert budget is not None
        if budget.setting.mode == "fresh" and self.fresh_step != self.steps:
            self.fresh_step = self.steps  # once per step: later admissions spend from it
            budget.published(self._spendable())
        if self.gate.throttle:
            # The throttle is on and the gate let this step through (its max_hold_ms
            # release): the budget, negative while on, does not hold it a second time.
            budget.spend(request.prompt_tokens)
            return True
        if running == 0 or budget.admit(request.prompt_tokens):
            self.refusing_since = None
            return True
        if self.refusing_since is None:
            self.refusing_since = self.now
        if self.now - self.refusing_since >= self.plan.policy.max_hold_ms:
            self.refusing_since = None
            budget.spend(request.prompt_tokens)
            return True
        return False

    def _spendable(self) -> float | None:
        """The device's spendable headroom now, as edgemon's monitor knows it."""
        device = self.monitor.engine.device(DEVICE)
        live = [] if device is None else device.live_streams()
        return min((s.headroom_at(self.now) - s.margin for s in live), default=None)

    def _gate(self, change: tuple[bool, float | None]) -> None:
        """A throttle change reaches the engine's gate."""
        t = self.now
        throttle, spendable = change
        self.gate.set(throttle, t)
        self.spendable = spendable
        if self.budget is not None:
            self.budget.published(spendable)
        if throttle and self.throttle_since is None:
            self.throttle_since = t
        elif not throttle and self.throttle_since is not None:
            self.throttled_ms += t - self.throttle_since
            self.throttle_since = None
