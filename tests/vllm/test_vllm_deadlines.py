"""The deadline policy on vLLM's real V1 scheduler: bounded holds, requests ended when they
cannot start in time (at arrival, and while queued when the box slows down), and the
predicted start wait published for the shedding middleware. An injected clock plays the
model's step times and the requests' arrival clock.

The policy knows no request's length: it predicts what a running request has left from its
prompt and the frames it emitted, by the lengths of requests that finished
(`edgemon.policy.lengths`), and `max_tokens` only caps that. A test that needs
requests to be long first lets requests that long finish; one that needs a request to end
soon gives it a `max_tokens` below the prediction. (Here a request ends at its
`max_tokens`: the harness's model never samples an end-of-sequence token.)"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("vllm.v1.core.sched.scheduler", exc_type=ImportError)

from realtime_cases import ModelClock, roomy, steps
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient
from vllm.v1.request import RequestStatus

from edgemon.integrations._deadlines import VllmDeadlines
from edgemon.integrations._vllm_report import SHED_STOP_REASON
from edgemon.integrations.vllm import EdgemonScheduler
from edgemon.integrations.vllm_realtime import EdgemonRealtimeScheduler
from edgemon.policy.deadlines import Deadlines, DeadlineSettings
from edgemon.policy.realtime import RealtimeAdmission
from edgemon.shedding.middleware import EdgemonShedMiddleware

from harness import FlagGate, build_scheduler, make_request, run_step, talker_classes, waiting_ids
from mqtt_probe import probe

if TYPE_CHECKING:
    from pathlib import Path

    from starlette.requests import Request

    from edgemon.policy.values import Mode

    from brokers import Broker

T = 30.0  # generous: a loaded machine
DEVICE = "box-1"
CAPACITY = f"edgemon/v1/{DEVICE}/capacity"
ENDED = ("abort", SHED_STOP_REASON)


def _deadlines(
    mode: Mode, *, admission: RealtimeAdmission | None = None, max_num_seqs: int = 8
) -> VllmDeadlines:
    policy = Deadlines(
        DeadlineSettings(start_slo_ms=3000.0, shed=mode == "shed"),
        admission,
        max_num_seqs=max_num_seqs,
    )
    return VllmDeadlines(policy, mode)


@pytest.fixture(params=talker_classes(), ids=lambda cls: cls.__name__)
def flavour(request: pytest.FixtureRequest) -> type[Any]:
    """The scheduler class under test: vLLM's, and vLLM-Omni's talker where it imports."""
    cls: type[Any] = request.param
    return cls


def _scheduler(
    tiny_model: Path,
    clock: ModelClock,
    mode: Mode,
    cls: type[Any] = EdgemonScheduler,
    **kwargs: Any,
) -> Any:
    max_num_seqs = kwargs.pop("max_num_seqs", 8)
    return build_scheduler(
        cls,
        tiny_model,
        max_num_seqs=max_num_seqs,
        edgemon_deadlines=_deadlines(mode, max_num_seqs=max_num_seqs),
        edgemon_clock=clock,
        **kwargs,
    )


def _arrive(
    scheduler: Any, clock: ModelClock, request_id: str, *, max_tokens: int = 50, prompt: int = 8
) -> None:
    scheduler.add_request(
        make_request(request_id, prompt, max_tokens=max_tokens, arrival_time=clock.now_s)
    )


def _measure_the_batch(scheduler: Any, clock: ModelClock) -> None:
    """Batches of 4 then 8 long requests decode: real-time admission learns the step shape
    (N* = 12 on the model's clock)."""
    for i in range(4):
        _arrive(scheduler, clock, f"a-{i}", max_tokens=400)
    list(steps(scheduler, clock, 12))
    for i in range(4):
        _arrive(scheduler, clock, f"b-{i}", max_tokens=400)
    list(steps(scheduler, clock, 12))


def _teach(scheduler: Any, clock: ModelClock, lengths: dict[str, tuple[int, int]]) -> None:
    """Requests of these (prompt tokens, frames) arrive and run to their end (each ends at
    its `max_tokens` here): the policy learns their lengths as it learns any finished
    request's."""
    for name, (prompt, frames) in lengths.items():
        _arrive(scheduler, clock, name, max_tokens=frames, prompt=prompt)
    for _ in steps(scheduler, clock, 20 * max(frames for _, frames in lengths.values())):
        if not scheduler.has_unfinished_requests():
            break
    assert not scheduler.has_unfinished_requests(), "the teaching requests never finished"
    assert scheduler.edgemon_deadlines.policy.lengths.finished == len(lengths)


def test_a_hold_ends_at_the_requests_start_deadline(tiny_model: Path, flavour: type[Any]) -> None:
    """With the gate holding for good, a waiting request is held until its start deadline
    (arrival + 3 s − what its first audio still needs) and admitted by the first step that
    begins at or after it; nothing is admitted before. (Without the deadline policy this gate
    holds it for ever.)"""
    clock = ModelClock()
    scheduler = _scheduler(tiny_model, clock, "hold", flavour, edgemon_gate=FlagGate(throttle=True))
    _arrive(scheduler, clock, "r")
    (waiting,) = VllmDeadlines.waiting(scheduler.waiting)
    deadline_ms = scheduler.edgemon_deadlines.policy.deadline_ms(waiting, 8)
    assert deadline_ms < waiting.arrival_ms + 3000.0
    for _ in range(400):
        begun_ms = clock.now_s * 1000
        step = run_step(scheduler)
        clock.ran(step)
        if step.admitted:
            break
    assert step.admitted == ["r"], "the hold never ended"
    assert deadline_ms <= begun_ms < deadline_ms + 31.0  # one idle step: 30 ms
    assert scheduler.edgemon_stats.held_steps > 0


def test_the_shipped_mode_does_not_hold_on_the_throttle(
    tiny_model: Path, flavour: type[Any]
) -> None:
    """Mode `shed` (the shipped policy) admits a request with a seat free at once though
    edgemon's gate says throttle for good: on top of the deadline policy the throttle bought
    nothing (docs/explanation/does-it-help.md), so it holds nothing; no held step."""
    clock = ModelClock()
    scheduler = _scheduler(tiny_model, clock, "shed", flavour, edgemon_gate=FlagGate(throttle=True))
    _arrive(scheduler, clock, "r")
    step = run_step(scheduler)
    assert step.admitted == ["r"]
    assert scheduler.edgemon_stats.held_steps == 0


def test_a_request_that_cannot_start_in_time_is_ended_at_arrival(
    tiny_model: Path, flavour: type[Any]
) -> None:
    """Two requests of 500 frames ran to their end first, so the policy expects requests
    like them to take 500. Two more fill the batch (max_num_seqs 2, a generous cap of 2,000
    `max_tokens` each): a third one's seat frees only after hundreds of steps, past its start
    deadline, so mode `shed` ends it at arrival (abort, edgemon:start_deadline) while the
    running requests go on; mode `hold` queues it."""
    for mode, expected in (("shed", ENDED), ("hold", None)):
        clock = ModelClock()
        scheduler = _scheduler(tiny_model, clock, mode, flavour, max_num_seqs=2)  # type: ignore[arg-type]
        _teach(scheduler, clock, {"t1": (8, 500), "t2": (8, 500)})
        for name in ("a", "b"):
            _arrive(scheduler, clock, name, max_tokens=2000)
        list(steps(scheduler, clock, 6))
        _arrive(scheduler, clock, "late")
        (step,) = steps(scheduler, clock, 1)
        assert step.reasons.get("late") == expected, mode
        assert set(step.produced) == {"a", "b"}
        assert scheduler._edgemon.report.shed_reasons["arrival"] == (mode == "shed")
        assert waiting_ids(scheduler) == ([] if mode == "shed" else ["late"])


def test_a_queued_request_is_ended_once_the_box_slows_down(
    tiny_model: Path, flavour: type[Any]
) -> None:
    """A request queued behind a full batch whose seats free in time is kept (one running
    request's `max_tokens`, 30, is below what the policy expects of a request before any
    finished, 100 frames: it frees its seat within about 30 steps); when every step becomes
    8 times longer, its start can no longer be met and it is ended at once (before its
    deadline passes), while the running requests keep decoding."""
    clock = ModelClock()
    scheduler = _scheduler(tiny_model, clock, "shed", flavour, max_num_seqs=2)
    for name, tokens in (("a", 30), ("b", 400)):
        _arrive(scheduler, clock, name, max_tokens=tokens)
    list(steps(scheduler, clock, 4))
    _arrive(scheduler, clock, "queued")
    deadline_ms = clock.now_s * 1000 + 3000.0
    list(steps(scheduler, clock, 2))
    assert waiting_ids(scheduler) == ["queued"]
    clock.factor = 8.0
    ended_at = None
    for step in steps(scheduler, clock, 40):
        assert "b" in step.produced
        if "queued" in step.reasons:
            assert step.reasons["queued"] == ENDED
            ended_at = clock.now_s * 1000
            break
    assert ended_at is not None, "the infeasible request was never ended"
    assert ended_at < deadline_ms
    assert waiting_ids(scheduler) == []


def test_an_idle_box_is_no_step_to_the_policy(tiny_model: Path, flavour: type[Any]) -> None:
    """A request runs to its end and the box idles 20 s before the next arrives. The engine
    calls `schedule()` again only then, but that wait is no step: a request arriving a few
    steps later is admitted, not ended (timed as a 20 s step, the idle wait made every
    start look tens of seconds away, and mode `shed` ended it at arrival)."""
    clock = ModelClock()
    scheduler = _scheduler(tiny_model, clock, "shed", flavour)
    _arrive(scheduler, clock, "a", max_tokens=20)
    for _ in steps(scheduler, clock, 30):  # as the engine loop: no step once nothing runs
        if not scheduler.running:
            break
    assert list(scheduler.running) == list(scheduler.waiting) == []
    clock.now_s += 20.0
    _arrive(scheduler, clock, "b", max_tokens=200)
    list(steps(scheduler, clock, 3))
    _arrive(scheduler, clock, "c")
    (step,) = steps(scheduler, clock, 1)
    assert "c" not in step.reasons
    assert set(step.produced) >= {"b"}
    assert scheduler._edgemon.report.shed_reasons["arrival"] == 0


def test_the_prediction_is_from_prompts_and_frames_emitted_and_max_tokens_only_caps_it(
    tiny_model: Path,
) -> None:
    """Eight requests finish first, each speaking twice its prompt (8 to 64 tokens). Then,
    running: requests of 8 and of 64 prompt tokens with a generous cap (1,000 `max_tokens`)
    are predicted to have their learned length (16 and 128) less what they emitted, and
    after ten more steps ten frames fewer; a cap twice as generous changes nothing; a cap
    below the prediction (40) bounds it. (Before, the driver showed `max_tokens − output` as
    what each had left: 1,000 minus what it emitted.)"""
    clock = ModelClock()
    scheduler = _scheduler(tiny_model, clock, "hold", max_num_seqs=8, max_num_batched_tokens=512)
    lengths = {f"t{i}": (prompt, 2 * prompt) for i, prompt in enumerate((8, 16, 32, 64) * 2)}
    _teach(scheduler, clock, lengths)
    for name, prompt, cap in (
        ("short", 8, 1000), ("long", 64, 1000), ("roomier", 8, 2000), ("capped", 64, 40),
    ):  # fmt: skip
        _arrive(scheduler, clock, name, max_tokens=cap, prompt=prompt)
    list(steps(scheduler, clock, 5))
    policy = scheduler.edgemon_deadlines.policy

    def predicted() -> dict[str, tuple[float, int]]:
        shown = scheduler.edgemon_deadlines.running(scheduler.running, clock.now_s * 1000.0)
        return {r.id: (policy.remaining(r), r.emitted_frames) for r in shown}

    before = predicted()
    assert set(before) == {"short", "long", "roomier", "capped"}
    for name, learned in (("short", 16), ("long", 128), ("roomier", 16), ("capped", 40)):
        left, emitted = before[name]
        assert emitted > 0
        assert left == pytest.approx(learned - emitted), name
    list(steps(scheduler, clock, 10))
    after = predicted()
    for name in ("short", "long", "roomier", "capped"):
        assert after[name][1] == before[name][1] + 10
        assert after[name][0] == pytest.approx(before[name][0] - 10), name


def test_a_request_whose_client_left_teaches_its_length(
    tiny_model: Path, flavour: type[Any]
) -> None:
    """A running request the engine aborts after 12 frames (its client closed the stream:
    vLLM ends it through the scheduler's `finish_requests`, FINISHED_ABORTED) teaches the
    policy a 12-frame request, as one that finished by itself would: the next such request
    is expected to take 12 frames, not the 100 assumed before any ended. A waiting request
    edgemon ends (no frame) teaches nothing. (Before, only requests vLLM finished in a step
    taught it, so a server whose clients close their streams taught it nothing.)"""
    clock = ModelClock()
    scheduler = _scheduler(tiny_model, clock, "shed", flavour, max_num_seqs=1)
    _arrive(scheduler, clock, "left", max_tokens=1000)
    for _ in steps(scheduler, clock, 40):
        if scheduler.requests["left"].num_output_tokens >= 12:
            break
    assert scheduler.requests["left"].num_output_tokens == 12
    _arrive(scheduler, clock, "queued")
    policy = scheduler.edgemon_deadlines.policy
    assert policy.lengths.finished == 0
    scheduler.edgemon_end_waiting(["queued"])
    ended = scheduler.finish_requests(["left"], RequestStatus.FINISHED_ABORTED)
    assert [r.request_id for r in ended] == ["left"]
    assert policy.lengths.finished == 1
    assert policy.lengths.expected(8) == pytest.approx(12.0)
    assert scheduler.edgemon_stats.errors == 0


def test_a_preempted_request_is_resumed_not_ended(tiny_model: Path, flavour: type[Any]) -> None:
    """A request vLLM preempted (KV blocks ran out) started long ago: however old its arrival,
    the deadline policy neither ends it nor holds it back; it is resumed first, as vLLM's own
    order has it."""
    clock = ModelClock()
    scheduler = _scheduler(
        tiny_model, clock, "shed", flavour, num_blocks=4, max_num_batched_tokens=64
    )
    for name in ("a", "b"):
        _arrive(scheduler, clock, name, max_tokens=40)
    preempted: list[str] = []
    for step in steps(scheduler, clock, 60):
        preempted += step.preempted
        if preempted:
            break
    assert preempted, "the trace must exercise preemption"
    clock.now_s += 10.0  # every start deadline is long past now
    resumed: list[str] = []
    for step in steps(scheduler, clock, 200):
        assert all(reason[1] != SHED_STOP_REASON for reason in step.reasons.values())
        resumed += [r for r in step.admitted if r in preempted]
        if not scheduler.has_unfinished_requests():
            break
    assert set(preempted) <= set(resumed)
    assert scheduler.edgemon_deadlines.policy.shed_total == 0


def test_real_time_admission_is_the_plans_limit(tiny_model: Path) -> None:
    """With real-time admission measured (N* = 12), the plan admits up to it and holds the
    rest (mode hold), in arrival order; nothing beyond the real-time batch runs."""
    clock = ModelClock()
    admission = RealtimeAdmission(80.0)
    deadlines = _deadlines("hold", admission=admission, max_num_seqs=32)
    scheduler = roomy(
        EdgemonRealtimeScheduler, tiny_model, clock, admission, edgemon_deadlines=deadlines
    )
    _measure_the_batch(scheduler, clock)
    assert admission.limit == 12
    later = [f"c-{i}" for i in range(6)]
    for request_id in later:
        _arrive(scheduler, clock, request_id, max_tokens=400)
    (step,) = steps(scheduler, clock, 1)
    assert step.admitted == later[:4]
    assert waiting_ids(scheduler) == later[4:]
    assert len(scheduler.running) == 12


@pytest.mark.integration
def test_the_predicted_wait_reaches_the_middleware(
    tiny_model: Path, private_broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end on a real Mosquitto: a full batch with a long queue makes the scheduler
    publish a start wait over the SLO; the middleware (another process's part) then refuses a
    completion with 503, and the refusal comes back in the engine's shed_total."""
    host, port = private_broker.host, private_broker.port
    monkeypatch.setenv("EDGEMON_GATE_DEVICE", DEVICE)
    monkeypatch.setenv("EDGEMON_GATE_BROKER", f"mqtt://{host}:{port}")
    monkeypatch.delenv("EDGEMON_SLO_START_MS", raising=False)
    clock = ModelClock()
    scheduler = _scheduler(tiny_model, clock, "off", max_num_seqs=1)
    app = Starlette(routes=[Route("/v1/completions", _ok, methods=["POST"])])
    middleware = EdgemonShedMiddleware(app)
    assert middleware.view is not None
    try:
        with probe(host, port, CAPACITY) as watcher:
            for i in range(6):
                _arrive(scheduler, clock, f"r{i}", max_tokens=200)
            list(steps(scheduler, clock, 10))
            assert watcher.wait_for(
                lambda seen: any(
                    m.payload and m.json().get("start_wait_ms", 0) > 3000 for m in seen
                ),
                T,
            )
            client = TestClient(middleware)
            view = middleware.view
            assert _eventually(lambda: view.judge(3000.0) is not None)
            answer = client.post("/v1/completions", json={})
            assert answer.status_code == 503
            list(steps(scheduler, clock, 2))
            assert watcher.wait_for(
                lambda seen: any(m.payload and m.json()["shed_total"] == 1 for m in seen), T
            )
    finally:
        middleware.view.close()
        scheduler.shutdown()


def _ok(_request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


def _eventually(check: Any, timeout: float = T) -> bool:
    import time  # noqa: PLC0415

    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_one_clock_times_the_steps_for_real_time_admission_and_the_policy(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler's one clock (`edgemon_clock`, here the model's step times: 30 ms, 4 ms
    a request, 0.2 ms a prompt token) times the steps both parts learn from: real-time
    admission finds N* = 12, and the deadline policy (from the environment, given no clock of
    its own) learns a prompt token's prefill cost near 0.2 ms (within 0.1: the first prefill
    it saw came before the step shape was known). (Before, the policy timed the steps on the
    wall clock whatever clock the scheduler was given: these steps took almost nothing there,
    and it learned a cost of about 0.)"""
    monkeypatch.setenv("EDGEMON_DEADLINES", "hold")
    monkeypatch.delenv("EDGEMON_GATE_DEVICE", raising=False)
    clock = ModelClock()
    admission = RealtimeAdmission(80.0)
    scheduler = roomy(EdgemonRealtimeScheduler, tiny_model, clock, admission)
    _measure_the_batch(scheduler, clock)
    assert admission.limit == 12
    for i in range(4):
        _arrive(scheduler, clock, f"c-{i}", max_tokens=400, prompt=100)
        list(steps(scheduler, clock, 3))
    policy = scheduler.edgemon_deadlines.policy
    assert policy.prefill_ms_per_token == pytest.approx(0.2, abs=0.11)
