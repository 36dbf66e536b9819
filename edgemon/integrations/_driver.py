"""`StepDriver`: edgemon's part of every vLLM scheduling step, in one object.

Per step (``schedule()``), the driver:

1. **times the step that just ended** on its one clock: from its ``schedule()`` to this one,
   with what it batched (its ``SchedulerOutput``: requests, and prompt tokens beyond one per
   request). A step after which nothing ran is not timed (the engine may have idled until
   the next request). Real-time admission learns from it (`edgemon.policy.realtime`: only
   decode-only steps teach it), and so does the deadline policy;
2. **parks** (``EDGEMON_PARKING``, `edgemon.integrations._parking`): the running requests
   parking holds out sit the step out of vLLM's running list, and go back in front of it
   after the step; their rows are free for the batch's limit, not their seats;
3. **asks its parts** what vLLM may admit: with requests waiting, the deadline policy's plan
   when it plans (``EDGEMON_DEADLINES`` ``hold``: the gate's hold bounded by each request's
   start deadline; ``shed``: the requests that cannot start in time named to end, and no hold
   on the gate), within real-time admission's limit; else edgemon's gate (hold: admit
   nothing) and real-time admission (admit no more than the batch whose decode step fits a
   frame, the first ones in vLLM's order);
4. **runs vLLM's own step** with a waiting queue of only the requests admitted, and puts the
   rest back (`edgemon.integrations._queue.showing`). vLLM-Omni's talker holds through its
   own hook instead (``_should_defer_waiting_admission``, answered by `defers`);
5. **accounts for the step**: a held step that admitted a held request anyway disables the
   gate (the drift guard); a held step with nothing to run backs off; a step that admitted,
   or had nothing waiting, ends the gate's ``max_hold_ms`` release.

Between steps it ends the requests the policy refuses at arrival (`arrived`), teaches the
policy the lengths of finished requests (`updated`, `ended`) and hands the capacity figures
to the report (`publish`).

The requests kept out still count as waiting for the gate: it is asked while they wait, and a
step that cannot admit them does not end its release. Every part of this is guarded: an
exception is answered as vLLM's own step would be, counted in ``edgemon_stats.errors`` and
logged once (`AdmissionControl.failed`). Free of vLLM: the scheduler hands in itself, its
queue factory and its report.
"""

from __future__ import annotations

import itertools
import time
from typing import TYPE_CHECKING, Any

from edgemon.integrations._queue import (
    HELD,
    LIMITED,
    PLANNED,
    admitted_any,
    admitted_ids,
    composition,
    showing,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from contextlib import AbstractContextManager

    from edgemon.integrations._admission import AdmissionControl
    from edgemon.integrations._deadlines import VllmDeadlines
    from edgemon.integrations._parking import ServedParking
    from edgemon.integrations._queue import Queues, Shown
    from edgemon.integrations._vllm_report import EngineReport
    from edgemon.policy.realtime import RealtimeAdmission

__all__ = ["StepDriver"]


class StepDriver:
    """edgemon's part of one vLLM scheduler's steps; see the module doc."""

    __slots__ = (
        "_apart",
        "_asked",
        "_clock",
        "_deferred",
        "_held_ids",
        "_hold_in_hook",
        "_in_step",
        "_last",
        "_new_queue",
        "_parked",
        "_scheduler",
        "control",
        "deadlines",
        "limited_steps",
        "parking",
        "realtime",
        "report",
    )

    def __init__(  # noqa: PLR0913 - the scheduler, then its parts by keyword
        self,
        scheduler: Queues,
        new_queue: Callable[[Any], Any],
        *,
        control: AdmissionControl,
        realtime: RealtimeAdmission | None,
        deadlines: VllmDeadlines,
        report: EngineReport,
        clock: Callable[[], float] = time.time,
        hold_in_hook: bool = False,
        parking: ServedParking | None = None,
    ) -> None:
        """`new_queue(policy)`: vLLM's ``create_request_queue``; `clock`: seconds on the clock
        of the requests' ``arrival_time`` (vLLM's: the wall clock); `hold_in_hook`: the
        scheduler holds when `defers` says so (vLLM-Omni's), not by the queue swap;
        `parking`: which running requests sit a step out (`_parking`), or None. Publishes
        the idle figures at once (an engine with no request never steps)."""
        self._scheduler = scheduler
        self._new_queue = new_queue
        self._clock = clock
        self._hold_in_hook = hold_in_hook
        #: The gate, its counters and the error count (`AdmissionControl`).
        self.control = control
        #: Real-time admission, or None.
        self.realtime = realtime
        #: The deadline policy (`VllmDeadlines`: its `mode` and `policy`).
        self.deadlines = deadlines
        #: The report of ended requests and the capacity object.
        self.report = report
        #: Parking (`ServedParking`: its `feed`, `parks` and `parked_steps`), or None.
        self.parking = parking
        #: Steps in which real-time admission allowed fewer requests than were waiting.
        self.limited_steps = 0
        self._parked: list[Any] = []  # the requests parked for the step under way
        self._apart: frozenset[str] = frozenset()  # and those whose rows count as free
        self._last: tuple[float, int, int] | None = None  # the step under way: when, batch
        self._in_step = False  # vLLM's own step of a gated step is under way
        self._asked: bool | None = None  # the gate's answer this step (None: not asked)
        self._deferred = False  # the hook held this step
        self._held_ids: set[str] = set()
        self.publish()

    def _now_ms(self) -> float:
        return self._clock() * 1000.0

    # ------------------------------------------------------------------ a step
    def schedule(self, step: Callable[[], Any]) -> Any:
        """One step: `step()` is vLLM's own scheduling, run as the parts say."""
        now_ms = self._now_ms()
        self._learn(now_ms)
        parked = self._park(now_ms)
        try:
            output = self._step(now_ms, step)
        finally:
            if parked:
                self._scheduler.running[:0] = parked  # in front: the oldest, preempted last
            self._parked, self._apart = [], frozenset()
        try:
            batched = composition(output)
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            self.control.failed("measuring a step")
            batched = None
        self._last = None if batched is None else (now_ms, *batched)
        return output

    def _learn(self, now_ms: float) -> None:
        """The step that just ended, timed, taught to real-time admission and the policy."""
        last = self._last
        if last is None:
            return
        try:
            if not self._scheduler.running:
                return
            began_ms, decodes, prompt_tokens = last
            if self.realtime is not None:
                self.realtime.observe(decodes, prompt_tokens, now_ms - began_ms)
            self.deadlines.policy.observe(decodes, prompt_tokens, now_ms - began_ms, end_ms=now_ms)
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            self.control.failed("timing a step")

    def _step(self, now_ms: float, step: Callable[[], Any]) -> Any:
        try:
            waits = bool(self._scheduler.waiting)
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            self.control.failed("reading vLLM's waiting queue")
            return step()
        if not waits:
            output = step()
            self._stepped(output)
            return output
        if self.deadlines.plans:
            return self._planned(now_ms, step)
        return self._gated(step, self._limit(), held=None)

    def _park(self, now_ms: float) -> list[Any]:
        """Take the requests parking holds out of vLLM's running list for this step; them.
        The rows of those parked already are free (for the batch's limit)."""
        parking = self.parking
        if parking is None:
            return []
        scheduler = self._scheduler
        try:
            running = list(scheduler.running)
            rows = self._rows()
            batch = len(running) - len(parking.parked)
            held, self._apart = parking.step(
                now_ms,
                self.deadlines.running(running, now_ms),
                waiting=len(scheduler.waiting),
                free_rows=len(scheduler.waiting) if rows is None else rows - batch,
                step_ms=self.deadlines.policy.step_ms(batch),
            )
            if not held:
                return []
            scheduler.running[:] = [r for r in running if r.request_id not in held]
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            self.control.failed("parking")
            return []
        parked = [r for r in running if r.request_id in held]
        self._parked = parked
        return parked

    def _rows(self) -> int | None:
        """The batch rows: the deadline policy's real-time batch when it plans, else real-time
        admission's limit, within vLLM's seats (None: unknown)."""
        seats: int | None = getattr(self._scheduler, "max_num_running_reqs", None)
        if self.parking is not None and self.parking.rows is not None:
            seats = self.parking.rows if seats is None else min(seats, self.parking.rows)
        if self.deadlines.plans:
            limit = self.deadlines.policy.limit
        else:
            limit = None if self.realtime is None else self.realtime.limit
        if limit is None or seats is None:
            return seats if limit is None else limit
        return min(limit, seats)

    def _seats(self) -> int | None:
        """vLLM's seats left with this step's parked requests counted (None: none parked,
        vLLM counts its own)."""
        seats: int | None = getattr(self._scheduler, "max_num_running_reqs", None)
        if not self._parked or seats is None:
            return None
        return max(0, seats - len(self._scheduler.running) - len(self._parked))

    def _limit(self) -> int | None:
        """How many waiting requests real-time admission and the seats the parked requests
        keep let into this step, or None when all that wait may go."""
        scheduler = self._scheduler
        allowed = self._seats()
        admission = self.realtime
        try:
            waiting = len(scheduler.waiting)
            limited = None if admission is None else admission.admissible(len(scheduler.running))
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            self.control.failed("real-time admission")
            limited = None
        if limited is not None and waiting > limited:
            self.limited_steps += 1
            allowed = limited if allowed is None else min(allowed, limited)
        return None if allowed is None or waiting <= allowed else allowed

    def _gated(self, step: Callable[[], Any], limit: int | None, *, held: bool | None) -> Any:
        """A step with the gate's rule and real-time admission's limit (`held`: the gate's
        answer when it was asked already)."""
        self._asked, self._deferred = held, False
        if not self._hold_in_hook and self._holds():
            return self._held_step(step)
        self._in_step = True
        try:
            if limit is None:
                output = step()
            else:
                with self._showing(_first(limit), LIMITED):
                    output = step()
        finally:
            self._in_step = False
        if self._deferred:
            self._account_held(output, self._held_ids)
        else:
            self._stepped(output)
        return output

    def _showing(
        self, pick: Callable[[Any], Sequence[Any]], why: Shown
    ) -> AbstractContextManager[bool]:
        """vLLM's waiting queue showing only what `pick` chooses (`showing`)."""
        return showing(self._scheduler, self._new_queue, pick, why, self.control)

    def _holds(self) -> bool:
        """The gate's answer this step (asked once)."""
        if self._asked is None:
            self._asked = self.control.should_hold()
        return self._asked

    def defers(self) -> bool:
        """vLLM-Omni's ``_should_defer_waiting_admission``, edgemon's part: whether the gate
        holds the gated step under way (never a planned step: the plan includes the gate)."""
        if not (self._in_step and self._holds()):
            return False
        try:
            self._held_ids = {request.request_id for request in self._scheduler.waiting}
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            self.control.failed("noting the held requests")
            return False
        self._deferred = True
        return True

    def _held_step(self, step: Callable[[], Any]) -> Any:
        """vLLM's step with no waiting request in view; counted, and checked for drift."""
        try:
            held_ids = {request.request_id for request in self._scheduler.waiting}
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            self.control.failed("holding the waiting queue")
            return step()
        with self._showing(_none, HELD) as shown:
            output = step()
        if shown:
            self._account_held(output, held_ids)
        return output

    def _account_held(self, output: Any, held_ids: set[str]) -> None:
        try:
            self.control.check_drift(held_ids, admitted_ids(output))
            self._held(output)
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            self.control.failed("accounting for a held step")

    def _held(self, output: Any) -> None:
        """Count a step the gate held (it admitted nothing) with what it still scheduled."""
        self.control.held(
            scheduled_tokens=output.total_num_scheduled_tokens,
            running=len(self._scheduler.running),
        )

    def _stepped(self, output: Any) -> None:
        """After a step that was not held, during a `max_hold_ms` release: end the release if
        the step admitted a waiting request or none waits. A step whose output edgemon cannot
        read leaves the release on: a released gate holds nothing, as vLLM's own scheduler."""
        control = self.control
        if not control.releasing:
            return
        try:
            admitted = not self._scheduler.waiting or admitted_any(output)
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            control.failed("reading what a step admitted")
            return
        control.stepped(admitted=admitted)

    def _planned(self, now_ms: float, step: Callable[[], Any]) -> Any:
        """A step whose admissions the deadline policy chose. Mode ``hold``: the gate's hold
        ends at each request's start deadline. Mode ``shed`` (the shipped policy): what cannot
        start in time is ended, and edgemon's throttle holds nothing (on top of the deadline
        policy it bought nothing at any point measured: docs/explanation/does-it-help.md)."""
        control = self.control
        scheduler = self._scheduler
        held = self.deadlines.mode == "hold" and control.should_hold()
        try:
            running = [*scheduler.running, *self._parked]
            plan = self.deadlines.plan(
                now_ms, running, scheduler.waiting, held=held, apart=self._apart
            )
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            control.failed("the deadline policy's plan")
            return self._gated(step, self._seats(), held=held)
        if plan.shed:
            self.end_waiting(plan.shed)
        seats = self._seats()
        admit = plan.admit if seats is None else plan.admit[:seats]
        with self._showing(_ids(admit), PLANNED):
            output = step()
        try:
            idle = held and not admitted_any(output)
            if idle:
                self._held(output)
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            control.failed("accounting for a planned step")
            return output
        if not idle:
            self._stepped(output)
        return output

    # ------------------------------------------------------------------ between steps
    def is_new(self, request: Any) -> bool:
        """Whether `request` is not yet one of the scheduler's (asked before vLLM adds it)."""
        try:
            return request.request_id not in self._scheduler.requests
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            self.control.failed("the deadline policy at arrival")
            return False

    def arrived(self, request: Any) -> None:
        """A new request is in the waiting queue: ended at once if the policy refuses it (it
        cannot start within its SLO)."""
        scheduler = self._scheduler
        try:
            now_ms = self._now_ms()
            ahead = [r for r in scheduler.waiting if r is not request]
            running = list(scheduler.running)
            apart: frozenset[str] = frozenset()
            if (parking := self.parking) is not None:
                batch = len(running) - len(parking.parked)
                views = self.deadlines.running(running, now_ms)
                apart = parking.spare(now_ms, views, self.deadlines.policy.step_ms(batch))
            refused = self.deadlines.arrive(request, now_ms, running, ahead, apart=apart)
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            self.control.failed("the deadline policy at arrival")
            return
        if refused:
            self.end_waiting([request.request_id], "arrival")

    def before_update(self) -> list[Any]:
        """The running requests before vLLM's ``update_from_output`` (some then finish)."""
        try:
            return list(self._scheduler.running)
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            self.control.failed("teaching the deadline policy")
            return []

    def updated(self, before: list[Any], outputs: dict[int, Any]) -> None:
        """After vLLM's ``update_from_output``: the final outputs of the requests edgemon
        ended, the capacity figures, then the finished requests' lengths taught to the
        policy. When nothing runs any more, the step that just ended goes untimed (the engine
        may idle until the next request, and the next ``schedule()`` would count that wait)."""
        try:
            self.report.add_outputs(outputs)
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            self.control.failed("reporting the requests edgemon ended")
        self.publish()
        try:
            self.deadlines.finished(before)
            if not self._scheduler.running:
                self._last = None
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            self.control.failed("teaching the deadline policy")

    def ended(self, requests: Iterable[Any] | None) -> None:
        """Requests vLLM's ``finish_requests`` ended (the API server aborts a request whose
        client closed its stream, and edgemon ends waiting ones): the lengths of those that
        spoke taught to the policy (their seats were taken that long)."""
        try:
            self.deadlines.finished(requests or ())
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            self.control.failed("teaching the deadline policy")

    def end_waiting(self, request_ids: Iterable[str], reason: str = "queued") -> list[str]:
        """End these waiting requests now, as requests whose start deadline cannot be met
        (``finish_reason`` ``abort``, ``stop_reason`` ``edgemon:start_deadline``); the ids
        ended."""
        try:
            return self.report.shed(self._scheduler, request_ids, reason)
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            self.control.failed("ending waiting requests")
            return []

    def publish(self) -> None:
        """Hand the capacity figures to the report."""
        scheduler = self._scheduler
        try:
            running, waiting = scheduler.running, scheduler.waiting
            self.report.publish(
                realtime_streams=None if self.realtime is None else self.realtime.limit,
                running=len(running),
                waiting=len(waiting),
                start_wait_ms=self.deadlines.start_wait_ms(self._now_ms(), running, waiting),
            )
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            self.control.failed("publishing the capacity figures")

    def close(self) -> None:
        """Close the gate if the driver's control opened it, the report and the feed."""
        try:
            self.control.close()
        finally:
            try:
                self.report.close()
            finally:
                if self.parking is not None:
                    self.parking.close()


def _none(_queue: Any) -> list[Any]:
    return []


def _first(count: int) -> Callable[[Any], list[Any]]:
    """The first `count` requests of a queue, in vLLM's order."""
    return lambda queue: list(itertools.islice(queue, count))


def _ids(request_ids: tuple[str, ...]) -> Callable[[Any], list[Any]]:
    """The requests of a queue with these ids, in this order."""

    def chosen(queue: Any) -> list[Any]:
        by_id = {request.request_id: request for request in queue}
        return [by_id[i] for i in request_ids if i in by_id]

    return chosen
