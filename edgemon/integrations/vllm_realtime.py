"""vLLM V1 schedulers with edgemon's gate and real-time admission (the `edgemon` policy).

``vllm serve ... --scheduler-cls edgemon.integrations.vllm_realtime.EdgemonRealtimeScheduler``
(or ``EdgemonRealtimeAsyncScheduler``). Everything `edgemon.integrations.vllm.EdgemonScheduler`
does (the gate from ``EDGEMON_GATE_*``) stays; on top of it, a step admits no request beyond
the concurrency whose decode step, as this scheduler measures it, fits in one codec frame
(`edgemon.policy.realtime.RealtimeAdmission`; ``EDGEMON_REALTIME_FRAME_MS``, default 80,
the frame of Qwen3-TTS's 12.5 Hz codec; ``0`` turns real-time admission off).

How it measures: a step's duration is the time from its ``schedule()`` call to the next one,
while requests were left running (the engine loop schedules the next step as soon as one
ends); what the step batched comes from its ``SchedulerOutput``: the requests it scheduled,
and any tokens beyond one per request (prompt chunks) or a new request (a prefill) mark it as
not decode-only. Only decode-only steps teach the admission anything.

How it admits: when `admissible(running)` is below the number waiting, the step sees a
waiting queue of only the first that many (in vLLM's own order); the rest, and whatever the
step puts back (preemptions), are put back in order afterwards, as the gate does. With nothing
admissible the step runs its running requests only. ``kv_holding_waiting`` is left alone.
The requests kept out still count as waiting for the gate: it is asked while they wait, and
a step that cannot admit them does not end its ``max_hold_ms`` release (``admitted()``).
When the deadline policy plans (``EDGEMON_DEADLINES`` ``hold`` or ``shed``) it applies the
real-time limit itself, bounded by each request's start deadline; this layer then only
measures. The capacity object's ``realtime_streams`` is the measured limit.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import create_request_queue

from edgemon.environ import REALTIME_FRAME_MS, read_variable
from edgemon.integrations._admission import put_back
from edgemon.integrations._vllm_deadlines import composition
from edgemon.integrations.vllm import EdgemonScheduler
from edgemon.policy.realtime import RealtimeAdmission

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from vllm.v1.core.sched.output import SchedulerOutput

    from edgemon.integrations._admission import AdmissionControl

__all__ = [
    "EdgemonRealtimeAsyncScheduler",
    "EdgemonRealtimeScheduler",
    "RealtimeAdmissionMixin",
    "admission_from_environ",
]


def admission_from_environ(environ: Mapping[str, str]) -> RealtimeAdmission | None:
    """Real-time admission as ``EDGEMON_REALTIME_FRAME_MS`` says (default 80 ms; 0: none):
    a decode step may take that frame. A bad value raises `EnvironError` naming it."""
    frame_ms = read_variable(environ, REALTIME_FRAME_MS)
    return None if frame_ms == 0 else RealtimeAdmission(frame_ms)


class RealtimeAdmissionMixin:
    """Real-time admission around a vLLM V1 ``schedule()`` (put before the scheduler class;
    call `_attach_realtime` in ``__init__``)."""

    waiting: Any  # vLLM's RequestQueue
    running: list[Any]
    policy: Any
    _realtime: RealtimeAdmission | None = None
    _realtime_clock: Callable[[], float]
    _realtime_last: tuple[float, int, int] | None  # when, decodes, prefill tokens
    _realtime_limited_steps: int
    _realtime_kept = 0  # waiting requests a step keeps out of vLLM's view
    _edgemon: AdmissionControl  # GatedScheduler's, after this mixin

    def _attach_realtime(
        self, admission: RealtimeAdmission | None, clock: Callable[[], float] | None
    ) -> None:
        self._realtime = admission_from_environ(os.environ) if admission is None else admission
        self._realtime_clock = clock or time.monotonic
        self._realtime_last = None
        self._realtime_limited_steps = 0

    @property
    def edgemon_realtime(self) -> RealtimeAdmission | None:
        """The real-time admission (its `limit`, `scale`, `shape()`), or None when off."""
        return self._realtime

    def _edgemon_none_waiting(self) -> bool:
        """No request waits, counting those real-time admission keeps out of vLLM's view: a
        step that admits nothing because the batch is full neither skips the gate nor ends
        its `max_hold_ms` release (`ThrottleGate.admitted`), as in `edgemon.simulate`."""
        return not self.waiting and not self._realtime_kept

    def _edgemon_realtime_streams(self) -> int | None:
        """The measured real-time batch (None until measured, or with admission off)."""
        admission = self._realtime
        return None if admission is None else admission.limit

    @property
    def edgemon_limited_steps(self) -> int:
        """Steps that kept waiting requests out because of real-time admission."""
        return self._realtime_limited_steps

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        """One step; admissions limited to what real time allows (see the module doc).

        Guarded: if measuring or limiting fails (a vLLM whose objects changed), the step is
        the next layer's (the gate's, then vLLM's own), with every waiting request in its
        queue; the error is counted in ``edgemon_stats.errors`` and logged once."""
        admission = self._realtime
        if admission is None:
            return super().schedule(*args, **kwargs)  # type: ignore[misc]
        now = self._realtime_clock()
        try:
            allowed = self._realtime_allowed(admission, now)
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            self._edgemon.failed("real-time admission")
            allowed = None
        if allowed is None:
            output: SchedulerOutput = super().schedule(*args, **kwargs)  # type: ignore[misc]
        else:
            output = self._schedule_first(allowed, args, kwargs)
        try:
            self._realtime_last = _composition(now, output)
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            self._edgemon.failed("measuring a step")
            self._realtime_last = None
        return output

    def _realtime_allowed(self, admission: RealtimeAdmission, now: float) -> int | None:
        """Learn from the step that just ended; how many waiting requests this step may
        admit, or None when no limit applies (the limit admits all that wait, or the deadline
        policy plans and applies it itself)."""
        last = self._realtime_last
        if last is not None and self.running:
            admission.observe(last[1], last[2], (now - last[0]) * 1000.0)
        if self._edgemon_plans():  # type: ignore[attr-defined]  # GatedScheduler's, after
            return None
        allowed = admission.admissible(len(self.running))
        return None if allowed is None or len(self.waiting) <= allowed else allowed

    def _schedule_first(
        self, allowed: int, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> SchedulerOutput:
        """Schedule with only the first `allowed` waiting requests in view; everything else,
        and whatever the step leaves or preempts, back in vLLM's order afterwards."""
        rest = self.waiting
        moved: list[Any] = []
        try:
            front = create_request_queue(self.policy)
            for _ in range(allowed):
                moved.append(rest.pop_request())
                front.add_request(moved[-1])
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            self._edgemon.failed("real-time admission")
            put_back(rest, moved, self._edgemon, "restoring the waiting queue")
            return super().schedule(*args, **kwargs)  # type: ignore[misc]
        self._realtime_limited_steps += 1
        self.waiting = front
        self._realtime_kept = len(rest)
        try:
            output: SchedulerOutput = super().schedule(*args, **kwargs)  # type: ignore[misc]
        finally:
            self._realtime_kept = 0
            left, self.waiting = self.waiting, rest
            put_back(rest, left, self._edgemon, "re-queueing what a limited step left")
        return output


def _composition(now: float, output: SchedulerOutput) -> tuple[float, int, int] | None:
    """When a step began and what it batched: (when, decodes, prefill tokens), or None for
    a step that scheduled nothing."""
    batched = composition(output)
    return None if batched is None else (now, *batched)


class EdgemonRealtimeScheduler(RealtimeAdmissionMixin, EdgemonScheduler):
    """`EdgemonScheduler` (the gate) with real-time admission."""

    def __init__(
        self,
        *args: Any,
        edgemon_realtime: RealtimeAdmission | None = None,
        edgemon_clock: Callable[[], float] | None = None,
        **kwargs: Any,
    ) -> None:
        """``edgemon_realtime`` and ``edgemon_clock`` (keyword-only, never passed by vLLM):
        an admission object and a clock (seconds) of the caller's; by default from
        ``EDGEMON_REALTIME_FRAME_MS`` and ``time.monotonic``. Other arguments as for
        `EdgemonScheduler` (``edgemon_gate``)."""
        super().__init__(*args, **kwargs)
        self._attach_realtime(edgemon_realtime, edgemon_clock)
        self._attach_deadlines(self._realtime)


class EdgemonRealtimeAsyncScheduler(EdgemonRealtimeScheduler, AsyncScheduler):  # type: ignore[misc]
    """The ``AsyncScheduler`` flavour of `EdgemonRealtimeScheduler`."""
