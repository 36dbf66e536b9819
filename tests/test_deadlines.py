"""The deadline policy (`edgemon.policy.deadlines`): feasibility, shedding at arrival,
bounded holds, admission order and the capacity figures, on a known step-time model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgemon.policy.deadlines import (
    IDLE_PROBE_MS,
    Deadlines,
    DeadlineSettings,
    Order,
    Running,
    StepPlan,
    Throttle,
    Waiting,
)
from edgemon.policy.realtime import RealtimeAdmission

from properties import examples

BASE_MS, PER_SEQ_MS = 30.0, 4.0  # the jetson profile: 12 streams fit an 80 ms frame


def taught(settings_: DeadlineSettings | None = None, *, factor: float = 1.0) -> Deadlines:
    """A policy whose real-time admission has seen decode steps of batches 4..14."""
    admission = RealtimeAdmission(80.0)
    for n in list(range(4, 15)) * 20:
        admission.observe(n, 0, factor * (BASE_MS + PER_SEQ_MS * n))
    return Deadlines(settings_ or DeadlineSettings(prebuffer_ms=200.0), admission)


def full(n: int = 12, remaining: float = 50.0) -> list[Running]:
    """`n` running requests with `remaining` frames each."""
    return [Running(f"r{i}", remaining) for i in range(n)]


def test_deadline_is_arrival_plus_slo_less_what_the_start_needs() -> None:
    """The start deadline: arrival + SLO − (prefill + first chunk × step + prebuffer)."""
    policy = taught(DeadlineSettings(prebuffer_ms=200.0, prefill_ms_per_token=0.2))
    request = Waiting("w", 1000.0, 300)
    step = policy.step_ms(12)
    assert step == pytest.approx(78.0, abs=0.5)
    expected = 1000.0 + 3000.0 - (300 * 0.2 + 5 * step + 200.0)
    assert policy.deadline_ms(request) == pytest.approx(expected)


def test_a_free_seat_admits_at_arrival() -> None:
    """With seats free, nothing waiting and no hold, a new request is admitted at once."""
    policy = taught()
    assert policy.arrive(Waiting("w", 0.0, 300), 0.0, full(4), []) == "admit"
    assert policy.arrive(Waiting("w", 0.0, 300), 0.0, full(4), [], Throttle(held=True)) == "queue"


def test_a_request_that_cannot_start_in_time_is_shed_at_arrival() -> None:
    """A full batch whose seats free only in 50 frames (~3.9 s): the start SLO cannot be met."""
    policy = taught()
    verdict = policy.arrive(Waiting("w", 0.0, 300), 0.0, full(12, 50.0), [])
    assert verdict == "shed"
    assert policy.shed_total == 1
    # The same batch with a seat freeing in 5 frames: it queues.
    soon = [*full(11, 50.0), Running("x", 5.0)]
    assert policy.arrive(Waiting("w", 0.0, 300), 0.0, soon, []) == "queue"


def test_shedding_off_queues_instead() -> None:
    """With `shed=False` nothing is refused: the request queues."""
    policy = taught(DeadlineSettings(prebuffer_ms=200.0, shed=False))
    assert policy.arrive(Waiting("w", 0.0, 300), 0.0, full(12, 50.0), []) == "queue"
    assert policy.shed_total == 0


def test_the_gates_hold_ends_at_the_deadline() -> None:
    """A held gate keeps a waiting request while it can still start in time, then admits it
    (a real-time seat is free)."""
    policy = taught()
    request = Waiting("w", 0.0, 300)
    deadline = policy.deadline_ms(request)
    held = Throttle(held=True)
    assert policy.plan(deadline - 1.0, full(4), [request], held).admit == ()
    assert policy.plan(deadline, full(4), [request], held).admit == ("w",)


def test_past_the_deadline_without_a_seat_sheds_unless_headroom_covers_it() -> None:
    """No seat at the deadline: shed; with spendable headroom enough for the overrun, admit
    beyond the real-time batch."""
    policy = taught(DeadlineSettings(prebuffer_ms=200.0, prefill_ms_per_token=0.2))
    request = Waiting("w", 0.0, 300)
    deadline = policy.deadline_ms(request)
    running = full(12, 10.0)
    assert policy.plan(deadline, running, [request]).shed == ("w",)
    roomy = Throttle(held=False, headroom_ms=10_000.0)
    assert policy.plan(deadline, running, [request], roomy).admit == ("w",)
    tight = Throttle(held=False, headroom_ms=1.0)
    assert policy.plan(deadline, running, [request], tight).shed == ("w",)


def test_a_queued_request_that_became_infeasible_is_shed_at_once() -> None:
    """The box slows down: the batch shrinks, the queue's predicted wait passes a deadline
    before it is due, and that request is shed now; the head stays queued."""
    policy = taught(DeadlineSettings(prebuffer_ms=200.0))
    head, tail = Waiting("a", 0.0, 300), Waiting("b", 0.0, 300)
    running = [*full(11, 40.0), Running("x", 3.0)]
    out = policy.plan(0.0, running, [head, tail])
    assert out.admit == ()
    assert out.shed == ("b",)
    assert policy.shed_total == 1


def test_edf_serves_the_earliest_deadline_first() -> None:
    """Earliest deadline first puts a shorter-waiting but tighter request ahead; FCFS keeps
    arrival order."""
    short_prompt = Waiting("short", 0.0, 100)
    long_prompt = Waiting("long", 10.0, 2000)  # arrived later, but its prefill takes 2 s
    cases: tuple[tuple[Order, str], ...] = (("fcfs", "short"), ("edf", "long"))
    for order, first in cases:
        policy = taught(DeadlineSettings(prebuffer_ms=200.0, order=order, prefill_ms_per_token=1))
        got = policy.plan(0.0, full(11), [short_prompt, long_prompt]).admit
        assert got == (first,)


def test_prefill_cost_and_request_length_are_learned() -> None:
    """Steps with prompt tokens teach the cost per token; finished requests the length."""
    policy = taught()
    for _ in range(300):
        policy.observe(8, 300, BASE_MS + PER_SEQ_MS * 8 + 0.2 * 300)
        policy.finished(60, 300)
    assert policy.prefill_ms_per_token == pytest.approx(0.2, rel=0.05)
    assert policy.expected_frames == pytest.approx(60, rel=0.05)


def test_the_first_measurements_replace_the_priors_at_once() -> None:
    """A new server uses its first measured prefill cost and request length, and their mean
    until 1/LEARN_ALPHA were seen, not a slow climb from its priors (a prefill cost of 0
    made a fresh server admit requests that then started late for its first ~50)."""
    policy = taught(DeadlineSettings(prefill_ms_per_token=0.0, expected_frames=100.0))
    policy.observe(8, 300, BASE_MS + PER_SEQ_MS * 8 + 0.2 * 300)
    policy.finished(60, 300)
    assert policy.prefill_ms_per_token == pytest.approx(0.2)
    assert policy.expected_frames == pytest.approx(60.0)
    policy.observe(8, 300, BASE_MS + PER_SEQ_MS * 8 + 0.4 * 300)
    policy.finished(40, 300)
    assert policy.prefill_ms_per_token == pytest.approx(0.3)  # the mean of 0.2 and 0.4
    assert policy.expected_frames == pytest.approx(50.0)


def test_a_lone_prefill_is_no_step_of_the_announced_estimate() -> None:
    """A player times the box's steps by its tokens, so a prefill with no stream decoding
    (an idle box) is in no player's estimate: it does not raise the step the policy expects
    the server to announce, and a request that arrives alone is not charged for it. One
    joining running streams is: their tokens wait through its prefill."""
    settings_ = DeadlineSettings(prefill_ms_per_token=2.0, second_chunk_frames=25)
    policy = taught(settings_)
    policy.observe(1, 0, BASE_MS + PER_SEQ_MS)
    request = Waiting("w", 0.0, 300)
    before = policy.deadline_ms(request, 1, alone=True)
    policy.observe(0, 300, BASE_MS + 300 * 2.0)  # an idle box prefills one prompt
    assert policy.deadline_ms(request, 1, alone=True) == pytest.approx(before)
    assert policy.deadline_ms(request, 1) < before - 1000.0
    assert policy.arrive(request, 0.0, [], []) == "admit"


def test_a_long_idle_box_admits_what_it_predicts_late() -> None:
    """A box that has run nothing for IDLE_PROBE_MS admits its next request even when the
    prediction says it starts late: its figures are stale, refusing spares nobody, and the
    request's steps are how the policy learns the box's speed again. Before, a policy whose
    figures a co-tenant had left high refused every arrival and never measured again (the
    real engine under contention refused 166 of 166 requests). A box busy a moment ago
    keeps its refusals."""
    slow = taught(DeadlineSettings(prefill_ms_per_token=4.0, second_chunk_frames=25), factor=1.2)
    request, later = Waiting("w", 0.0, 600), Waiting("x", 0.0, 600)
    assert slow.arrive(request, 0.0, full(12), []) == "shed"  # busy: the prediction decides
    assert slow.deadline_ms(request, alone=True) < 0.0  # late even if admitted now
    assert slow.plan(1000.0, [], [request, later]).shed == ("w", "x")  # idle for a second
    idle = IDLE_PROBE_MS
    assert slow.plan(idle, [], [request], Throttle(held=True)).shed == ("w",)  # held
    assert slow.arrive(request, idle, [], []) == "admit"
    assert slow.plan(idle, [], [request, later]) == StepPlan(admit=("w",), shed=("x",))
    assert slow.shed_total == 5


def test_a_box_busy_a_moment_ago_is_not_idle_for_the_probe() -> None:
    """A lone request ran for 40 s and nothing arrived meanwhile, so no arrival saw the box
    busy; its steps tell when it ran. A request arriving a second after it ended is judged
    by the prediction (refused), not admitted by the idle probe as if the box had idled; 30 s
    after, the probe admits."""
    slow = taught(DeadlineSettings(prefill_ms_per_token=4.0, second_chunk_frames=25), factor=1.2)
    slow.observe(1, 0, 50.0, end_ms=40_000.0)
    assert slow.plan(41_000.0, [], [Waiting("w", 41_000.0, 600)]) == StepPlan(shed=("w",))
    assert slow.plan(70_000.0, [], [Waiting("x", 70_000.0, 600)]) == StepPlan(admit=("x",))


def test_capacity_figures() -> None:
    """The capacity object: real-time streams, counts, the predicted start wait, refusals."""
    policy = taught()
    empty = policy.capacity([], [])
    assert empty.realtime_streams == 12
    assert empty.start_wait_ms == pytest.approx(5 * policy.step_ms(12))
    busy = policy.capacity([*full(11, 40.0), Running("x", 3.0)], [Waiting("a", 0.0, 1)])
    assert busy.running == 12
    assert busy.waiting == 1
    assert busy.start_wait_ms is not None
    assert empty.start_wait_ms is not None
    assert busy.start_wait_ms > empty.start_wait_ms
    assert busy.as_dict()["shed_total"] == 0
    unknown = Deadlines(DeadlineSettings()).capacity([], [])
    assert unknown.realtime_streams is None
    assert unknown.start_wait_ms is None


def reference_steps(limit: int, remaining: list[int], queued: int, hold: int) -> list[int]:
    """The naive reference: step through time one decode step at a time."""
    seats = [*remaining]  # frames left per occupied seat
    out: list[int] = []
    step = 0
    pending = queued
    while pending:
        seats = [r for r in seats if r > 0]
        while pending and len(seats) < limit:
            out.append(step)
            seats.append(hold)
            pending -= 1
        step += 1
        seats = [r - 1 for r in seats]
    return out


@settings(max_examples=examples(200), deadline=None)
@given(
    limit=st.integers(1, 8),
    remaining=st.lists(st.integers(0, 40), max_size=10),
    queued=st.integers(0, 8),
)
def test_admission_steps_match_a_step_by_step_reference(
    limit: int, remaining: list[int], queued: int
) -> None:
    """The seat prediction equals a naive simulation that decodes one frame per step."""
    admission = RealtimeAdmission(80.0)
    policy = Deadlines(DeadlineSettings(expected_frames=20.0), admission, max_num_seqs=limit)
    running = [Running(f"r{i}", float(r)) for i, r in enumerate(remaining)]
    got = policy.admission_steps(running, [Waiting(f"w{i}", 0.0, 300) for i in range(queued)])
    assert got == reference_steps(limit, remaining, queued, hold=21)


def test_settings_are_checked() -> None:
    """Bad settings raise ValueError naming the field."""
    with pytest.raises(ValueError, match="start_slo_ms"):
        DeadlineSettings(start_slo_ms=-1.0)
    with pytest.raises(ValueError, match="order"):
        DeadlineSettings(order="lifo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="first_chunk_frames"):
        DeadlineSettings(first_chunk_frames=0)


def test_realtime_admission_starvation_bound() -> None:
    """A full batch lets one request in once the oldest has waited `max_wait_ms`."""
    admission = RealtimeAdmission(80.0, max_wait_ms=2000.0)
    for n in list(range(4, 15)) * 20:
        admission.observe(n, 0, BASE_MS + PER_SEQ_MS * n)
    assert admission.admissible(12) == 0
    assert admission.admissible(12, oldest_wait_ms=1999.0) == 0
    assert admission.admissible(12, oldest_wait_ms=2000.0) == 1
    assert admission.admissible(10, oldest_wait_ms=5000.0) == 2
    assert RealtimeAdmission(80.0).admissible(0, oldest_wait_ms=1e9) is None


def test_counting_prefills_shrinks_the_sustained_batch() -> None:
    """With prefills counted (300-token prompts at 0.2 ms a token over 100 frames: 0.6 ms a
    step per request) the batch that keeps up is 10, below the decode-only 12; without, 12."""
    counted = taught(DeadlineSettings(prefill_ms_per_token=0.2))
    counted.arrive(Waiting("w", 0.0, 300), 0.0, [], [])
    assert (counted.limit, counted.burst_limit) == (10, 12)
    plain = taught(DeadlineSettings(prefill_ms_per_token=0.2, amortize=False))
    plain.arrive(Waiting("w", 0.0, 300), 0.0, [], [])
    assert plain.limit == 12


def test_a_late_request_may_join_the_decode_batch_while_no_stream_is_at_risk() -> None:
    """The sustained batch (10) is full and its seats free late: the request joins the
    decode-only batch (12) while the spendable headroom is not negative; with a stream at
    risk it is shed; with the decode batch full too, shed."""
    settings_ = DeadlineSettings(prebuffer_ms=200.0, prefill_ms_per_token=0.2)
    request = Waiting("w", 0.0, 300)
    at_ease = Throttle(headroom_ms=50.0)
    at_risk = Throttle(headroom_ms=-10.0)
    for running, throttle, admitted in (
        (full(10, 60.0), at_ease, True),
        (full(10, 60.0), at_risk, False),
        (full(12, 60.0), at_ease, False),
    ):
        policy = taught(settings_)
        assert policy.arrive(request, 0.0, running, [], throttle) == (
            "queue" if admitted else "shed"
        )
        out = policy.plan(0.0, running, [request], throttle)
        assert out.admit == (("w",) if admitted else ())
        assert out.shed == (() if admitted else ("w",))


def test_a_request_late_even_if_admitted_now_is_shed() -> None:
    """Past its deadline by more than the guard, a request is shed even with a seat free
    (it could not be good; its seat serves another)."""
    policy = taught(DeadlineSettings(prebuffer_ms=200.0, guard_ms=100.0))
    request = Waiting("w", 0.0, 300)
    deadline = policy.deadline_ms(request)
    assert policy.plan(deadline + 50.0, full(4), [request]).admit == ("w",)
    assert policy.plan(deadline + 150.0, full(4), [request]).shed == ("w",)


def test_prefills_ahead_and_the_token_budget_delay_the_start() -> None:
    """Prompt tokens admitted ahead, or still being prefilled by running requests, move the
    deadline earlier: their prefill, and a step for each token budget they spill over."""
    policy = taught(
        DeadlineSettings(prebuffer_ms=200.0, prefill_ms_per_token=0.2, token_budget=512)
    )
    request = Waiting("w", 0.0, 300)
    alone = policy.deadline_ms(request, 12)
    behind = policy.deadline_ms(request, 12, ahead_tokens=1200)
    assert alone - behind >= 1200 * 0.2 + 2 * policy.step_ms(12)
    # The same tokens as a running request's chunked prefill under way.
    busy = [*full(11, 60.0)[:10], Running("p", 60.0, prefill_tokens=1200)]
    late_start = Waiting("x", -(3000.0 - 200.0 - 5 * 78.0 - 60.0 - 100.0), 300)
    assert policy.plan(0.0, full(10, 60.0), [late_start]).admit == ("x",)
    assert policy.plan(0.0, busy, [late_start]).shed == ("x",)
