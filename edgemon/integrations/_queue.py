"""What edgemon reads and writes of a vLLM scheduler: the one swap around its waiting queue,
and what a step's output admitted and batched.

vLLM's scheduler admits from ``scheduler.waiting``. To decide a step's admissions, edgemon
shows vLLM's own step a waiting queue of only the requests it admits (`showing`): none for
a step the gate holds, the first few in vLLM's order for one real-time admission limits, the
plan's for one the deadline policy plans. Afterwards everything goes back: in front of the
requests kept out, whatever the step left in the queue it was shown (requests it did not
admit, requests it preempted), in vLLM's order. Running work and ``kv_holding_waiting``
(vLLM ≥ 0.32: requests that already own KV blocks) are untouched: they are continuations of
admitted work, not new prefills.

Free of vLLM: the scheduler hands in its queue factory (vLLM's ``create_request_queue``).
A queue edgemon cannot build leaves the step vLLM's own, with every request where vLLM
expects it (counted, logged once: `AdmissionControl.failed`).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence

    from edgemon.integrations._admission import AdmissionControl

__all__ = [
    "HELD",
    "LIMITED",
    "PLANNED",
    "Queues",
    "Shown",
    "admitted_any",
    "admitted_ids",
    "composition",
    "put_back",
    "showing",
]


class Queues(Protocol):
    """The parts of a vLLM scheduler edgemon reads and writes."""

    waiting: Any  # vLLM's RequestQueue
    running: list[Any]
    policy: Any  # vLLM's SchedulingPolicy
    requests: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Shown:
    """Why a step is shown part of the queue, as its errors are counted: building the queue
    shown (`taking`), and putting back what the step left (`putting_back`)."""

    taking: str
    putting_back: str


HELD = Shown("holding the waiting queue", "re-queueing the requests a held step preempted")
LIMITED = Shown("real-time admission", "re-queueing what a limited step left")
PLANNED = Shown("choosing the planned requests", "re-queueing what a planned step left")


@contextmanager
def showing(
    queues: Queues,
    new_queue: Callable[[Any], Any],
    pick: Callable[[Any], Sequence[Any]],
    why: Shown,
    control: AdmissionControl,
) -> Iterator[bool]:
    """Within: a waiting queue of only the requests `pick` chooses from it, in its order
    (True); afterwards the rest, and what the step left or preempted in front of them, in
    vLLM's order. If that queue cannot be built, the queue as it was (False: the step is
    vLLM's own); counted and logged once."""
    rest = queues.waiting
    shown: Sequence[Any] = ()
    try:
        shown = pick(rest)
        front = new_queue(queues.policy)
        for request in shown:
            front.add_request(request)
        if shown:
            rest.remove_requests(shown)
    except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM
        queues.waiting = rest
        control.failed(why.taking)
        # A queue that failed halfway through the removal: the removed ones go back.
        put_back(rest, [r for r in shown if r not in rest], control, "restoring the waiting queue")
        yield False
        return
    queues.waiting = front
    try:
        yield True
    finally:
        # The kept requests are back first: whatever happens next, none is lost.
        left, queues.waiting = queues.waiting, rest
        put_back(rest, left, control, why.putting_back)


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


def admitted_ids(output: Any) -> set[str]:
    """The request ids a vLLM ``SchedulerOutput`` admitted from the waiting queue: new
    requests and requests resumed after a preemption."""
    ids = {new.req_id for new in output.scheduled_new_reqs}
    ids.update(output.scheduled_cached_reqs.resumed_req_ids)
    return ids


def admitted_any(output: Any) -> bool:
    """Whether a vLLM ``SchedulerOutput`` admitted anything from the waiting queue."""
    return bool(output.scheduled_new_reqs or output.scheduled_cached_reqs.resumed_req_ids)


def composition(output: Any) -> tuple[int, int] | None:
    """What a vLLM ``SchedulerOutput`` batched: (requests, prompt tokens beyond one per
    request, plus one per new request), or None for a step that scheduled nothing."""
    requests = len(output.num_scheduled_tokens)
    if requests == 0:
        return None
    return requests, output.total_num_scheduled_tokens - requests + len(output.scheduled_new_reqs)
