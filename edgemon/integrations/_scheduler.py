"""`EdgemonHooks`: the methods of vLLM's scheduler that edgemon's driver takes part in (a
mixin put before vLLM's or vLLM-Omni's scheduler class), and the driver's parts built from
the engine's environment.

Each hook hands its call to the scheduler's `StepDriver` (``self._edgemon``):
``schedule()`` runs vLLM's own step as the driver says; ``add_request`` lets the deadline
policy refuse a new request; ``update_from_output`` and ``finish_requests`` report and teach
it; ``shutdown`` closes the gate and the capacity publisher. The engine's variables are read
once, when the scheduler is built (`edgemon.environ.read_engine_environ`); a part handed in
(``edgemon_gate``, ``edgemon_realtime``, ``edgemon_deadlines``, ``edgemon_capacity``,
``edgemon_clock``: keyword-only, never passed by vLLM) replaces the environment's.

What differs between the engines is one `Engine` value per scheduler class
(``_edgemon_engine``): vLLM's queue factory and report, its version check, and whether it
holds through vLLM-Omni's hook. A class with ``_edgemon_realtime_by_default`` builds real-time
admission from ``EDGEMON_REALTIME_FRAME_MS`` when none is handed in.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

from edgemon.environ import read_engine_environ
from edgemon.integrations._admission import AdmissionControl
from edgemon.integrations._deadlines import VllmDeadlines
from edgemon.integrations._driver import StepDriver
from edgemon.integrations._parking import parking_from_environ
from edgemon.policy.realtime import RealtimeAdmission
from edgemon.shedding.topic import CapacityPublisher, TopicConfig

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from edgemon.integrations._admission import AdmissionStats, PrefillGate
    from edgemon.integrations._parking import ServedParking
    from edgemon.integrations._vllm_report import EngineReport

    class _VllmScheduler:
        """What edgemon uses of vLLM's scheduler, the class after `EdgemonHooks`."""

        waiting: Any  # vLLM's RequestQueue
        running: list[Any]
        requests: dict[str, Any]
        policy: Any

        def __init__(self, *args: Any, **kwargs: Any) -> None: ...
        def schedule(self, *args: Any, **kwargs: Any) -> Any: ...
        def add_request(self, request: Any) -> None: ...
        def update_from_output(self, *args: Any, **kwargs: Any) -> dict[int, Any]: ...
        def finish_requests(self, request_ids: Any, finished_status: Any) -> list[Any]: ...
        def shutdown(self) -> None: ...

else:
    _VllmScheduler = object

__all__ = ["EdgemonHooks", "Engine"]


def _rows(seats: int | None, parking_rows: int) -> int | None:
    """The batch's rows: vLLM's seats, or fewer with ``EDGEMON_PARKING_ROWS``."""
    if not parking_rows:
        return seats
    return parking_rows if seats is None else min(seats, parking_rows)


@dataclass(frozen=True, slots=True)
class Engine:
    """What edgemon's scheduler needs of the engine it subclasses."""

    new_queue: Callable[[Any], Any]
    """vLLM's ``create_request_queue(policy)``."""
    report: Callable[[CapacityPublisher | None], EngineReport]
    """The step report over a capacity publisher (`_vllm_report.EngineReport`)."""
    check_versions: Callable[[], object]
    """Warn once if this engine's version is not tested (`_versions.check_version`)."""
    hold_in_hook: bool = False
    """The engine holds through vLLM-Omni's ``_should_defer_waiting_admission`` hook."""


class EdgemonHooks(_VllmScheduler):
    """See the module doc."""

    _edgemon_engine: ClassVar[Engine]
    _edgemon_realtime_by_default: ClassVar[bool] = False
    _edgemon: StepDriver

    def __init__(
        self,
        *args: Any,
        edgemon_gate: PrefillGate | None = None,
        edgemon_realtime: RealtimeAdmission | None = None,
        edgemon_deadlines: VllmDeadlines | None = None,
        edgemon_capacity: CapacityPublisher | None = None,
        edgemon_clock: Callable[[], float] | None = None,
        **kwargs: Any,
    ) -> None:
        """Build vLLM's scheduler, then edgemon's driver and its parts.

        ``edgemon_gate``: a gate the caller owns (default: from ``EDGEMON_GATE_*``, owned and
        closed by this scheduler); ``edgemon_realtime``: real-time admission (default: from
        ``EDGEMON_REALTIME_FRAME_MS`` for the real-time schedulers, else none);
        ``edgemon_deadlines``: the deadline policy (default: ``EDGEMON_DEADLINES``,
        ``EDGEMON_SLO_START_MS``, ``EDGEMON_DEADLINE_*``); ``edgemon_capacity``: an opened
        capacity publisher, closed at shutdown (default: from ``EDGEMON_GATE_*``, or none);
        ``edgemon_clock``: the clock in seconds that times the steps and reads the requests'
        arrival times (default ``time.time``, vLLM's clock for them). Bad variables raise
        `edgemon.environ.EnvironError` naming each.
        """
        super().__init__(*args, **kwargs)
        engine = self._edgemon_engine
        engine.check_versions()
        environ = read_engine_environ(os.environ)
        realtime = edgemon_realtime
        if realtime is None and self._edgemon_realtime_by_default and environ.realtime_frame_ms:
            realtime = RealtimeAdmission(environ.realtime_frame_ms)
        if edgemon_deadlines is None:
            edgemon_deadlines = VllmDeadlines.from_environ(
                environ,
                realtime,
                _rows(getattr(self, "max_num_running_reqs", None), environ.parking_rows),
                token_budget=getattr(self, "max_num_scheduled_tokens", None),
            )
        if edgemon_gate is None:
            control = AdmissionControl.from_gate(environ.gate)
        else:
            control = AdmissionControl(edgemon_gate)
        try:
            if edgemon_capacity is None:
                config = TopicConfig.from_gate(environ.gate)
                edgemon_capacity = None if config is None else CapacityPublisher(config).open()
            parking = parking_from_environ(environ, edgemon_deadlines.policy.settings)
        except BaseException:
            control.close()  # the gate this scheduler opened, if it opened one
            if edgemon_capacity is not None:
                edgemon_capacity.close()
            raise
        self._edgemon = StepDriver(
            self,
            engine.new_queue,
            control=control,
            realtime=realtime,
            deadlines=edgemon_deadlines,
            report=engine.report(edgemon_capacity),
            clock=edgemon_clock or time.time,
            hold_in_hook=engine.hold_in_hook,
            parking=parking,
        )

    # ------------------------------------------------------------------ vLLM's methods
    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        """One scheduling step, vLLM's own as edgemon's driver shows it the waiting queue."""
        return self._edgemon.schedule(partial(super().schedule, *args, **kwargs))

    def add_request(self, request: Any) -> None:
        """vLLM's ``add_request``; a new request the deadline policy refuses at arrival (it
        cannot start within its SLO) is ended at once."""
        new = self._edgemon.is_new(request)
        super().add_request(request)
        if new:
            self._edgemon.arrived(request)

    def update_from_output(self, *args: Any, **kwargs: Any) -> dict[int, Any]:
        """vLLM's, then the final outputs of the requests edgemon ended, the capacity
        figures, and the finished requests' lengths taught to the deadline policy."""
        before = self._edgemon.before_update()
        outputs = super().update_from_output(*args, **kwargs)
        self._edgemon.updated(before, outputs)
        return outputs

    def finish_requests(self, request_ids: Any, finished_status: Any) -> list[Any]:
        """vLLM's (the engine ends requests through it when the API server aborts them, and
        edgemon ends waiting ones), then the lengths of those it ended taught to the policy."""
        ended = super().finish_requests(request_ids, finished_status)
        self._edgemon.ended(ended)
        return ended

    def shutdown(self) -> None:
        """Shut vLLM's scheduler down, then close the gate if this scheduler opened it, and
        the capacity publisher."""
        try:
            super().shutdown()
        finally:
            self._edgemon.close()

    # ------------------------------------------------------------------ edgemon's
    @property
    def edgemon_gate(self) -> PrefillGate | None:
        """The gate asked every step (its `stats` count holds and held seconds), or None."""
        return self._edgemon.control.gate

    @property
    def edgemon_stats(self) -> AdmissionStats:
        """Steps that held waiting requests, idle back-offs and errors caught, so far."""
        return self._edgemon.control.stats

    @property
    def edgemon_realtime(self) -> RealtimeAdmission | None:
        """The real-time admission (its `limit`, `scale`, `shape()`), or None when off."""
        return self._edgemon.realtime

    @property
    def edgemon_limited_steps(self) -> int:
        """Steps in which real-time admission let fewer requests in than were waiting."""
        return self._edgemon.limited_steps

    @property
    def edgemon_parking(self) -> ServedParking | None:
        """Parking (``EDGEMON_PARKING``: its `feed`, `parks`, `parked_steps`), or None."""
        return self._edgemon.parking

    @property
    def edgemon_deadlines(self) -> VllmDeadlines:
        """The deadline policy (its `mode`, and `policy`: the `Deadlines` object)."""
        return self._edgemon.deadlines

    def edgemon_end_waiting(self, request_ids: Iterable[str], reason: str = "queued") -> list[str]:
        """End these waiting requests now, as requests whose start deadline cannot be met
        (``finish_reason`` ``abort``, ``stop_reason`` ``edgemon:start_deadline``); the ids
        ended."""
        return self._edgemon.end_waiting(request_ids, reason)
