"""What edgemon's vLLM and vLLM-Omni schedulers report beyond vLLM: requests they ended
because their start deadline could no longer be met, and the capacity object.

- **Ending a waiting request.** `EngineReport.shed` finishes it through vLLM's own
  ``Scheduler.finish_requests(ids, RequestStatus.FINISHED_ABORTED)`` (what an abort from the
  API server does: it leaves the queue, its blocks are freed) and, because a request finished
  by the scheduler itself is not otherwise reported to the API server, adds one
  ``EngineCoreOutput`` per request to the step's outputs with ``finish_reason`` ``abort`` and
  ``stop_reason`` `SHED_STOP_REASON`. The API server then ends the request: a non-streaming
  response carries ``"finish_reason": "abort"`` and ``"stop_reason":
  "edgemon:start_deadline"`` with no text; a stream ends with ``data: [DONE]`` (vLLM's
  OpenAI server sends no chunk for a choice that produced nothing). docs/client.md says
  what a client sees.
- **The capacity object.** After every step the scheduler hands its figures to the
  `CapacityPublisher` (which publishes only on change, from its own thread).

Every call into vLLM here is guarded by the caller (`StepDriver`): on an exception the
step goes on as vLLM's own, counted and logged once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason
from vllm.v1.request import RequestStatus

if TYPE_CHECKING:
    from collections.abc import Iterable

    from edgemon.shedding.topic import CapacityPublisher

__all__ = ["SHED_REASONS", "SHED_STOP_REASON", "EngineReport"]

#: The ``stop_reason`` of a request edgemon ended before its first token.
SHED_STOP_REASON = "edgemon:start_deadline"
#: Why the scheduler ended a waiting request: at its arrival, or while it waited.
SHED_REASONS = ("arrival", "queued")


class EngineReport:
    """The requests a scheduler ended, and its capacity publisher (or none)."""

    __slots__ = ("_pending", "publisher", "shed_reasons")

    def __init__(self, publisher: CapacityPublisher | None) -> None:
        self.publisher = publisher
        #: Waiting requests this scheduler ended, by reason: ``arrival`` (refused as it
        #: arrived) and ``queued`` (its start became infeasible while it waited). The HTTP
        #: refusals are added by the publisher.
        self.shed_reasons = dict.fromkeys(SHED_REASONS, 0)
        self._pending: list[tuple[int, str]] = []

    @property
    def shed_total(self) -> int:
        """Waiting requests this scheduler ended."""
        return sum(self.shed_reasons.values())

    def shed(self, scheduler: Any, request_ids: Iterable[str], reason: str = "queued") -> list[str]:
        """End these waiting requests now (see the module doc); the ids actually ended."""
        ids = list(request_ids)
        if not ids:
            return []
        ended = scheduler.finish_requests(ids, RequestStatus.FINISHED_ABORTED)
        for request in ended:
            self._pending.append((request.client_index, request.request_id))
        self.shed_reasons[reason] = self.shed_reasons.get(reason, 0) + len(ended)
        return [request.request_id for request in ended]

    def add_outputs(self, outputs: dict[int, Any]) -> None:
        """Add the ended requests' final outputs to a step's ``update_from_output`` result."""
        pending, self._pending = self._pending, []
        for client_index, request_id in pending:
            eco = outputs.get(client_index)
            if eco is None:
                eco = outputs[client_index] = EngineCoreOutputs()
            eco.outputs.append(
                EngineCoreOutput(
                    request_id=request_id,
                    new_token_ids=[],
                    finish_reason=FinishReason.ABORT,
                    stop_reason=SHED_STOP_REASON,
                )
            )

    def publish(
        self,
        *,
        realtime_streams: int | None,
        running: int,
        waiting: int,
        start_wait_ms: float | None,
    ) -> None:
        """Hand the figures to the publisher (a no-op without one)."""
        if self.publisher is not None:
            self.publisher.update(
                realtime_streams=realtime_streams,
                running=running,
                waiting=waiting,
                start_wait_ms=start_wait_ms,
                shed=self.shed_reasons,
            )

    def close(self) -> None:
        """Close the publisher (empties the retained capacity objects)."""
        if self.publisher is not None:
            self.publisher.close()
