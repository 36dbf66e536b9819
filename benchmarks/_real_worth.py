"""Is edgemon worth it on the real engine? (`closed_loop.py --real-report`, `make bench-real`)

From the rows of `make bench-real`: the static line tuned on the box's measured shape, the
real engine's SLO capacity searches and runs at load 1.0 (`real_engine.py`, seeds 1-3, the
policies' order rotated seed by seed), and the virtual loop's prediction of the same points on
the same shape (`closed_loop.py --steps`, seeds 1-10). Per scenario and policy (open, the
tuned line, edgemon): the real figure, median [least–most] over its seeds, beside the virtual
one of the same seeds and of all ten; `edgemon` against the tuned line seed by seed.
"""

from __future__ import annotations

from typing import Any

from _loop_report import median_range, spread
from _worth import SHIPPED_LABEL, Figures, Row

ROLES = ("open", "tuned", "edgemon")


def _labels(figures: Figures, profile: str) -> dict[str, str]:
    return {"open": "open", "tuned": figures.tuned.get(profile, ""), "edgemon": SHIPPED_LABEL}


def real_report(rows: list[Row]) -> list[str]:
    """The report's lines (empty without real rows)."""
    real, virtual = Figures(rows, mode="real"), Figures(rows, mode="virtual")
    if not real.capacity and not real.goodput:
        return []
    lines = [
        "## On the real engine",
        "",
        f"Tuned on the measured shape: {', '.join(f'`{t}`' for t in real.tuned.values())}.",
        "",
        "| scenario | point | policy | real | virtual, same seeds | virtual, every seed |",
        "|---|---|---|---|---|---|",
    ]
    for kind, real_table, virtual_table, fmt in (
        ("SLO capacity", real.capacity, virtual.capacity, "{:.2f}"),
        ("goodput", real.goodput, virtual.goodput, "{:.1%}"),
    ):
        for key, table in sorted(real_table.items()):
            profile, scenario, at = key
            point = f"{kind} at {at:g}"
            predicted = virtual_table.get(key, {})
            for role, label in _labels(real, profile).items():
                mine = table.get(label, {})
                guess = predicted.get(label, {})
                same = [guess[s] for s in mine if s in guess]
                lines.append(
                    f"| {scenario} | {point} | `{label}` ({role}) | "
                    f"{spread(list(mine.values()), fmt)} | {spread(same, fmt)} | "
                    f"{spread(list(guess.values()), fmt)} |"
                )
    return lines


def real_summary(rows: list[Row]) -> list[Row]:
    """The figures the documentation shows, one row each: per scenario, point, policy and
    mode (`real`, or `virtual` for the prediction of the same seeds)."""
    real, virtual = Figures(rows, mode="real"), Figures(rows, mode="virtual")
    out: list[Row] = []
    for kind, real_table, virtual_table in (
        ("slo_capacity", real.capacity, virtual.capacity),
        ("goodput", real.goodput, virtual.goodput),
    ):
        for key, table in sorted(real_table.items()):
            profile, scenario, at = key
            for role, label in _labels(real, profile).items():
                mine = table.get(label, {})
                guess = virtual_table.get(key, {}).get(label, {})
                for mode, values in (
                    ("real", list(mine.values())),
                    ("virtual", [guess[s] for s in mine if s in guess]),
                ):
                    if values:
                        out.append(_row(kind, scenario, at, role, label, mode, values))
    return out


def _row(
    kind: str, scenario: str, at: float, role: str, label: str, mode: str, values: list[float]
) -> dict[str, Any]:
    return {
        "kind": kind,
        "scenario": scenario,
        "target" if kind == "slo_capacity" else "load": at,
        "role": role,
        "policy": label,
        "mode": mode,
        **median_range(values),
        "values": [round(v, 4) for v in values],
    }
