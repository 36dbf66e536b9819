"""vLLM V1 schedulers with edgemon's gate and real-time admission (the `edgemon` policy).

``--scheduler-cls edgemon.integrations.vllm_realtime.EdgemonRealtimeScheduler`` (or
``EdgemonRealtimeAsyncScheduler``), as in the engine command line the documentation shows
(docs/how-to/vllm.md). Everything `edgemon.integrations.vllm.EdgemonScheduler` does (the gate
from ``EDGEMON_GATE_*``) stays; on top of it, a step admits no request beyond
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

Both parts are edgemon's vLLM driver's (`edgemon.integrations._driver`), as in
`EdgemonScheduler`: the real-time schedulers only build real-time admission by default.
"""

from __future__ import annotations

from vllm.v1.core.sched.async_scheduler import AsyncScheduler

from edgemon.integrations.vllm import EdgemonScheduler

__all__ = ["EdgemonRealtimeAsyncScheduler", "EdgemonRealtimeScheduler"]


class EdgemonRealtimeScheduler(EdgemonScheduler):
    """`EdgemonScheduler` (the gate) with real-time admission: ``edgemon_realtime`` (an
    admission object of the caller's) or ``EDGEMON_REALTIME_FRAME_MS``."""

    _edgemon_realtime_by_default = True


class EdgemonRealtimeAsyncScheduler(EdgemonRealtimeScheduler, AsyncScheduler):  # type: ignore[misc]
    """The ``AsyncScheduler`` flavour of `EdgemonRealtimeScheduler`."""
