"""Does what the players measured beat what the server estimates? The report of
`make bench-feed` (`closed_loop.py --feed-report`), and the figures the documentation shows.

The rows are virtual runs of `edgemon` fed the players' measured state (`edgemon+feed:measured`),
the server's estimate (`…:estimated`) or neither (`…:none`), and the peers' own rules
(`estimated-park`, `estimated-edf`), per profile, scenario, load or SLO target and seed. Each
figure is a median over the seeds with the least and the most; a difference between two
feeds is taken seed by seed (the same requests and listeners), then summarized the same way.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from _loop_report import median_range

from edgemon.simulate.parked import FEEDS

Row = dict[str, Any]

PEERS = ("estimated-park", "estimated-edf")
ROLES = (*FEEDS, *PEERS)
SCENARIOS = ("steady", "slowdown", "burst", "pause", "wifi", "device", "prebuffer")
DIFFERENCES = (("measured", "estimated"), ("measured", "none"), ("oracle", "estimated"))


def role(policy: str) -> str | None:
    """`measured`, `estimated`, `none`, a peer's name, or None for another policy."""
    if policy.startswith("edgemon+feed:"):
        return policy.removeprefix("edgemon+feed:")
    return policy if policy in PEERS else None


def late_admitted(row: Row) -> float:
    """The share of the requests the box admitted (not refused) that missed the start SLO."""
    admitted = row["offered"] - row["shed"]
    return row["late"] / admitted if admitted else 0.0


class Figures:
    """Every run's figure by (kind, profile, scenario, point) → role → seed."""

    def __init__(self, rows: list[Row]) -> None:
        self.by: dict[tuple[str, str, str, float], dict[str, dict[int, float]]] = defaultdict(
            lambda: defaultdict(dict)
        )
        for row in rows:
            who = role(str(row.get("policy", "")))
            if who is None or row.get("lengths", "eos") != "eos":
                continue
            profile, scenario, seed = row["profile"], row["scenario"], row["seed"]
            if row.get("kind") == "slo_capacity":
                key = ("slo_capacity", profile, scenario, float(row["slo_target"]))
                found = row["slo_capacity"]  # None: not even the low bound met it
                self.by[key][who][seed] = 0.0 if found is None else float(found)
            elif row.get("kind") is None:
                load = float(row["load"])
                self.by[("goodput", profile, scenario, load)][who][seed] = row["goodput"]
                self.by[("late_admitted", profile, scenario, load)][who][seed] = late_admitted(row)

    def keys(self, kind: str) -> list[tuple[str, str, str, float]]:
        """The points of `kind`, profiles as they came, scenarios in a fixed order."""
        keys = [key for key in self.by if key[0] == kind]
        profiles = list(dict.fromkeys(key[1] for key in keys))
        order = {name: i for i, name in enumerate(SCENARIOS)}
        return sorted(keys, key=lambda k: (profiles.index(k[1]), order.get(k[2], 99), k[3]))

    def difference(self, key: tuple[str, str, str, float], a: str, b: str) -> list[float]:
        """`a` minus `b`, seed by seed, over the seeds both ran."""
        runs = self.by[key]
        seeds = sorted(set(runs.get(a, {})) & set(runs.get(b, {})))
        return [runs[a][seed] - runs[b][seed] for seed in seeds]


def summary(rows: list[Row]) -> list[Row]:
    """The documentation's figures (docs_hooks.py renders them): per kind, profile, scenario
    and point, each role's median, least and most over the seeds, and the differences."""
    figures = Figures(rows)
    out: list[Row] = []
    for kind in ("slo_capacity", "goodput", "late_admitted"):
        for key in figures.keys(kind):
            _, profile, scenario, at = key
            point = {"kind": kind, "profile": profile, "scenario": scenario, "at": at}
            for who in ROLES:
                values = list(figures.by[key].get(who, {}).values())
                if values:
                    out.append({**point, "role": who, **median_range(values), "seeds": len(values)})
            for a, b in DIFFERENCES:
                diff = figures.difference(key, a, b)
                if diff:
                    ahead = sum(d > 0 for d in diff)
                    behind = sum(d < 0 for d in diff)
                    out.append(
                        {
                            **point,
                            "role": f"{a} - {b}",
                            **median_range(diff),
                            "ahead": ahead,
                            "behind": behind,
                            "seeds": len(diff),
                        }
                    )
    return out


def _cell(row: Row | None, scale: float = 1.0, digits: int = 2, sign: str = "") -> str:
    if row is None:
        return "–"
    median, low, high = (scale * row[k] for k in ("median", "min", "max"))
    return f"{median:{sign}.{digits}f} [{low:{sign}.{digits}f} to {high:{sign}.{digits}f}]"


def report(rows: list[Row]) -> list[str]:
    """The report: SLO capacity, goodput and the measured − estimated differences."""
    lines = summary(rows)
    index = {(r["kind"], r["profile"], r["scenario"], r["at"], r["role"]): r for r in lines}
    points = sorted({(r["kind"], r["profile"], r["scenario"], r["at"]) for r in lines})
    out = ["## Measured or estimated: edgemon's policy fed each, and the peers", ""]
    for kind, title, scale, digits in (
        ("slo_capacity", "SLO capacity at 95 % (share of the estimated capacity)", 1.0, 2),
        ("goodput", "Goodput, %", 100.0, 1),
        ("late_admitted", "Start-SLO misses of admitted requests, %", 100.0, 1),
    ):
        out += [f"### {title}", ""]
        header = "| profile | scenario | at | " + " | ".join(ROLES) + " | measured − estimated |"
        out += [header, "|---|---|---|" + "---|" * (len(ROLES) + 1)]
        for k, profile, scenario, at in points:
            if k != kind:
                continue
            cells = [
                _cell(index.get((k, profile, scenario, at, who)), scale, digits) for who in ROLES
            ]
            diff = index.get((k, profile, scenario, at, "measured - estimated"))
            d = _cell(diff, scale, digits, "+")
            if diff is not None:
                d += f", ahead {diff['ahead']}/{diff['seeds']}"
            out.append(f"| {profile} | {scenario} | {at:g} | " + " | ".join(cells) + f" | {d} |")
        out.append("")
    return out
