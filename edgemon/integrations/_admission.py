"""What a gated scheduler needs around its gate: ownership, counters, the idle back-off, and
the guards that keep edgemon's part of a step from ever stopping the engine.

Kept free of vLLM so that the vLLM and vLLM-Omni schedulers share it and so that it imports
anywhere. The gate itself is anything with `should_throttle_prefills()` (in production
`edgemon.client.ThrottleGate`, built from the environment inside the engine process).

- **Errors.** An exception inside the gate or inside edgemon's part of a step is answered
  "do not hold": it is counted (`AdmissionStats.errors`), the first one is logged with its
  traceback, and vLLM never sees it.
- **Drift.** A step that held the waiting requests must admit none of them. If one was
  admitted anyway (a vLLM whose queue handling changed under the scheduler), the gate is
  disabled for good with one error in the log: the engine runs as vLLM's own, loudly, rather
  than half-gated.
- **A release that admits.** A gate with `admitted()` (the ThrottleGate) is told of every
  step that admitted a waiting request or had none waiting, which ends a `max_hold_ms` release.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from edgemon.client import ThrottleGate
from edgemon.errors import CaughtErrors

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

#: How long a held step that scheduled nothing, with nothing running, waits before it returns.
#: vLLM's engine loop then sleeps 1 ms and steps again; without this back-off a held, idle
#: engine would run about a thousand empty steps a second. A step that has work never waits.
IDLE_SLEEP_S = 0.005

_log = logging.getLogger("edgemon.integrations")


class PrefillGate(Protocol):
    """The one question a scheduler asks every step."""

    def should_throttle_prefills(self) -> bool:
        """Whether new prefills must wait this step (cheap, lock-free)."""
        ...


class _OwnedGate(PrefillGate, Protocol):
    def close(self, timeout: float = ...) -> None: ...


@dataclass(frozen=True, slots=True)
class AdmissionStats:
    """What a gated scheduler did, for the engine's own metrics.

    `held_steps` counts scheduling steps that kept at least one waiting request out because of
    the gate; `idle_sleeps` counts the back-offs of held steps that had nothing else to do.
    The gate's own counters (holds, held seconds, forced releases) are on `gate.stats` when the
    gate is an `edgemon.client.ThrottleGate`.
    """

    held_steps: int
    idle_sleeps: int
    #: Exceptions caught in the gate or in edgemon's part of a step (each: "do not hold").
    errors: int = 0
    #: Whether the drift guard disabled the gate (a held step admitted a held request).
    disabled: bool = False


class AdmissionControl:
    """Owns a scheduler's gate (or none) and counts what the scheduler held.

    A gate built from the environment belongs to this object: it is opened here and closed by
    `close()`. A gate handed in by the caller stays the caller's (neither opened nor closed).
    """

    __slots__ = (
        "_admitted",
        "_disabled",
        "_errors",
        "_gate",
        "_held_steps",
        "_idle_sleep_s",
        "_idle_sleeps",
        "_owned",
        "_sleep",
    )

    def __init__(
        self,
        gate: PrefillGate | None,
        *,
        idle_sleep_s: float = IDLE_SLEEP_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._gate = gate
        self._owned: _OwnedGate | None = None
        self._idle_sleep_s = idle_sleep_s
        self._sleep = sleep
        self._held_steps = 0
        self._idle_sleeps = 0
        self._errors = CaughtErrors(
            _log,
            "edgemon",
            ", caught: the step goes on as vLLM's own would (further errors are counted in "
            "edgemon_stats.errors, not logged)",
        )
        self._disabled = False
        admitted = getattr(gate, "admitted", None)
        self._admitted: Callable[[], None] | None = admitted if callable(admitted) else None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> AdmissionControl:
        """The gate client.md's variables describe, opened; no gate without `EDGEMON_GATE_DEVICE`.

        Bad values raise `ValueError` naming the variable, so a misconfigured engine fails at
        start-up instead of silently never throttling.
        """
        gate = ThrottleGate.from_environ(environ)
        control = cls(gate)
        if gate is not None:
            gate.open()
            control._owned = gate
        return control

    @property
    def gate(self) -> PrefillGate | None:
        """The gate asked every step, or None (the scheduler then behaves exactly as vLLM's)."""
        return self._gate

    def should_hold(self) -> bool:
        """Whether this step must admit no new prefill (False on any error in the gate)."""
        gate = self._gate
        if gate is None or self._disabled:
            return False
        try:
            return bool(gate.should_throttle_prefills())
        except Exception:  # noqa: BLE001 - the engine must not stop for the gate
            self.failed("the gate's should_throttle_prefills()")
            return False

    @property
    def releasing(self) -> bool:
        """Whether the gate waits for a step that admits (a `max_hold_ms` release)."""
        gate = self._gate
        return gate is not None and bool(getattr(gate, "releasing", False))

    def stepped(self, *, admitted: bool) -> None:
        """After a step that was not held: `admitted` if it admitted a waiting request or
        none was waiting, which ends a gate's `max_hold_ms` release."""
        if admitted and self._admitted is not None:
            try:
                self._admitted()
            except Exception:  # noqa: BLE001 - the engine must not stop for the gate
                self.failed("the gate's admitted()")

    def failed(self, where: str) -> None:
        """Count an exception caught in edgemon's part of a step; log the first one (call
        from an `except` block: the traceback goes with it)."""
        self._errors.caught(where)

    def check_drift(self, held: set[str], admitted: set[str]) -> None:
        """The drift guard: `admitted` (this held step's newly scheduled request ids) must
        not meet `held` (the ids it held back); if they do, disable the gate, with one error."""
        leaked = held & admitted
        if leaked and not self._disabled:
            self._disabled = True
            _log.error(
                "edgemon: a step that held the waiting requests admitted %s anyway: this "
                "vLLM's scheduler no longer works as edgemon's scheduler expects; the gate is "
                "disabled (requests are admitted as vLLM's own scheduler would)",
                sorted(leaked),
            )

    def held(self, *, scheduled_tokens: int, running: int) -> None:
        """Record a step that held waiting requests; back off if it had nothing else to do."""
        self._held_steps += 1
        if scheduled_tokens == 0 and running == 0:
            self._idle_sleeps += 1
            self._sleep(self._idle_sleep_s)

    @property
    def stats(self) -> AdmissionStats:
        """A snapshot of the counters."""
        return AdmissionStats(
            held_steps=self._held_steps,
            idle_sleeps=self._idle_sleeps,
            errors=self._errors.count,
            disabled=self._disabled,
        )

    def close(self) -> None:
        """Close the gate if this object opened it; idempotent."""
        owned, self._owned = self._owned, None
        if owned is not None:
            owned.close()


def admitted_ids(output: Any) -> set[str]:
    """The request ids a vLLM `SchedulerOutput` admitted from the waiting queue: new requests
    and requests resumed after a preemption."""
    ids = {new.req_id for new in output.scheduled_new_reqs}
    ids.update(output.scheduled_cached_reqs.resumed_req_ids)
    return ids


def admitted_any(output: Any) -> bool:
    """Whether a vLLM `SchedulerOutput` admitted anything from the waiting queue."""
    return bool(output.scheduled_new_reqs or output.scheduled_cached_reqs.resumed_req_ids)


def put_back(queue: Any, requests: Iterable[Any], control: AdmissionControl, where: str) -> None:
    """Put `requests` back in front of vLLM's waiting `queue`, in their order: whatever a step
    took out of the queue (requests held, kept out or preempted) goes back where vLLM expects it.

    If the queue refuses (`prepend_requests` raises), the requests not yet in it go to its back
    instead, rather than being lost; the error is counted and logged once (`where`)."""
    requests = list(requests)
    if not requests:
        return
    try:
        # prepend_requests puts its argument in front in reverse (it is extendleft for FCFS;
        # order-free for priority queues): reversing keeps the requests' own order.
        queue.prepend_requests(reversed(requests))
    except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
        control.failed(where)
        for request in requests:  # at the back rather than lost
            if request not in queue:
                queue.add_request(request)


def require_hook(cls: type[Any], name: str) -> None:
    """Fail at import, naming the version, if `cls` lacks the method edgemon overrides: a
    vLLM-Omni that renamed its admission hook would otherwise never call edgemon's gate."""
    if not callable(getattr(cls, name, None)):
        message = (
            f"{cls.__module__}.{cls.__qualname__} has no {name}(): edgemon's scheduler "
            "cannot gate this version (see edgemon.integrations.vllm_omni for the supported ones)"
        )
        raise ImportError(message)  # noqa: TRY004 - an import that cannot work


class StepReport(Protocol):
    """What a scheduler reports after each step (`edgemon.integrations._vllm_shed.EngineReport`
    for vLLM and vLLM-Omni): the requests it ended, and the capacity object."""

    @property
    def shed_total(self) -> int:
        """Waiting requests ended so far."""
        ...

    def shed(self, scheduler: Any, request_ids: Iterable[str], reason: str = ...) -> list[str]:
        """End these waiting requests of `scheduler` now (`reason`: arrival or queued); the
        ids ended."""
        ...

    def add_outputs(self, outputs: dict[int, Any]) -> None:
        """Add the final outputs of the requests ended since the last step."""
        ...

    def publish(
        self,
        *,
        realtime_streams: int | None,
        running: int,
        waiting: int,
        start_wait_ms: float | None,
    ) -> None:
        """Hand the capacity figures on."""
        ...

    def close(self) -> None:
        """Release what the report owns."""
        ...


class GatedScheduler:
    """The gate plumbing the vLLM and vLLM-Omni schedulers share (a mixin put before vLLM's
    class): `_attach_gate` in `__init__`, then `edgemon_gate` and `edgemon_stats`; with
    `_attach_report`, the step's report (ended requests, the capacity object) after every
    ``update_from_output``."""

    _edgemon: AdmissionControl
    _edgemon_report: StepReport | None = None

    def _attach_gate(self, gate: PrefillGate | None) -> None:
        """Use `gate` (the caller's), or by default the one this process's environment
        describes (then this scheduler owns it and closes it at shutdown)."""
        self._edgemon = (
            AdmissionControl.from_environ(os.environ) if gate is None else AdmissionControl(gate)
        )

    def _edgemon_none_waiting(self) -> bool:
        """Whether no request waits for admission (then the gate is not asked, and a step
        ends a `max_hold_ms` release). A scheduler that shows vLLM only part of its queue
        (real-time admission) counts the part it keeps out too. Unguarded: call it through
        `_edgemon_nothing_waits` or inside a ``try``."""
        return not self.waiting  # type: ignore[attr-defined]  # vLLM's queue, after this mixin

    def _edgemon_nothing_waits(self) -> bool:
        """`_edgemon_none_waiting`, guarded: a queue edgemon cannot read (a vLLM that renamed
        it) counts as empty, so the step is vLLM's own; counted, logged once."""
        try:
            return self._edgemon_none_waiting()
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            self._edgemon.failed("reading vLLM's waiting queue")
            return True

    def _edgemon_stepped(self, output: Any) -> None:
        """After a step that was not held, during a `max_hold_ms` release: end the release if
        the step admitted a waiting request or none waits. A step whose output edgemon cannot
        read (a vLLM that renamed a field) is counted, logged once, and leaves the release
        on: a released gate holds nothing, as vLLM's own scheduler."""
        control = self._edgemon
        if not control.releasing:
            return
        try:
            admitted = self._edgemon_none_waiting() or admitted_any(output)
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            control.failed("reading what a step admitted")
            return
        control.stepped(admitted=admitted)

    @property
    def edgemon_gate(self) -> PrefillGate | None:
        """The gate asked every step (its `stats` count holds and held seconds), or None."""
        return self._edgemon.gate

    @property
    def edgemon_stats(self) -> AdmissionStats:
        """Steps that held waiting requests, and idle back-offs, so far."""
        return self._edgemon.stats

    def _attach_report(self, report: StepReport) -> None:
        """Report after every step from now on; publish the idle figures at once (an engine
        with no request never steps)."""
        self._edgemon_report = report
        self._edgemon_publish(report)

    def edgemon_end_waiting(self, request_ids: Iterable[str], reason: str = "queued") -> list[str]:
        """End these waiting requests now, as requests whose start deadline cannot be met
        (``finish_reason`` ``abort``, ``stop_reason`` ``edgemon:start_deadline``); the ids
        ended. Without a report (no vLLM), none."""
        report = self._edgemon_report
        if report is None:
            return []
        try:
            return report.shed(self, request_ids, reason)
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            self._edgemon.failed("ending waiting requests")
            return []

    def _edgemon_plans(self) -> bool:
        """Whether a deadline policy decides this step's admissions (then real-time admission
        does not limit them again)."""
        return False

    def _edgemon_realtime_streams(self) -> int | None:
        """The batch the box decodes in real time now (None: not measured here)."""
        return None

    def _edgemon_start_wait_ms(self) -> float | None:
        """The predicted wait of a new request before its first token (None: unknown)."""
        return None

    def _edgemon_publish(self, report: StepReport) -> None:
        try:
            report.publish(
                realtime_streams=self._edgemon_realtime_streams(),
                running=len(self.running),  # type: ignore[attr-defined]  # vLLM's, after this mixin
                waiting=len(self.waiting),  # type: ignore[attr-defined]
                start_wait_ms=self._edgemon_start_wait_ms(),
            )
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
            self._edgemon.failed("publishing the capacity figures")

    def update_from_output(self, *args: Any, **kwargs: Any) -> dict[int, Any]:
        """vLLM's ``update_from_output``, then the final outputs of the requests edgemon
        ended this step, then the capacity figures."""
        outputs: dict[int, Any] = super().update_from_output(*args, **kwargs)  # type: ignore[misc]
        report = self._edgemon_report
        if report is not None:
            try:
                report.add_outputs(outputs)
            except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
                self._edgemon.failed("reporting the requests edgemon ended")
            self._edgemon_publish(report)
        return outputs

    def shutdown(self) -> None:
        """Shut vLLM's scheduler down (next in the MRO), then close the gate if this
        scheduler opened it, and the capacity publisher."""
        try:
            super().shutdown()  # type: ignore[misc]  # vLLM's scheduler, after this mixin
        finally:
            self._edgemon.close()
            report = self._edgemon_report
            if report is not None:
                report.close()
