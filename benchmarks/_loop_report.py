"""Tables, targets and plots from the closed-loop rows (`closed_loop.py --report`).

Per profile, scenario and load, each policy's 10-seed figures as median [min–max], and the
targets of issue 16 §6, each computed per seed against the same seed's baselines (same
requests) and given as median [min–max] over the seeds, with how many seeds met it:

- (a) against the open loop: gap silence ≥ 80 % below, total silence ≤ +10 %;
- (b) slowdown, (c) steady: against the static caps' curve of gap silence over total silence,
  interpolated linearly between the two caps `N`, `N−1` whose totals bracket the policy's
  (b: ≥ 50 % below it; c: not above it). A total outside every bracket has no figure.
"""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

Row = dict[str, Any]
Key = tuple[str, str, float]


def _spread(values: list[float], fmt: str = "{:.1f}") -> str:
    if not values:
        return "–"
    median = statistics.median(values)
    return f"{fmt.format(median)} [{fmt.format(min(values))}–{fmt.format(max(values))}]"


def _cap(label: str) -> int | None:
    if label.startswith("cap:") and label[4:].isdigit():
        return int(label[4:])
    return None


def cap_curve_gap(caps: dict[int, Row], total: float) -> float | None:
    """The caps' gap silence at `total` silence, between neighbouring caps that bracket it."""
    ordered = sorted(caps)
    for low, high in itertools.pairwise(ordered):
        t_low, t_high = float(caps[low]["total_silence_s"]), float(caps[high]["total_silence_s"])
        g_low, g_high = float(caps[low]["gap_silence_s"]), float(caps[high]["gap_silence_s"])
        lo, hi = min(t_low, t_high), max(t_low, t_high)
        if lo <= total <= hi:
            if hi == lo:
                return min(g_low, g_high)
            share = (total - t_low) / (t_high - t_low)
            return g_low + share * (g_high - g_low)
    return None


def targets(runs: dict[str, dict[int, Row]], label: str, scenario: str) -> dict[str, list[float]]:
    """Per seed: (a) gap and total change against open; (b/c) gap against the caps' curve."""
    out: dict[str, list[float]] = defaultdict(list)
    for seed, mine in runs[label].items():
        opened = runs.get("open", {}).get(seed)
        if opened is not None and opened["gap_silence_s"] > 0:
            out["gap_vs_open"].append(mine["gap_silence_s"] / opened["gap_silence_s"] - 1)
            out["total_vs_open"].append(mine["total_silence_s"] / opened["total_silence_s"] - 1)
        caps = {
            n: by_seed[seed]
            for name, by_seed in runs.items()
            if (n := _cap(name)) is not None and seed in by_seed
        }
        curve = cap_curve_gap(caps, mine["total_silence_s"])
        if curve is not None and curve > 0:
            out["gap_vs_caps"].append(mine["gap_silence_s"] / curve - 1)
        elif curve is None:
            out["outside_caps"].append(float(seed))
    del scenario
    return out


def report(rows: list[Row], *, plot_dir: Path | None = None) -> str:
    """The Markdown tables and target lines for every profile, scenario and load in `rows`."""
    groups: dict[Key, dict[str, dict[int, Row]]] = defaultdict(lambda: defaultdict(dict))
    for row in rows:
        key = (row["profile"], row["scenario"], float(row["load"]))
        groups[key][row["policy"]][int(row["seed"])] = row
    lines: list[str] = []
    for key in sorted(groups):
        profile, scenario, load = key
        runs = groups[key]
        params = next(iter(next(iter(runs.values())).values())).get("scenario_params", scenario)
        seeds = sorted({s for by_seed in runs.values() for s in by_seed})
        lines += [
            "",
            (
                f"### {profile}, {params}, load {load:g} ({len(seeds)} seeds: "
                f"{seeds[0]}–{seeds[-1]}), median [min–max] over seeds"
            ),
            "",
            (
                "| policy | gap silence s | gaps /stream-min | start silence s | start p99 ms | "
                "total silence s | TTFA p99 ms | gap vs open | total vs open | "
                "gap vs caps' curve |"
            ),
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for label, by_seed in runs.items():
            got = list(by_seed.values())
            t = targets(runs, label, scenario)
            outside = len(t.get("outside_caps", []))
            versus_caps = _spread(t.get("gap_vs_caps", []), "{:+.0%}")
            if outside:
                versus_caps += f" ({outside} seeds outside the caps' totals)"
            lines.append(
                f"| {label} | {_spread([r['gap_silence_s'] for r in got])} | "
                f"{_spread([r['gaps_per_stream_min'] for r in got], '{:.2f}')} | "
                f"{_spread([r['start_silence_s'] for r in got], '{:.0f}')} | "
                f"{_spread([r['start_silence_p99_ms'] or 0 for r in got], '{:,.0f}')} | "
                f"{_spread([r['total_silence_s'] for r in got], '{:.0f}')} | "
                f"{_spread([r['ttfa_p99_ms'] or 0 for r in got], '{:,.0f}')} | "
                f"{_spread(t.get('gap_vs_open', []), '{:+.0%}')} | "
                f"{_spread(t.get('total_vs_open', []), '{:+.1%}')} | {versus_caps} |"
            )
    if plot_dir is not None:
        lines.append("")
        lines.extend(plot(groups, plot_dir))
    return "\n".join(lines)


SPOT_FIELDS = ("gap_silence_s", "start_silence_s", "total_silence_s", "start_silence_p99_ms")


def spot_checks(rows: list[Row]) -> str:
    """Each real-time row against the virtual rows of its point (profile, scenario, load,
    policy; runs of the same length): is each figure within the virtual seeds' [min, max]?"""
    virtual: dict[tuple[str, str, float, str], list[Row]] = defaultdict(list)
    for row in rows:
        if row.get("mode") == "virtual":
            point = (row["profile"], row["scenario"], float(row["load"]), row["policy"])
            virtual[point].append(row)
    lines = [
        "| profile | scenario | load | policy | seed | "
        + " | ".join(f"{name} real time (virtual seeds min–max)" for name in SPOT_FIELDS)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(SPOT_FIELDS),
    ]
    inside = outside = 0
    for row in rows:
        if row.get("mode") != "realtime":
            continue
        point = (row["profile"], row["scenario"], float(row["load"]), row["policy"])
        peers = virtual.get(point, [])
        cells = []
        for name in SPOT_FIELDS:
            values = [float(p[name] or 0) for p in peers]
            got = float(row[name] or 0)
            if not values:
                cells.append(f"{got:,.1f} (no virtual run)")
                continue
            ok = min(values) <= got <= max(values)
            inside += ok
            outside += not ok
            mark = "" if ok else " **outside**"
            cells.append(f"{got:,.1f} ({min(values):,.1f}–{max(values):,.1f}){mark}")
        lines.append(
            f"| {row['profile']} | {row['scenario']} | {row['load']:g} | {row['policy']} | "
            f"{row['seed']} | " + " | ".join(cells) + " |"
        )
    lines.append("")
    lines.append(f"{inside} figures within the virtual seeds' spread, {outside} outside.")
    return "\n".join(lines)


def plot(groups: dict[Key, dict[str, dict[int, Row]]], directory: Path) -> list[str]:
    """One PNG per profile and scenario: gap silence over start silence p99 (10-seed medians),
    one point per policy setting, one panel per load, the lower-left frontier drawn."""
    try:
        import matplotlib as mpl  # noqa: PLC0415 - optional
    except ImportError:
        return ["plots: matplotlib is not installed here (make bench-loop installs it)"]
    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    directory.mkdir(parents=True, exist_ok=True)
    colours = {
        "open": "tab:red",
        "cap": "tab:blue",
        "gate": "tab:orange",
        "mine": "tab:green",
        "edgemon": "black",
    }
    by_scene: dict[tuple[str, str], list[Key]] = defaultdict(list)
    for key in sorted(groups):
        by_scene[key[0], key[1]].append(key)
    written = []
    for (profile, scenario), keys in by_scene.items():
        figure, axes = plt.subplots(1, len(keys), figsize=(6.5 * len(keys), 5), squeeze=False)
        for axis, key in zip(axes[0], keys, strict=True):
            points = []
            for label, by_seed in groups[key].items():
                got = list(by_seed.values())
                x = statistics.median(r["start_silence_p99_ms"] or 0 for r in got) / 1000
                y = statistics.median(r["gap_silence_s"] for r in got)
                points.append((x, y, label))
                kind = _kind(label)
                axis.scatter(
                    x, y, color=colours[kind], s=28, zorder=4 if kind in {"open", "edgemon"} else 3
                )
                axis.annotate(label, (x, y), fontsize=6, xytext=(3, 2), textcoords="offset points")
            frontier = _frontier(points)
            axis.step(
                [p[0] for p in frontier],
                [p[1] for p in frontier],
                where="post",
                color="grey",
                linestyle="--",
                linewidth=1,
                label="frontier",
            )
            for kind, colour in colours.items():
                axis.scatter([], [], color=colour, label=kind)
            axis.set_xlabel("start silence p99 (s)")
            axis.set_ylabel("gap silence (s per run)")
            axis.set_title(f"load {key[2]:g}")
            axis.legend(fontsize=8)
        params = next(iter(next(iter(groups[keys[0]].values())).values())).get("scenario_params")
        figure.suptitle(f"{profile}, {params}: 10-seed medians, virtual clock")
        figure.tight_layout()
        path = directory / f"closed_loop-{profile}-{scenario}.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(f"plot: {path}")
    return written


def _kind(label: str) -> str:
    if label in {"open", "edgemon"}:
        return label
    if _cap(label) is not None:
        return "cap"
    if label.startswith("gate:"):
        return "gate"
    return "mine"


def _frontier(points: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """The points no other point beats on both axes, by start silence."""
    out: list[tuple[float, float, str]] = []
    for point in sorted(points):
        if not out or point[1] < out[-1][1]:
            out.append(point)
    return out
