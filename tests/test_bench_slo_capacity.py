"""The SLO capacity search (`benchmarks/_slo_capacity.py`): bisection over load, on goodput
curves given here instead of runs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _slo_capacity import Bisection, parse_bounds  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Callable


def search(
    goodput: Callable[[float], float],
    *,
    low: float = 0.2,
    high: float = 1.2,
    tolerance: float = 0.05,
) -> Bisection:
    """A search at target 0.95 run to its end, each load's goodput from `goodput`."""
    found = Bisection(0.95, low, high, tolerance)
    while (load := found.next_load()) is not None:
        assert len(found.tried) < 50, "the search does not end"
        found.record(load, goodput(load), {"offered": 100})
    return found


def knee(at: float) -> Callable[[float], float]:
    """Goodput 1 up to load `at`, then under 95 % and falling."""
    return lambda load: 1.0 if load <= at else max(0.0, 0.9 - (load - at))


@pytest.mark.parametrize("at", [0.27, 0.5, 0.63, 0.91, 1.14])
def test_the_capacity_is_found_to_within_the_tolerance_in_five_runs(at: float) -> None:
    """A knee anywhere between the bounds (0.2:1.2) at least a tolerance from them: the
    highest load that met 95 % is below the knee and within 0.05 of it, the lowest that
    missed above it, after 5 runs, none of them a bound."""
    found = search(knee(at))
    assert found.capacity is not None
    assert found.capacity <= at < found.capacity + 0.05
    assert found.failed is not None
    assert found.capacity < found.failed
    assert found.failed - found.capacity <= 0.05
    assert len(found.tried) == 5
    assert {0.2, 1.2}.isdisjoint(t.load for t in found.tried)


def test_a_box_that_misses_at_the_low_bound_is_below_the_bounds() -> None:
    """Goodput under 95 % everywhere: the search runs into the low bound, tries it, and
    reports no capacity (below the bounds)."""
    found = search(lambda _load: 0.5)
    assert found.capacity is None
    assert found.tried[-1].load == 0.2
    fields = found.fields()
    assert (fields["slo_capacity"], fields["below_bounds"], fields["slo_missed_at"]) == (
        None,
        True,
        0.2,
    )


def test_a_box_that_meets_it_at_the_high_bound_is_at_the_bound() -> None:
    """Goodput 1 everywhere: the search tries the high bound last and reports it."""
    found = search(lambda _load: 1.0, low=0.3, high=0.9, tolerance=0.1)
    assert found.capacity == 0.9
    assert found.tried[-1].load == 0.9
    assert found.fields()["at_upper_bound"] is True


def test_the_row_gives_every_load_tried_in_order_with_its_figures() -> None:
    """The row's fields: the target, the bounds and tolerance, the capacity, and each load
    tried in the order it ran, with its goodput and the run's figures."""
    found = search(knee(0.5))
    fields = found.fields()
    assert (fields["slo_target"], fields["slo_bounds"], fields["slo_tolerance"]) == (
        0.95,
        [0.2, 1.2],
        0.05,
    )
    assert [t["load"] for t in fields["tried"]] == [0.7, 0.45, 0.575, 0.5125, 0.4812]
    assert fields["tried"][0] == {"load": 0.7, "goodput": pytest.approx(0.7), "offered": 100}
    assert (fields["slo_capacity"], fields["slo_missed_at"]) == (0.4812, 0.5125)


def test_bad_settings_are_refused() -> None:
    """A target outside (0, 1], bounds not 0 < LO < HI, a tolerance ≤ 0, and `LO:HI` text
    that is not two such loads are refused, naming what is wrong."""
    with pytest.raises(ValueError, match="target"):
        Bisection(0.0)
    with pytest.raises(ValueError, match="bounds"):
        Bisection(0.95, low=0.8, high=0.8)
    with pytest.raises(ValueError, match="tolerance"):
        Bisection(0.95, tolerance=0.0)
    assert parse_bounds("0.3:1") == (0.3, 1.0)
    for text in ("0.3", "a:1", "0:1", "1:0.5", "0.2:inf"):
        with pytest.raises(ValueError, match="--slo-bounds"):
            parse_bounds(text)
