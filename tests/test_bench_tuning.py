"""The SLO-capacity bisection and the static tuning (`benchmarks/_tuning.py`), on a synthetic
goodput curve: the search's bookkeeping, not the simulator, is what is checked here."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from edgemon.simulate.profiles import JETSON
from edgemon.simulate.scenarios import STEADY

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from _points import Point
from _tuning import slo_capacities, static_grid, tune

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable


def base(policy: str, seed: int = 1) -> Point:
    """A point whose load the search sets."""
    return Point(JETSON, policy, STEADY, 1.0, seed, 60.0)


def falling(knee: dict[str, float]) -> tuple[list[Point], Callable[[Iterable[Point]], list[float]]]:
    """A measure whose goodput is 1 up to the policy's knee, then falls linearly."""
    seen: list[Point] = []

    def measure(points: Iterable[Point]) -> list[float]:
        batch = list(points)
        seen.extend(batch)
        return [max(0.0, 1.0 - max(0.0, p.load - knee[p.policy])) for p in batch]

    return seen, measure


def test_the_searches_run_side_by_side_and_find_each_capacity() -> None:
    """Goodput 1 − (load − knee) meets 0.95 up to knee + 0.05: found within the tolerance,
    from below, for two policies searched side by side; every run is recorded by the search
    it belongs to."""
    seen, measure = falling({"a": 0.5, "b": 0.9})
    found = slo_capacities(
        measure, [base("a"), base("b")], 0.95, low=0.05, high=1.5, tolerance=0.01
    )
    capacities = [s.capacity for s in found]
    assert capacities[0] == pytest.approx(0.55, abs=0.01)
    assert capacities[1] == pytest.approx(0.95, abs=0.01)
    assert all(
        c is not None and c <= knee + 0.05 + 1e-9
        for c, knee in zip(capacities, (0.5, 0.9), strict=True)
    )
    assert len(seen) == sum(len(s.tried) for s in found)
    assert {p.policy for p in seen} == {"a", "b"}


def test_a_target_missed_at_the_low_bound_or_met_at_the_high_one_says_so() -> None:
    """Below the low bound: no capacity; met at the high bound: the high bound."""
    _, measure = falling({"never": -1.0, "always": 5.0})
    low, high = slo_capacities(
        measure, [base("never"), base("always")], 0.95, low=0.05, high=1.5, tolerance=0.01
    )
    assert (low.capacity, low.failed) == (None, 0.05)
    assert high.capacity == 1.5


def test_tuning_ranks_by_mean_goodput_and_tries_chunked_prefill_on_the_best() -> None:
    """The best configuration by mean over its points comes first; chunked prefill is tried
    on the three best of the grid, and only on them; a tie within a tenth of a point goes to
    the configuration with fewer flags."""
    score = {"queued:12:12": 0.8, "queued:12:14": 0.7, "cap:12": 0.6}

    def measure(points: Iterable[Point]) -> list[float]:
        return [score.get(p.policy, 0.5 if "+" not in p.policy else 0.80001) for p in points]

    ranked = tune(measure, lambda label: [base(label, s) for s in (1, 2)], JETSON)
    assert ranked[0][1] == "queued:12:12"
    chunked = {label.split("+")[0] for _, label in ranked if "+" in label}
    assert chunked == {"queued:12:12", "queued:12:14", "cap:12"}
    assert {_batch(label) for _, label in ranked} == set(range(9, 14))


def test_the_grid_widens_while_the_best_is_on_its_edge() -> None:
    """When smaller batches keep winning, the grid grows below N*−3 until the best batch is
    inside it (here 5, so 4 is tried and 3 is not needed)."""

    def measure(points: Iterable[Point]) -> list[float]:
        return [1.0 - abs(_batch(p.policy) - 5) / 10 for p in points]

    ranked = tune(measure, lambda label: [base(label)], JETSON)
    assert _batch(ranked[0][1]) == 5
    assert min(_batch(label) for _, label in ranked) == 3
    assert max(_batch(label) for _, label in ranked) == 13


def _batch(label: str) -> int:
    return int(label.split("+", 1)[0].split(":", 2)[1])


def test_the_grid_spans_caps_queues_and_backlogs_around_n_star() -> None:
    """N from N*−3 to N*+1 (jetson: 9–13), each alone, with M − N in {0, 2, 4, 8, 16}, and
    with a backlog of 1, 2, 4 and 8 mean prompts."""
    grid = static_grid(JETSON)
    assert len(grid) == 5 * (1 + 5 + 4)
    assert {"cap:9", "cap:13", "queued:12:12", "queued:12:28"} <= set(grid)
    assert sum(label.startswith("tokens:11:") for label in grid) == 4
