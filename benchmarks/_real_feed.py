"""Measured or estimated on the real engine: the figures of `make bench-real-feed`.

The rows are runs of `edgemon` with parking fed the players' measured state
(`edgemon+park:measured`), the server's estimate (`edgemon+park:estimated`) or no parking
(`edgemon`), on the real engine (`real_engine.py --feed`, mode `real`) and on the virtual
loop with the step shape measured there (`closed_loop.py --steps`, mode `virtual`), per
scenario and seed. Each figure is a median over the seeds with the least and the most; a
difference between two feeds is taken seed by seed (the same requests and listeners). The
real runs also count the parks the engine logged and the requests vLLM preempted.

    python benchmarks/_real_feed.py REAL.jsonl VIRTUAL.jsonl > benchmarks/results/real-feed.jsonl
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _loop_report import median_range

Row = dict[str, Any]

ROLES = {
    "edgemon+park:measured": "measured",
    "edgemon+park:estimated": "estimated",
    "edgemon": "none",
}
DIFFERENCES = (("measured", "estimated"), ("measured", "none"), ("estimated", "none"))
COMMAND = "make bench-real-feed"


def summary(rows: list[Row]) -> list[Row]:
    """Per mode and scenario: each feed's goodput, the differences, and the real engine's
    parks and preemptions."""
    goodput: dict[tuple[str, str, float], dict[str, dict[int, float]]] = defaultdict(
        lambda: defaultdict(dict)
    )
    counts: dict[tuple[str, str, float, str], dict[str, int]] = defaultdict(
        lambda: {"parks": 0, "preemptions": 0}
    )
    for row in rows:
        who = ROLES.get(str(row.get("policy")))
        if who is None or row.get("kind") is not None:
            continue
        key = (str(row["mode"]), str(row["scenario"]), float(row["load"]))
        goodput[key][who][int(row["seed"])] = float(row["goodput"])
        if row["mode"] == "real":
            for name in ("parks", "preemptions"):
                counts[(*key, who)][name] += int(row.get(name, 0))
    out: list[Row] = []
    for (mode, scenario, load), by_role in goodput.items():
        point = {"kind": "goodput", "mode": mode, "scenario": scenario, "load": load}
        for who, seeds in by_role.items():
            extra = counts.get((mode, scenario, load, who), {})
            values = [seeds[s] for s in sorted(seeds)]
            out.append({**point, "role": who, **median_range(values), "values": values, **extra})
        for a, b in DIFFERENCES:
            both = sorted(set(by_role.get(a, {})) & set(by_role.get(b, {})))
            diff = [by_role[a][s] - by_role[b][s] for s in both]
            if diff:
                ahead = sum(d > 0 for d in diff)
                out.append(
                    {**point, "role": f"{a} - {b}", **median_range(diff), "values": diff}
                    | {"ahead": ahead, "seeds": len(diff)}
                )
    return out


def main(paths: list[str]) -> int:
    """The summary of the rows in `paths`, one JSON line each, after a `made` line."""
    rows = [
        json.loads(line)
        for path in paths
        for line in Path(path).read_text(encoding="utf-8").splitlines()
        if line.startswith("{")
    ]
    seeds = sorted({int(r["seed"]) for r in rows if r.get("policy") in ROLES})
    arrivals = sorted({float(r["arrivals_s"]) for r in rows if r.get("mode") == "real"})
    made = {"kind": "made", "command": COMMAND, "date": f"{datetime.now(UTC):%Y-%m-%d}"}
    print(json.dumps(made | {"seeds": seeds, "arrivals_s": arrivals}))
    for line in summary(rows):
        print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
