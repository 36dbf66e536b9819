"""The capacity object (docs/protocol.md, "Capacity object"): one model, read one way by every
reader (the daemon, the engine's HTTP middleware).

`read_capacity` takes a payload to a `Capacity` or says why it is none (`Unreadable`): standard
JSON only (UTF-8, no `NaN` or infinities: `invalid_json`); an object whose fields are each a
number ≥ 0 up to 2^53, a whole one for the counts, or null or left out (`invalid_event`
otherwise, which makes the whole object unreadable); unknown fields ignored; `start_wait_ms`
read as at most `MAX_START_WAIT_MS`. Standard library only: the engine's process reads it
without the daemon's dependencies.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from edgemon.errors import EdgemonError
from edgemon.protocol import MAX_START_WAIT_MS, MAX_TIME_MS

__all__ = ["Capacity", "Unreadable", "read_capacity"]

#: The object's fields.
FIELDS = ("t_ms", "realtime_streams", "running", "waiting", "start_wait_ms", "shed_total")


@dataclass(frozen=True, slots=True)
class Capacity:
    """One capacity object as read; None where the engine left a field out."""

    t_ms: float | None = None
    realtime_streams: float | None = None
    running: int | None = None
    waiting: int | None = None
    start_wait_ms: float | None = None
    shed_total: int | None = None

    @property
    def spare_streams(self) -> float | None:
        """Real-time streams the engine has room for now (`realtime_streams − running`, at
        least 0); None unless both are known."""
        if self.realtime_streams is None or self.running is None:
            return None
        return max(0.0, self.realtime_streams - self.running)

    def as_dict(self) -> dict[str, Any]:
        """The object's fields as JSON values (None for those left out)."""
        return {name: getattr(self, name) for name in FIELDS}


@dataclass(frozen=True, slots=True)
class Unreadable:
    """Why a payload is no capacity object: the `result` edgemon counts it under
    (`invalid_json`, `invalid_event`) and a short detail."""

    reason: str
    detail: str


class _BadFieldError(EdgemonError, ValueError):
    """A field that is not a number ≥ 0 up to 2^53 (or not a whole one where a count is)."""


def read_capacity(payload: bytes) -> Capacity | Unreadable:
    """The capacity object in `payload`, or why it is unreadable (the module doc)."""
    try:
        data = json.loads(payload.decode(), parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        return Unreadable("invalid_json", _first_line(str(exc)) or type(exc).__name__)
    if not isinstance(data, dict):
        return Unreadable("invalid_event", f"expected an object, got {_kind(data)}")
    try:
        wait = _amount(data, "start_wait_ms")
        return Capacity(
            t_ms=_amount(data, "t_ms"),
            realtime_streams=_amount(data, "realtime_streams"),
            running=_count(data, "running"),
            waiting=_count(data, "waiting"),
            start_wait_ms=None if wait is None else min(wait, MAX_START_WAIT_MS),
            shed_total=_count(data, "shed_total"),
        )
    except _BadFieldError as exc:
        return Unreadable("invalid_event", str(exc))


def _amount(data: dict[str, Any], name: str) -> float | None:
    """Field `name` of `data` as a number ≥ 0 up to 2^53 (None when null or left out);
    _BadFieldError if it is not one."""
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _BadFieldError(f"{name}: expected a number ≥ 0, got {_kind(value)}")
    if not 0 <= value <= MAX_TIME_MS:  # NaN and infinities too; an int is never float()ed
        raise _BadFieldError(f"{name}: expected a number from 0 to 2^53, got {value!r:.24}")
    return float(value)


def _count(data: dict[str, Any], name: str) -> int | None:
    """Field `name` of `data` as a whole number ≥ 0 up to 2^53, however JSON wrote it (`3`,
    `3.0`); None when null or left out; _BadFieldError if it is not one."""
    amount = _amount(data, name)  # exact: a number up to 2^53
    if amount is None:
        return None
    if not amount.is_integer():
        raise _BadFieldError(f"{name}: expected a whole number, got {amount!r}")
    return int(amount)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not standard JSON")


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _first_line(text: str) -> str:
    return text.splitlines()[0][:200] if text else text
