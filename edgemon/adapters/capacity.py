"""What the engines' capacity objects tell a router: `/api/v1/capacity` and the agent check.

Both read each device's last capacity object (`edgemon.engine.capacity`). A device's spare
real-time streams are `realtime_streams − running`, at least 0, unknown (null) unless the
engine gave both.

HAProxy's agent check (docs/fleet.md) asks for one line; `agent_reply` writes it from the
spare streams' share of the engine's real-time streams, as a weight in percent of the weight
the server has in HAProxy's configuration:

- `up 100%` when nothing is known (no capacity object, or one without `realtime_streams` and
  `running`): fail open, the server keeps its configured weight; HAProxy's own health check
  and `retry-on 503` stay in charge;
- `up 0%` when there is no spare stream: HAProxy sends the box no new request (a zero weight
  is what HAProxy's stats call DRAIN) until a later answer gives it room again;
- else `up N%` with N = spare ÷ real-time streams, rounded, at least 1.

edgemon never answers `drain`, `maint` or `down`: those are administrative states an
operator sets, and only the agent that set one could lift it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from edgemon.engine.views import device_view, device_views

if TYPE_CHECKING:
    from collections.abc import Iterable

    from edgemon.engine.capacity import CapacityRecord
    from edgemon.engine.engine import Engine
    from edgemon.engine.views import DeviceView

__all__ = ["agent_answer", "agent_reply", "capacity_entry", "spare_share"]


def capacity_entry(view: DeviceView, wall_ms: float) -> dict[str, Any]:
    """One device's `/api/v1/capacity` entry at edgemon's wall time `wall_ms`."""
    record = view.capacity
    if record is None:
        return {
            "device": view.id,
            "capacity": None,
            "received_wall_ms": None,
            "age_ms": None,
            "spare_streams": None,
            "shed": None,
        }
    return {
        "device": view.id,
        "capacity": record.last.as_dict(),
        "received_wall_ms": record.received_wall_ms,
        "age_ms": max(0.0, wall_ms - record.received_wall_ms),
        "spare_streams": record.last.spare_streams,
        "shed": record.shed,
    }


def spare_share(records: Iterable[CapacityRecord | None]) -> float | None:
    """The spare real-time streams of these devices over their real-time streams (0 to 1),
    over the devices where both are known; None when none is."""
    spare = capacity = 0.0
    known = False
    for record in records:
        if record is None:
            continue
        last = record.last
        free = last.spare_streams
        if free is None or last.realtime_streams is None:
            continue
        known = True
        spare += free
        capacity += last.realtime_streams
    if not known:
        return None
    return spare / capacity if capacity > 0 else 0.0


def agent_reply(share: float | None) -> str:
    """The agent check's answer line for a spare share (`spare_share`), as the module doc says."""
    if share is None:
        return "up 100%\n"
    if share <= 0:
        return "up 0%\n"
    return f"up {max(1, min(100, math.floor(share * 100 + 0.5)))}%\n"


def agent_answer(engine: Engine, device: str | None) -> str:
    """The agent check's answer now: for `device` alone (unknown to the engine: nothing known),
    or for every device the engine tracks, summed."""
    if device is None:
        views = device_views(engine)
    else:
        view = device_view(engine, device)
        views = [] if view is None else [view]
    return agent_reply(spare_share(view.capacity for view in views))
