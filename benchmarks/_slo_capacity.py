"""SLO capacity: the highest load at which a box keeps its SLO attainment target, by bisection.

Operators size a box for the load at which nearly every listener is served (DistServe's
goodput: the highest request rate at which the SLO attainment target holds). `Bisection`
finds it for one policy, scenario and seed: the highest load (a share of the box's capacity)
at which goodput (good / offered) is at least `target`, between `low` and `high`, to within
`tolerance`. Goodput is assumed to fall as load rises; each run is one noisy sample, so the
answer is coarse by design (real runs are expensive).

It tries the middle of what is still open (between the highest load that passed and the
lowest that failed, the bounds while none has), and stops once that interval is at most
`tolerance` wide; a bound is tried only when the search ran into it, so that the answer is
never a bound nobody tried: below `low` (`capacity` None, `low` failed) or at least `high`
(`high` passed). With the default bounds 0.2:1.2 and tolerance 0.05 that is 5 runs, or 6
when the capacity lies within a tolerance of a bound.

Pure: the caller runs each load `next_load` asks for and `record`s its goodput.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

DEFAULT_BOUNDS = (0.2, 1.2)
DEFAULT_TOLERANCE = 0.05


@dataclass(frozen=True, slots=True)
class Tried:
    """One run of the search: its load, goodput and the run's figures to report."""

    load: float
    goodput: float
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Bisection:
    """The search for one policy, scenario and seed (see the module doc)."""

    target: float
    low: float = DEFAULT_BOUNDS[0]
    high: float = DEFAULT_BOUNDS[1]
    tolerance: float = DEFAULT_TOLERANCE
    tried: list[Tried] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.target) and 0 < self.target <= 1):
            raise ValueError(f"the SLO attainment target must be in (0, 1], not {self.target:g}")
        low, high = self.low, self.high
        if not (math.isfinite(low) and math.isfinite(high) and 0 < low < high):
            raise ValueError(f"the bounds must be loads 0 < LO < HI, not {low:g}:{high:g}")
        if not (math.isfinite(self.tolerance) and self.tolerance > 0):
            raise ValueError(f"the tolerance must be a load > 0, not {self.tolerance:g}")

    @property
    def passed(self) -> float | None:
        """The highest load tried that met the target (None: none did)."""
        return max((t.load for t in self.tried if t.goodput >= self.target), default=None)

    @property
    def failed(self) -> float | None:
        """The lowest load tried that missed the target (None: none did)."""
        return min((t.load for t in self.tried if t.goodput < self.target), default=None)

    def next_load(self) -> float | None:
        """The load to run next, or None: the search is over."""
        passed, failed = self.passed, self.failed
        lo = self.low if passed is None else passed
        hi = self.high if failed is None else failed
        if hi - lo > self.tolerance:
            return round((lo + hi) / 2, 4)
        loads = {t.load for t in self.tried}
        if passed is None and self.low not in loads:
            return self.low
        if failed is None and self.high not in loads:
            return self.high
        return None

    def record(self, load: float, goodput: float, figures: dict[str, Any] | None = None) -> None:
        """The run at `load` had `goodput`."""
        self.tried.append(Tried(load, goodput, figures or {}))

    @property
    def capacity(self) -> float | None:
        """The SLO capacity: the highest load that met the target (None: below `low`)."""
        return self.passed

    def fields(self) -> dict[str, Any]:
        """The search as a row's fields: the target, bounds and tolerance, the capacity (and
        the lowest load that missed: the capacity lies between them), and every load tried
        in order with its goodput and figures."""
        return {
            "slo_target": self.target,
            "slo_bounds": [self.low, self.high],
            "slo_tolerance": self.tolerance,
            "slo_capacity": self.capacity,
            "slo_missed_at": self.failed,
            "below_bounds": self.capacity is None,
            "at_upper_bound": self.capacity == self.high,
            "tried": [{"load": t.load, "goodput": t.goodput, **t.figures} for t in self.tried],
        }


def parse_bounds(text: str) -> tuple[float, float]:
    """`LO:HI`, loads 0 < LO < HI; ValueError naming the flag otherwise."""
    low, colon, high = text.partition(":")
    try:
        bounds = (float(low), float(high)) if colon else None
    except ValueError:
        bounds = None
    if bounds is None or not all(math.isfinite(b) for b in bounds) or not 0 < bounds[0] < bounds[1]:
        raise ValueError(f"--slo-bounds takes LO:HI, loads 0 < LO < HI, not {text!r}")
    return bounds
