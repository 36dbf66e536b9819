"""The closed loop in real time, for `closed_loop.py`'s spot checks (needs vLLM).

Per run: vLLM's real V1 scheduler (`EdgemonRealtimeScheduler`, built offline the way
`tests/vllm/harness.py` builds it; real-time admission only for policies that ask for it)
decides every step, and `_vllm_engine.VllmEngine` times it with the profile's step-time model
(times the scenario's slowdown factor); Poisson requests (plus the scenario's bursts) reach it
on the wall clock; each stream's player gets its chunks after the network delay (plus the
scenario's episodes) and reports them through a real `Reporter` (`start` at the request); a
real Mosquitto and a real `edgemon run` decide the throttle, which a real `ThrottleGate` reads
for gated policies. The players score silence on their own clocks.

The real `ThrottleGate`'s release after `max_hold_ms` lasts until a step admits (the
schedulers call its `admitted()`): that is `lasting:`. The one-step release of `gate:` exists
only in the virtual loop; this stack refuses it.

The deadline policy (`deadline:…`, and `edgemon`) runs inside the scheduler
(`edgemon_deadlines`, settings as the virtual loop gives them), which publishes its capacity
object on the run's device through the real Mosquitto; a request first meets the shedding
middleware's judgement (`CapacityView`, following that object) and is refused at once when
the predicted start wait exceeds the start SLO, as the middleware answers 503. Players count
every refusal as `shed`, with how long it took from their request.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _support import ROOT, Edgemon, mosquitto

sys.path.insert(0, str(ROOT / "tests" / "vllm"))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
for _name in ("EDGEMON_GATE_DEVICE", "EDGEMON_GATE_BROKER"):
    os.environ.pop(_name, None)  # no gate must mean vLLM's own scheduling
os.environ["EDGEMON_REALTIME_FRAME_MS"] = "0"  # real-time admission only where a policy asks

from _vllm_engine import VllmEngine  # noqa: E402

from edgemon.broker_url import Broker, parse_broker_url  # noqa: E402
from edgemon.client import Reporter, ThrottleGate  # noqa: E402
from edgemon.integrations._deadlines import VllmDeadlines  # noqa: E402
from edgemon.integrations.vllm_realtime import EdgemonRealtimeScheduler  # noqa: E402
from edgemon.policy.deadlines import START_SLO_MS, Deadlines  # noqa: E402
from edgemon.policy.realtime import RealtimeAdmission  # noqa: E402
from edgemon.shedding.middleware import CapacityView  # noqa: E402
from edgemon.shedding.topic import CapacityPublisher, TopicConfig  # noqa: E402
from edgemon.simulate.loop import prebuffer_ms  # noqa: E402
from edgemon.simulate.players import Delivery  # noqa: E402
from edgemon.simulate.realtime import Box  # noqa: E402
from edgemon.simulate.scenarios import RequestSource  # noqa: E402

from conftest import TINY_CONFIG  # noqa: E402 - the vLLM tier's tiny model config
from harness import build_scheduler  # noqa: E402

if TYPE_CHECKING:
    from edgemon.simulate.players import Player, Score
    from edgemon.simulate.policies import Policy
    from edgemon.simulate.profiles import Profile
    from edgemon.simulate.scenarios import Scenario

MAX_MODEL_LEN = 4096
KV_BLOCKS = 20_000


class _NetworkDelivery(Delivery):
    """`Delivery` plus the scenario's network episodes (time since the run's origin)."""

    def __init__(
        self, profile: Profile, seed: int, scenario: Scenario, origin: list[float]
    ) -> None:
        super().__init__(profile.network_ms, profile.network_jitter_ms, seed)
        self.scenario = scenario
        self.origin = origin

    def arrival_ms(self, chunk: Any, extra_ms: float = 0.0) -> float:
        extra = self.scenario.network_ms(chunk.t_ms - self.origin[0])
        return super().arrival_ms(chunk, extra_ms + extra)


class RealtimeStack:
    """One Mosquitto and one `edgemon run` for all runs; `run` serves one point."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.index = 0
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._broker: Any = None
        self.edgemon: Edgemon | None = None
        self.model = Path()
        self.url = ""
        #: How far the last run's driver fell behind the step model at worst (ms).
        self.lag_max_ms = 0.0

    def open(self) -> RealtimeStack:
        """Start the broker and edgemon."""
        self._tmp = tempfile.TemporaryDirectory(prefix="edgemon-loop-")
        directory = Path(self._tmp.name)
        self.model = directory / "model"
        self.model.mkdir()
        config = {**TINY_CONFIG, "max_position_embeddings": MAX_MODEL_LEN}
        (self.model / "config.json").write_text(json.dumps(config))
        self._broker = mosquitto(directory)
        port = self._broker.__enter__()
        self.edgemon = Edgemon(directory, port)
        self.edgemon.ready()
        self.url = f"mqtt://127.0.0.1:{port}"
        return self

    def close(self) -> None:
        """Stop edgemon and the broker."""
        if self.edgemon is not None:
            self.edgemon.close()
        if self._broker is not None:
            self._broker.__exit__(None, None, None)
        if self._tmp is not None:
            self._tmp.cleanup()

    def run(
        self,
        policy: Policy,
        scenario: Scenario,
        *,
        load: float,
        seed: int,
        duration_s: float,
        start_slo_ms: float = START_SLO_MS,
    ) -> tuple[Score, list[Player], float, float]:
        """Serve one run in real time: its score, players, origin and end (wall ms)."""
        if policy.gated and not policy.lasting:
            raise ValueError(
                f"{policy.label}: the real ThrottleGate's release lasts (use lasting:); "
                "the one-step release is the virtual loop's only"
            )
        profile = self.profile
        self.index += 1
        device = f"bench-{self.index}"
        gate = None
        if policy.gated:
            gate = ThrottleGate(self.url, device, max_hold_ms=policy.max_hold_ms).open()
            if not gate.wait_until(lambda s: s.connected and s.edgemon_online, 10.0):
                raise RuntimeError("the gate did not see edgemon online")
        admission = (
            RealtimeAdmission(profile.frame_ms * policy.realtime_frames)
            if policy.realtime
            else None
        )
        engine_box: list[VllmEngine] = []
        shedding = self._shedding(policy, device, admission, start_slo_ms)
        scheduler = build_scheduler(
            EdgemonRealtimeScheduler,
            self.model,
            max_num_batched_tokens=profile.max_num_batched_tokens,
            max_num_seqs=policy.max_num_seqs or profile.max_num_seqs,
            num_blocks=KV_BLOCKS,
            max_model_len=MAX_MODEL_LEN,
            edgemon_gate=gate,
            edgemon_realtime=admission,
            # Steps timed, and the deadline policy's now read, on the model's timeline (the
            # driver's overshoots are not step time).
            edgemon_clock=lambda: engine_box[0].now_ms / 1000.0,
            **shedding,
        )
        view = None
        if policy.deadlines is not None:
            view = CapacityView(TopicConfig(self._broker_config(), (device,))).open()
        origin = [0.0]
        reporter = Reporter(self.url, device).open()
        engine = VllmEngine(
            scheduler,
            profile,
            step_factor=scenario.step_factor,
            origin=origin,
            view=view,
            slo_ms=start_slo_ms,
        )
        engine_box.append(engine)
        box = Box(
            device=device,
            engine=engine,
            arrivals=RequestSource(
                load * profile.capacity_rps(), profile.workload, seed=seed, burst=scenario.burst
            ),
            delivery=_NetworkDelivery(profile, seed, scenario, origin),
            reporter=reporter,
            margin_ms=policy.margin_ms or profile.margin_ms,
        )
        try:
            origin[0] = box.clock()
            score = asyncio.run(box.run(duration_s, origin_ms=origin[0]))
        finally:
            reporter.close()
            if gate is not None:
                gate.close()
            if view is not None:
                view.close()
            scheduler.shutdown()
        self.lag_max_ms = box.status.max_lag_ms
        return score, list(box.players.values()), box.origin_ms, box.end_ms

    def _broker_config(self) -> Broker:
        return parse_broker_url(self.url)

    def _shedding(
        self,
        policy: Policy,
        device: str,
        admission: RealtimeAdmission | None,
        start_slo_ms: float,
    ) -> dict[str, Any]:
        """The scheduler's deadline policy and capacity publisher for `policy` (none without
        `deadline:`)."""
        if policy.deadlines is None:
            return {}
        profile = self.profile
        settings = replace(
            policy.deadlines,
            start_slo_ms=start_slo_ms,
            prebuffer_ms=prebuffer_ms(profile),
            first_chunk_frames=profile.chunk_size(0),
            second_chunk_frames=profile.chunk_size(1),
            token_budget=profile.max_num_batched_tokens,
            frame_ms=profile.frame_ms,
        )
        cap = policy.max_num_seqs or profile.max_num_seqs
        deadlines = VllmDeadlines(
            Deadlines(settings, admission, max_num_seqs=cap), "shed" if settings.shed else "hold"
        )
        publisher = CapacityPublisher(TopicConfig(self._broker_config(), (device,))).open()
        return {"edgemon_deadlines": deadlines, "edgemon_capacity": publisher}
