"""Is edgemon worth it against what an operator would configure? (`closed_loop.py --report`)

From the rows of `closed_loop.py --tune-static` (the tuned static configuration, and the grid
it ranked), `--slo-capacity` and plain runs at fixed loads, on held-out seeds:

- **SLO capacity**: per profile and scenario, each policy's highest load at which the target
  share of requests is good, median [min–max] over the seeds; `edgemon` against the tuned
  static configuration (the ratio of the medians), and the ceiling of any static setting
  (the best grid point's median, chosen per scenario: no single configuration reaches it);
- **goodput at fixed loads**: `edgemon` minus the tuned static configuration, the ceiling
  (the best grid point per load) and the peers' `estimated-park` and `estimated-edf`, in
  points, median [min–max] of the per-seed differences (same seed, same requests);
- **what each part is worth** (`ABLATIONS`): the shipped policy without one part, its SLO
  capacity and goodput against `edgemon`'s;
- **the targets** of issue 37, each with its figure.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from _loop_report import median_range, spread

from edgemon.simulate.policies import EDGEMON, SHIPPED_GUARD_MS
from edgemon.simulate.profiles import PROFILES, Profile

Row = dict[str, Any]
SHIPPED_LABEL = "edgemon"
GUARD = f"{SHIPPED_GUARD_MS:g}"
ABLATIONS = {
    "real-time admission": f"deadline:fcfs:shed:{GUARD}+headroom",
    "deadlines (real-time admission alone)": "realtime",
    "shedding at arrival": f"realtime+deadline:fcfs:queued:{GUARD}+headroom",
    "shedding while queued": f"realtime+deadline:fcfs:arrival:{GUARD}+headroom",
    "the players' estimated headroom": f"realtime+deadline:fcfs:shed:{GUARD}",
}
"""The shipped policy (`EDGEMON`) without one part, by the part removed."""
THROTTLE = "edgemon+lasting:{margin}:1100"
"""The shipped policy with edgemon's throttle obeyed through the gate (as the served one
follows it), to see what the throttle adds."""
PEERS = ("estimated-park", "estimated-edf")
SLO_RATIO = {"slowdown": 1.25, "contention": 1.25, "burst": 1.1}
"""Target (b): `edgemon`'s SLO capacity over the tuned configuration's."""
OVERLOAD = (1.0, 1.2)
"""Target (c)'s loads: goodput ≥ tuned + 5 points, and ≥ the peers'."""
OVER_TUNED = 0.05

CEILING_GRID = 6
"""The best configurations of the tuning's ranking run on the held-out seeds (the ceiling of
any static setting is the best of them at each point)."""

__all__ = ["ABLATIONS", "EDGEMON", "THROTTLE", "comparison", "worth"]


def comparison(profile: Profile, ranking: list[str]) -> list[str]:
    """The policies the report compares on `profile`: open, the tuned configuration and the
    next best of the grid (`ranking`, best first), the peers, edgemon and its ablations."""
    margin = f"{profile.margin_ms:g}"
    return [
        "open",
        *ranking[:CEILING_GRID],
        *PEERS,
        SHIPPED_LABEL,
        *([with_prefill] if (with_prefill := prefill_flags(ranking[0])) else []),
        *ABLATIONS.values(),
        THROTTLE.format(margin=margin),
    ]


def prefill_flags(tuned: str) -> str | None:
    """edgemon with the tuned configuration's chunked-prefill flags, if it has any: the same
    vLLM flags under edgemon's scheduler (None: it has none)."""
    parts = [p for p in tuned.split("+") if p.startswith("chunked:")]
    return f"{SHIPPED_LABEL}+{parts[0]}" if parts else None


class Figures:
    """The rows, indexed: SLO capacities and goodputs per point, policy and seed."""

    def __init__(self, rows: list[Row], lengths: str = "eos", mode: str = "virtual") -> None:
        self.lengths = lengths
        self.tuned: dict[str, str] = {}
        self.grid: dict[str, list[str]] = {}
        self.capacity: dict[tuple[str, str, float], dict[str, dict[int, float]]] = defaultdict(
            lambda: defaultdict(dict)
        )
        self.goodput: dict[tuple[str, str, float], dict[str, dict[int, float]]] = defaultdict(
            lambda: defaultdict(dict)
        )
        for row in rows:
            kind = row.get("kind")
            if kind != "tuned" and (
                row.get("lengths", "eos") != lengths or row.get("mode", "virtual") != mode
            ):
                continue
            if kind == "tuned":
                self.tuned[row["profile"]] = row["policy"]
                self.grid[row["profile"]] = [label for label, _ in row["ranking"]]
            elif kind == "slo_capacity":
                key = (row["profile"], row["scenario"], float(row["slo_target"]))
                found = row["slo_capacity"]  # None: not even the low bound met it
                self.capacity[key][row["policy"]][int(row["seed"])] = (
                    0.0 if found is None else float(found)
                )
            elif "goodput" in row:
                key = (row["profile"], row["scenario"], float(row["load"]))
                self.goodput[key][row["policy"]][int(row["seed"])] = float(row["goodput"])

    def median(self, table: dict[str, dict[int, float]], label: str) -> float | None:
        """The median over seeds of `label`'s figure (None: not run)."""
        values = list(table.get(label, {}).values())
        return statistics.median(values) if values else None

    def ceiling(self, profile: str, table: dict[str, dict[int, float]]) -> tuple[str, float]:
        """The grid point with the best median figure in `table`, and that figure."""
        best = ("–", float("nan"))
        for label in self.grid.get(profile, []):
            value = self.median(table, label)
            if value is not None and (best[0] == "–" or value > best[1]):
                best = (label, value)
        return best


def _differences(table: dict[str, dict[int, float]], mine: str, other: str) -> list[float]:
    """Per seed, `mine` − `other` (seeds both ran)."""
    a, b = table.get(mine, {}), table.get(other, {})
    return [a[s] - b[s] for s in sorted(a) if s in b]


def capacity_lines(figures: Figures) -> list[str]:
    """SLO capacity per profile, scenario and target."""
    lines = [
        (
            "| profile | scenario | target | edgemon | tuned static | edgemon / tuned | "
            "ceiling of any static setting | open | estimated-park | estimated-edf |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key in sorted(figures.capacity):
        profile, scenario, target = key
        table = figures.capacity[key]
        tuned = figures.tuned.get(profile, "")
        mine, theirs = figures.median(table, SHIPPED_LABEL), figures.median(table, tuned)
        ratio = "–" if not mine or not theirs else f"{mine / theirs:.2f}"
        best, value = figures.ceiling(profile, table)
        cells = [
            spread(list(table.get(label, {}).values()), "{:.2f}")
            for label in (SHIPPED_LABEL, tuned)
        ]
        others = [
            spread(list(table.get(label, {}).values()), "{:.2f}") for label in ("open", *PEERS)
        ]
        lines.append(
            f"| {profile} | {scenario} | {target:.0%} | {cells[0]} | {cells[1]} (`{tuned}`) | "
            f"{ratio} | {value:.2f} (`{best}`) | " + " | ".join(others) + " |"
        )
    return lines


def goodput_lines(figures: Figures) -> list[str]:
    """`edgemon`'s goodput against the others, per profile, scenario and load, in points."""
    lines = [
        (
            "| profile | scenario | load | edgemon goodput | − tuned static | − ceiling (grid "
            "point) | − estimated-park | − estimated-edf | − open |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key in sorted(figures.goodput):
        profile, scenario, load = key
        table = figures.goodput[key]
        if SHIPPED_LABEL not in table:
            continue
        best, value = figures.ceiling(profile, table)
        mine = figures.median(table, SHIPPED_LABEL)
        ceiling = "–" if mine is None or best == "–" else f"{100 * (mine - value):+.1f} (`{best}`)"
        versus = [
            spread([100 * d for d in _differences(table, SHIPPED_LABEL, other)], "{:+.1f}")
            for other in (figures.tuned.get(profile, ""), *PEERS, "open")
        ]
        lines.append(
            f"| {profile} | {scenario} | {load:g} | "
            f"{spread([100 * v for v in table[SHIPPED_LABEL].values()], '{:.1f} %')} | "
            f"{versus[0]} | {ceiling} | {versus[1]} | {versus[2]} | {versus[3]} |"
        )
    return lines


def ablation_lines(figures: Figures) -> list[str]:
    """The shipped policy without each part: the change in SLO capacity and goodput."""
    lines = [
        (
            "| profile | scenario | part | SLO capacity, without − with | goodput points at "
            "1.0, without − with | at 1.2 |"
        ),
        "|---|---|---|---|---|---|",
    ]
    lowest = min((t for (_, _, t) in figures.capacity), default=0.0)
    for (profile, scenario, target), table in sorted(figures.capacity.items()):
        if target != lowest:
            continue
        margin = f"{PROFILES[profile].margin_ms:g}" if profile in PROFILES else ""
        parts = [*ABLATIONS.items(), ("(added) edgemon's throttle", THROTTLE.format(margin=margin))]
        for part, label in parts:
            if label not in table:
                continue
            capacity = spread(_differences(table, label, SHIPPED_LABEL), "{:+.2f}")
            at_loads = [
                spread(
                    [
                        100 * d
                        for d in _differences(
                            figures.goodput.get((profile, scenario, load), {}), label, SHIPPED_LABEL
                        )
                    ],
                    "{:+.1f}",
                )
                for load in OVERLOAD
            ]
            lines.append(
                f"| {profile} | {scenario} | {part} (`{label}`) | {capacity} | {at_loads[0]} | "
                f"{at_loads[1]} |"
            )
    return lines


def target_lines(figures: Figures) -> list[str]:
    """Targets (a)–(c) of issue 37, each with its figure per profile and scenario."""
    lines: list[str] = []
    for (profile, scenario, target), table in sorted(figures.capacity.items()):
        tuned = figures.tuned.get(profile, "")
        mine, theirs = figures.median(table, SHIPPED_LABEL), figures.median(table, tuned)
        if mine is None or theirs is None:
            continue
        need = SLO_RATIO.get(scenario, 1.0)
        verdict = "met" if mine >= need * theirs - 1e-9 else "**missed**"
        ratio = f"{mine / theirs:.2f}×" if theirs > 0 else "–"
        lines.append(
            f"- {profile}, {scenario}, SLO capacity at {target:.0%}: edgemon {mine:.2f}, tuned "
            f"{theirs:.2f} ({ratio}), needs ≥ {need:g}×: {verdict}"
        )
    for (profile, scenario, load), table in sorted(figures.goodput.items()):
        tuned = figures.tuned.get(profile, "")
        below = _differences(table, SHIPPED_LABEL, tuned)
        if not below:
            continue
        worst = statistics.median(below)
        if load in OVERLOAD:
            peers = [
                statistics.median(d) for p in PEERS if (d := _differences(table, SHIPPED_LABEL, p))
            ]
            ok = worst >= OVER_TUNED and all(d >= 0 for d in peers)
            lines.append(
                f"- {profile}, {scenario}, load {load:g}: edgemon − tuned {100 * worst:+.1f} "
                f"points (needs ≥ +5), − the peers {', '.join(f'{100 * d:+.1f}' for d in peers)} "
                f"(needs ≥ 0): {'met' if ok else '**missed**'}"
            )
        elif worst < -0.01:
            lines.append(
                f"- {profile}, {scenario}, load {load:g}: edgemon − tuned {100 * worst:+.1f} "
                "points (needs ≥ −1): **missed**"
            )
    return lines


def known_lines(rows: list[Row]) -> list[str]:
    """What knowing every request's length is worth: edgemon's and the tuned configuration's
    figures with lengths predicted (`eos`) and known, medians over the seeds."""
    eos, known = Figures(rows, "eos"), Figures(rows, "known")
    lines = [
        "| profile | scenario | point | policy | lengths predicted | lengths known |",
        "|---|---|---|---|---|---|",
    ]
    for kind, table_of in (("SLO capacity", "capacity"), ("goodput", "goodput")):
        for key, table in sorted(getattr(known, table_of).items()):
            profile, scenario, at = key
            other = getattr(eos, table_of).get(key, {})
            for label in (SHIPPED_LABEL, known.tuned.get(profile, "")):
                mine, theirs = known.median(table, label), eos.median(other, label)
                if mine is None or theirs is None:
                    continue
                point = f"{kind} at {at:.0%}" if kind == "SLO capacity" else f"goodput at {at:g}"
                lines.append(
                    f"| {profile} | {scenario} | {point} | `{label}` | {theirs:.3f} | {mine:.3f} |"
                )
    return lines if len(lines) > 2 else []


def worth(rows: list[Row]) -> list[str]:
    """The report's lines (empty when `rows` hold no tuned configuration)."""
    figures = Figures(rows)
    if not figures.tuned:
        return []
    known = known_lines(rows)
    tuned = ", ".join(f"{p}: `{label}`" for p, label in sorted(figures.tuned.items()))
    return [
        "## Against the tuned static configuration",
        "",
        f"Tuned on training seeds: {tuned}.",
        "",
        "### SLO capacity (share of the profile's estimated capacity)",
        "",
        *capacity_lines(figures),
        "",
        "### Goodput, edgemon minus each, points (per seed, median [min–max])",
        "",
        *goodput_lines(figures),
        "",
        "### What each part is worth",
        "",
        *ablation_lines(figures),
        "",
        "### Targets",
        "",
        *target_lines(figures),
        *(["", "### What knowing lengths is worth", "", *known] if known else []),
    ]


def summary(rows: list[Row], lengths: str = "eos") -> list[Row]:
    """The figures the documentation shows (docs_hooks.py renders them), one row each: per
    profile, scenario and SLO target or load, each role's median, least and most over the
    seeds (`edgemon`, `tuned`, `ceiling`, `open`, the peers, and the shipped policy without
    each part), with the policy it stands for."""
    figures = Figures(rows, lengths)
    out: list[Row] = []
    for kind, tables, point in (
        ("slo_capacity", figures.capacity, "target"),
        ("goodput", figures.goodput, "load"),
    ):
        for (profile, scenario, at), table in sorted(tables.items()):
            margin = f"{PROFILES[profile].margin_ms:g}" if profile in PROFILES else ""
            best, _ = figures.ceiling(profile, table)
            with_prefill = prefill_flags(figures.tuned.get(profile, ""))
            roles = {
                "edgemon": SHIPPED_LABEL,
                **({"edgemon, tuned prefill": with_prefill} if with_prefill else {}),
                "tuned": figures.tuned.get(profile, ""),
                "ceiling": best,
                "open": "open",
                **{peer: peer for peer in PEERS},
                **{f"without {part}": label for part, label in ABLATIONS.items()},
                "with edgemon's throttle": THROTTLE.format(margin=margin),
            }
            for role, label in roles.items():
                values = list(table.get(label, {}).values())
                if not values:
                    continue
                out.append(
                    {
                        "kind": kind,
                        "profile": profile,
                        "scenario": scenario,
                        point: at,
                        "lengths": lengths,
                        "role": role,
                        "policy": label,
                        **median_range(values),
                        "seeds": len(values),
                    }
                )
    return out
