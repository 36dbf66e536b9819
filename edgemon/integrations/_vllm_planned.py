"""The deadline policy inside edgemon's vLLM and vLLM-Omni schedulers (a mixin put before
`GatedScheduler` and vLLM's class; `edgemon.integrations._vllm_deadlines` holds the policy's
inputs and answers).

- ``__init__`` calls `_attach_deadlines` (again once real-time admission exists, whose limit
  the policy reads); the class's ``schedule()`` calls `_edgemon_planned_step` when
  `_edgemon_plans()` (mode ``hold`` or ``shed`` and requests waiting), else its own step
  followed by `_edgemon_timed`.
- **A planned step** asks the gate once (its hold clock runs as before), takes the policy's
  plan, ends the requests it refuses, and runs vLLM's step with a waiting queue of only the
  requests it admits, in its order (`_schedule_only`, the same queue swap as the gate's);
  the rest, and whatever the step left or preempted, go back in front afterwards. While it
  runs, `_edgemon_planning` is set, so that a hook asked inside vLLM's step (vLLM-Omni's
  ``_should_defer_waiting_admission``) does not hold the planned requests again.
- **At arrival** (``add_request``) a request the policy refuses is ended at once; after each
  ``update_from_output`` the finished requests' lengths teach the policy, and so do those of
  running requests ended from outside (``finish_requests``: the API server aborts a request
  whose client closed its stream, and its seat is free from then on).

Every step of this is guarded: an exception is answered as vLLM's own step would be, counted
in ``edgemon_stats.errors`` and logged once.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from vllm.v1.core.sched.request_queue import create_request_queue

from edgemon.environ import read_engine_environ
from edgemon.integrations._admission import admitted_any, put_back
from edgemon.integrations._vllm_deadlines import DeadlineDriver

if TYPE_CHECKING:
    from edgemon.integrations._admission import AdmissionControl
    from edgemon.policy.realtime import RealtimeAdmission

__all__ = ["DeadlineScheduling"]


class DeadlineScheduling:
    """See the module doc."""

    waiting: Any  # vLLM's RequestQueue
    running: list[Any]
    requests: dict[str, Any]
    policy: Any
    _edgemon: AdmissionControl
    _edgemon_given_driver: DeadlineDriver | None = None
    _edgemon_driver: DeadlineDriver
    _edgemon_planning = False

    def _attach_deadlines(self, admission: RealtimeAdmission | None) -> None:
        """The deadline policy, reading `admission`'s real-time limit (None: none)."""
        given = self._edgemon_given_driver
        self._edgemon_driver = given or DeadlineDriver.from_environ(
            read_engine_environ(os.environ),
            admission,
            getattr(self, "max_num_running_reqs", None),
            token_budget=getattr(self, "max_num_scheduled_tokens", None),
        )

    @property
    def edgemon_deadlines(self) -> DeadlineDriver:
        """The deadline policy (its `mode`, and `policy`: the `Deadlines` object)."""
        return self._edgemon_driver

    def _edgemon_plans(self) -> bool:
        """Whether the policy decides this step's admissions (not when vLLM's queue cannot
        be read: the step is then vLLM's own)."""
        if not self._edgemon_driver.plans:
            return False
        try:
            return bool(self.waiting)
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            self._edgemon.failed("reading vLLM's waiting queue")
            return False

    def _edgemon_start_wait_ms(self) -> float | None:
        """The policy's predicted start wait of a new request."""
        return self._edgemon_driver.start_wait_ms(self.running, self.waiting)

    def _edgemon_unplanned(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The step to fall back on when the plan fails: vLLM's own (a class with the gate's
        rule in its own step gives that)."""
        return super().schedule(*args, **kwargs)  # type: ignore[misc]  # vLLM's, after

    def _edgemon_timed(self, output: Any) -> Any:
        """Tell the policy a step was scheduled (it times the previous one); `output`."""
        try:
            self._edgemon_driver.stepped(output)
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            self._edgemon.failed("timing a step")
        return output

    def add_request(self, request: Any) -> None:
        """vLLM's ``add_request``; a new request the deadline policy refuses at arrival (it
        cannot start within its SLO) is ended at once."""
        try:
            new = request.request_id not in self.requests
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            self._edgemon.failed("the deadline policy at arrival")
            new = False
        super().add_request(request)  # type: ignore[misc]  # vLLM's, after this mixin
        if not new:
            return
        try:
            ahead = [r for r in self.waiting if r is not request]
            refused = self._edgemon_driver.arrive(request, self.running, ahead)
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            self._edgemon.failed("the deadline policy at arrival")
            return
        if refused:
            self.edgemon_end_waiting([request.request_id], "arrival")  # type: ignore[attr-defined]

    def update_from_output(self, *args: Any, **kwargs: Any) -> dict[int, Any]:
        """vLLM's, then the finished requests' lengths taught to the deadline policy; when
        nothing runs any more, the step that just ended goes untimed (the engine may idle
        until the next request, and the next ``schedule()`` would count that wait)."""
        try:
            before = list(self.running)
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            self._edgemon.failed("teaching the deadline policy")
            before = []
        outputs: dict[int, Any] = super().update_from_output(*args, **kwargs)  # type: ignore[misc]
        try:
            self._edgemon_driver.finished(before)
            if not self.running:
                self._edgemon_driver.idle()
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            self._edgemon.failed("teaching the deadline policy")
        return outputs

    def finish_requests(self, request_ids: Any, finished_status: Any) -> list[Any]:
        """vLLM's (the engine ends requests through it when the API server aborts them,
        and edgemon ends waiting ones), then the lengths of the requests it ended taught to
        the deadline policy: a stream whose client closed it took its seat that long (a
        request ended before its first frame teaches nothing)."""
        ended: list[Any] = super().finish_requests(request_ids, finished_status)  # type: ignore[misc]
        try:
            self._edgemon_driver.finished(ended or ())
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            self._edgemon.failed("teaching the deadline policy")
        return ended

    def _edgemon_planned_step(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A step whose admissions the deadline policy chose: the gate's hold ends at each
        request's start deadline; what cannot start in time is ended (mode ``shed``)."""
        control = self._edgemon
        held = control.should_hold()
        try:
            plan = self._edgemon_driver.plan(self.running, self.waiting, held=held)
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            control.failed("the deadline policy's plan")
            return self._edgemon_timed(self._edgemon_unplanned(args, kwargs))
        if plan.shed:
            self.edgemon_end_waiting(plan.shed)  # type: ignore[attr-defined]  # GatedScheduler's
        output = self._schedule_only(plan.admit, args, kwargs)
        try:
            if held and not admitted_any(output):
                control.held(
                    scheduled_tokens=output.total_num_scheduled_tokens, running=len(self.running)
                )
            elif control.releasing:
                control.stepped(admitted=not self.waiting or admitted_any(output))
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            control.failed("accounting for a planned step")
        return self._edgemon_timed(output)

    def _schedule_only(
        self, request_ids: tuple[str, ...], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """vLLM's step with a waiting queue of only these requests, in this order; the rest,
        and what the step leaves or preempts, back in front in vLLM's order afterwards."""
        rest = self.waiting
        chosen: list[Any] = []
        try:
            by_id = {request.request_id: request for request in rest}
            chosen = [by_id[i] for i in request_ids if i in by_id]
            front = create_request_queue(self.policy)
            for request in chosen:
                front.add_request(request)
            rest.remove_requests(chosen)
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            self.waiting = rest
            self._edgemon.failed("choosing the planned requests")
            # A queue that failed halfway through the removal: the removed ones go back.
            put_back(rest, [r for r in chosen if r not in rest], self._edgemon, "restoring")
            return super().schedule(*args, **kwargs)  # type: ignore[misc]
        self.waiting = front
        self._edgemon_planning = True
        try:
            output = super().schedule(*args, **kwargs)  # type: ignore[misc]  # vLLM's, after
        finally:
            self._edgemon_planning = False
            left, self.waiting = self.waiting, rest
            put_back(rest, left, self._edgemon, "re-queueing what a planned step left")
        return output
