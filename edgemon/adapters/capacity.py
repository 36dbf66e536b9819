"""What the engines' capacity objects tell a router: `/api/v1/capacity` and the agent check.

Both read each device's last capacity object (`edgemon.engine.capacity`). A device's spare
real-time streams are `realtime_streams − running`, at least 0, unknown (null) unless the
engine gave both.

HAProxy's agent check (docs/fleet.md) asks for one line; `agent_reply` writes it from the
spare streams' share of the engine's real-time streams, as a weight in percent of the weight
the server has in HAProxy's configuration:

- `up 100%` when nothing is known (no fresh capacity object, or one without
  `realtime_streams` and `running`): fail open, the server keeps its configured weight;
  HAProxy's own health check and `retry-on 503` stay in charge;
- `up 0%` when there is no spare stream: HAProxy sends the box no new request (a zero weight
  is what HAProxy's stats call DRAIN) until a later answer gives it room again;
- else `up N%` with N = the share, rounded, at least 1.

The share is taken per device and the devices' shares averaged (`spare_share`), never their
absolute figures summed: one device's object moves the box's answer by its own share at most.
Each figure is capped by what the device's engine can hold (its engine object's
`max_num_seqs`, else `DEFAULT_MAX_SEQS`), and an object older than `CAPACITY_MAX_AGE_MS`
counts as unknown, so a forged or forgotten object weighs little and not for long.

edgemon never answers `drain`, `maint` or `down`: those are administrative states an
operator sets, and only the agent that set one could lift it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from edgemon.engine.views import device_view, device_views
from edgemon.protocol import DEFAULT_MAX_SEQS

if TYPE_CHECKING:
    from collections.abc import Iterable

    from edgemon.capacity_object import Capacity
    from edgemon.engine.engine import Engine
    from edgemon.engine.views import DeviceView

__all__ = ["agent_answer", "agent_reply", "capacity_entry", "device_share", "spare_share"]


def capacity_entry(view: DeviceView, wall_ms: float) -> dict[str, Any]:
    """One device's `/api/v1/capacity` entry at edgemon's wall time `wall_ms`: the last
    object (null when none, or voided), its age and whether it is `stale` (ignored by the
    agent check), spare streams, the refusals counted and those claimed beyond plausible
    steps (not counted)."""
    record = view.capacity
    if record is None:
        return {
            "device": view.id,
            "capacity": None,
            "received_wall_ms": None,
            "age_ms": None,
            "stale": None,
            "spare_streams": None,
            "shed": None,
            "shed_cut": None,
        }
    last = record.last
    return {
        "device": view.id,
        "capacity": None if last is None else last.as_dict(),
        "received_wall_ms": record.received_wall_ms,
        "age_ms": record.age_ms(wall_ms),
        "stale": None if last is None else record.fresh(wall_ms) is None,
        "spare_streams": None if last is None else last.spare_streams,
        "shed": record.shed,
        "shed_cut": record.shed_cut,
    }


def device_share(capacity: Capacity | None, max_seqs: int | None) -> float | None:
    """One device's spare share (0 to 1): spare over real-time streams, each figure capped by
    `max_seqs` (`DEFAULT_MAX_SEQS` when None); None when not known."""
    if capacity is None or capacity.realtime_streams is None or capacity.running is None:
        return None
    cap = float(max_seqs or DEFAULT_MAX_SEQS)
    realtime = min(capacity.realtime_streams, cap)
    running = min(float(capacity.running), cap)
    if realtime <= 0:
        return 0.0
    return max(0.0, realtime - running) / realtime


def spare_share(shares: Iterable[float | None]) -> float | None:
    """The devices' shares averaged, over those known; None when none is."""
    known = [share for share in shares if share is not None]
    return sum(known) / len(known) if known else None


def agent_reply(share: float | None) -> str:
    """The agent check's answer line for a spare share (`spare_share`), as the module doc says."""
    if share is None:
        return "up 100%\n"
    if share <= 0:
        return "up 0%\n"
    return f"up {max(1, min(100, math.floor(share * 100 + 0.5)))}%\n"


def _share(view: DeviceView, wall_ms: float) -> float | None:
    record = view.capacity
    if record is None:
        return None
    kv = view.kv
    return device_share(record.fresh(wall_ms), None if kv is None else kv.max_num_seqs)


def agent_answer(engine: Engine, device: str | None, wall_ms: float) -> str:
    """The agent check's answer at edgemon's wall time `wall_ms`: for `device` alone (unknown
    to the engine: nothing known), or for every device the engine tracks, averaged."""
    if device is None:
        views = list(device_views(engine))
    else:
        view = device_view(engine, device)
        views = [] if view is None else [view]
    return agent_reply(spare_share(_share(view, wall_ms) for view in views))
