"""Tables, targets and plots from the closed-loop rows (`closed_loop.py --report`).

Per profile, scenario and load, each policy's goodput first (the share of requests that met
both SLOs, with the outcomes), then its silence figures, as median [min–max] over the seeds.

The goodput targets (`goodput_targets`), each comparison made per seed against the same
seed's baselines (same requests), for the policy `edgemon`:

- (a) goodput ≥ that of open, of every static cap and of `realtime`, in ≥ 8 of 10 seeds;
- (b) at slowdown 0.9 and at load 1.2: ≥ 20 points above open and ≥ 10 points above the best
  static cap (the cap with the highest median goodput at that point), in the median;
- (c) start silence p99 of the requests it did not refuse ≤ the start SLO × 1.1, every seed.

The silence comparisons of before, also per seed:

- (a) against the open loop: gap silence ≥ 80 % below, total silence ≤ +10 %;
- (b) slowdown, (c) steady: against the static caps' curve of gap silence over total silence,
  interpolated linearly between the two caps `N`, `N−1` whose totals bracket the policy's
  (b: ≥ 50 % below it; c: not above it). A total outside every bracket has no figure.
"""

from __future__ import annotations

import itertools
import json
import statistics
from collections import defaultdict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

Row = dict[str, Any]
Key = tuple[str, str, float]


def spread(values: list[float], fmt: str = "{:.1f}") -> str:
    """`median [least–most]` of `values` in `fmt`, or a dash."""
    if not values:
        return "–"
    median = statistics.median(values)
    return f"{fmt.format(median)} [{fmt.format(min(values))}–{fmt.format(max(values))}]"


def median_range(values: list[float]) -> dict[str, float]:
    """`median`, `min` and `max` of `values`, rounded as the results files keep them."""
    return {
        "median": round(statistics.median(values), 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
    }


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


SHIPPED = "edgemon"
TARGET_SEEDS = 0.8
"""Target (a): the share of seeds in which `edgemon` must match every baseline."""
OVER_OPEN, OVER_CAPS = 0.20, 0.10
"""Target (b): goodput points above open and above the best static cap."""
START_TOLERANCE = 1.1
"""Target (c): start p99 within the start SLO × this."""


def group(rows: list[Row]) -> dict[Key, dict[str, dict[int, Row]]]:
    """Rows by (profile, scenario, load), then policy, then seed."""
    groups: dict[Key, dict[str, dict[int, Row]]] = defaultdict(lambda: defaultdict(dict))
    for row in rows:
        key = (row["profile"], row["scenario"], float(row["load"]))
        groups[key][row["policy"]][int(row["seed"])] = row
    return groups


def _is_baseline(label: str) -> bool:
    return label in {"open", "realtime"} or _cap(label) is not None


def goodput_targets(key: Key, runs: dict[str, dict[int, Row]]) -> dict[str, Any] | None:
    """The goodput targets at one point (see the module doc), or None without `edgemon`."""
    mine = runs.get(SHIPPED)
    if not mine:
        return None
    baselines = {label: by_seed for label, by_seed in runs.items() if _is_baseline(label)}
    seeds = sorted(mine)
    common = {label: [s for s in seeds if s in by_seed] for label, by_seed in baselines.items()}
    met_per_baseline = {
        label: sum(
            1 for seed in common[label] if mine[seed]["goodput"] >= by_seed[seed]["goodput"] - 1e-9
        )
        for label, by_seed in baselines.items()
    }
    worst = min(
        met_per_baseline,
        key=lambda label: met_per_baseline[label] / max(1, len(common[label])),
        default=None,
    )
    best_each = [
        mine[s]["goodput"] - max(b[s]["goodput"] for b in baselines.values() if s in b)
        for s in seeds
        if any(s in b for b in baselines.values())
    ]
    caps = {label: by for label, by in baselines.items() if _cap(label) is not None}
    best_cap = (
        max(caps, key=lambda label: statistics.median(r["goodput"] for r in caps[label].values()))
        if caps
        else None
    )
    opened = runs.get("open", {})
    slo = float(next(iter(mine.values())).get("start_slo_ms") or 3000.0)
    p99 = [float(mine[s]["start_silence_p99_ms"] or 0.0) for s in seeds]
    profile, scenario, load = key
    return {
        "seeds": len(seeds),
        "goodput": [mine[s]["goodput"] for s in seeds],
        "a_met": {label: met_per_baseline[label] for label in sorted(met_per_baseline)},
        "a_of": {label: len(common[label]) for label in common},
        "a_worst": worst,
        "a_vs_best": best_each,
        "a_ok": all(
            met_per_baseline[label] >= TARGET_SEEDS * len(common[label]) for label in common
        ),
        "b_applies": (scenario == "slowdown" and load == 0.9) or load == 1.2,
        "b_open": [mine[s]["goodput"] - opened[s]["goodput"] for s in seeds if s in opened],
        "b_cap": best_cap,
        "b_caps": [
            mine[s]["goodput"] - caps[best_cap][s]["goodput"]
            for s in seeds
            if best_cap is not None and s in caps[best_cap]
        ],
        "c_p99": p99,
        "c_limit": slo * START_TOLERANCE,
        "c_ok": all(v <= slo * START_TOLERANCE for v in p99),
        "profile": profile,
    }


def target_table(groups: dict[Key, dict[str, dict[int, Row]]]) -> list[str]:
    """One line per point: `edgemon`'s goodput and each target's figure over the seeds."""
    lines = [
        (
            "| profile | scenario | load | edgemon goodput | (a) seeds ≥ each baseline (worst) | "
            "(a) vs best baseline, points | (b) vs open, points | (b) vs best cap, points | "
            "(c) start p99 ms, max over seeds |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key in sorted(groups):
        t = goodput_targets(key, groups[key])
        if t is None:
            continue
        worst = t["a_worst"]
        a_seeds = "–" if worst is None else f"{t['a_met'][worst]}/{t['a_of'][worst]} ({worst})"
        a_mark = "met" if t["a_ok"] else "**missed**"
        b_open = spread([100 * v for v in t["b_open"]], "{:+.1f}")
        b_caps = spread([100 * v for v in t["b_caps"]], "{:+.1f}")
        if t["b_cap"] is None:
            b_caps = "no cap run"
        else:
            b_caps += f" ({t['b_cap']})"
        if t["b_applies"]:
            open_ok = t["b_open"] and statistics.median(t["b_open"]) >= OVER_OPEN
            caps_ok = t["b_caps"] and statistics.median(t["b_caps"]) >= OVER_CAPS
            b_open += " met" if open_ok else " **missed**"
            if t["b_cap"] is not None:
                b_caps += " met" if caps_ok else " **missed**"
        c = f"{max(t['c_p99']):,.0f} ≤ {t['c_limit']:,.0f}: " + (
            "met" if t["c_ok"] else "**missed**"
        )
        lines.append(
            f"| {key[0]} | {key[1]} | {key[2]:g} | "
            f"{spread([100 * v for v in t['goodput']], '{:.1f} %')} | {a_seeds}: {a_mark} | "
            f"{spread([100 * v for v in t['a_vs_best']], '{:+.1f}')} | {b_open} | {b_caps} | "
            f"{c} |"
        )
    return lines


def goodput_lines(runs: dict[str, dict[int, Row]]) -> list[str]:
    """Each policy's goodput and outcomes at one point."""
    lines = [
        (
            "| policy | goodput | good | late | gappy | shed | unfinished | start p99 ms "
            "(admitted) | longest gap p95 ms | shed p99 ms |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, by_seed in runs.items():
        got = list(by_seed.values())
        if "goodput" not in got[0]:
            continue
        lines.append(
            f"| {label} | {spread([100 * r['goodput'] for r in got], '{:.1f} %')} | "
            + " | ".join(
                spread([r[name] for r in got], "{:.0f}")
                for name in ("good", "late", "gappy", "shed", "unfinished")
            )
            + f" | {spread([r['start_silence_p99_ms'] or 0 for r in got], '{:,.0f}')} | "
            f"{spread([r.get('longest_gap_p95_ms') or 0 for r in got], '{:,.0f}')} | "
            f"{spread([r['shed_p99_ms'] for r in got if r.get('shed_p99_ms') is not None])} |"
        )
    return lines


def report(rows: list[Row], *, plot_dir: Path | None = None, targets_of_before: bool = True) -> str:
    """The Markdown tables and target lines for every profile, scenario and load in `rows`
    (`targets_of_before`: also the goodput targets against open and the static caps)."""
    groups = group(rows)
    lines: list[str] = []
    if targets_of_before and any(goodput_targets(key, groups[key]) for key in groups):
        lines += ["## Goodput targets (edgemon, per seed against the same seed's baselines)", ""]
        lines += target_table(groups)
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
            *goodput_lines(runs),
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
            versus_caps = spread(t.get("gap_vs_caps", []), "{:+.0%}")
            if outside:
                versus_caps += f" ({outside} seeds outside the caps' totals)"
            lines.append(
                f"| {label} | {spread([r['gap_silence_s'] for r in got])} | "
                f"{spread([r['gaps_per_stream_min'] for r in got], '{:.2f}')} | "
                f"{spread([r['start_silence_s'] for r in got], '{:.0f}')} | "
                f"{spread([r['start_silence_p99_ms'] or 0 for r in got], '{:,.0f}')} | "
                f"{spread([r['total_silence_s'] for r in got], '{:.0f}')} | "
                f"{spread([r['ttfa_p99_ms'] or 0 for r in got], '{:,.0f}')} | "
                f"{spread(t.get('gap_vs_open', []), '{:+.0%}')} | "
                f"{spread(t.get('total_vs_open', []), '{:+.1%}')} | {versus_caps} |"
            )
    if plot_dir is not None:
        lines.append("")
        lines.extend(plot(groups, plot_dir))
    return "\n".join(lines)


SPOT_FIELDS = (
    "gap_silence_s",
    "start_silence_s",
    "total_silence_s",
    "start_silence_p99_ms",
    "goodput",
)
WALL_CLOCK_MODES = ("realtime", "real")
"""Rows made on a wall clock: vLLM's scheduler on modelled steps (`closed_loop.py`), or the
real engine (`real_engine.py`)."""


AGREE = 0.25
"""A wall-clock figure agrees with its prediction within ±25 % of the virtual run."""


def spot_checks(rows: list[Row]) -> str:
    """Each wall-clock row (real time, or the real engine) beside its prediction: the virtual
    run of the same point (profile, scenario, load, policy; runs of the same length) and seed,
    and the virtual seeds' [min, max]. A figure agrees when it is within ±25 % of the same
    seed's virtual figure, or within the seeds' spread. Then each point's seeds together: the
    wall-clock mean against the virtual mean of the same seeds."""
    virtual: dict[tuple[str, str, float, str], list[Row]] = defaultdict(list)
    for row in rows:
        if row.get("mode") == "virtual":
            virtual[_point(row)].append(row)
    lines = [
        "| profile | scenario | load | policy | seed | "
        + " | ".join(
            f"{name}: wall clock / same seed virtual [seeds min–max]" for name in SPOT_FIELDS
        )
        + " |",
        "|---|---|---|---|---|" + "---|" * len(SPOT_FIELDS),
    ]
    inside = outside = 0
    means: dict[tuple[str, str, float, str], list[tuple[Row, Row | None]]] = defaultdict(list)
    for row in rows:
        if row.get("mode") not in WALL_CLOCK_MODES:
            continue
        point = _point(row)
        peers = virtual.get(point, [])
        twin = next((p for p in peers if p["seed"] == row["seed"]), None)
        means[point].append((row, twin))
        cells = []
        for name in SPOT_FIELDS:
            values = [float(p[name] or 0) for p in peers]
            got = float(row[name] or 0)
            if not values:
                cells.append(f"{got:,.1f} (no virtual run)")
                continue
            same = None if twin is None else float(twin[name] or 0)
            ok = min(values) <= got <= max(values) or _close(got, same)
            inside += ok
            outside += not ok
            mark = "" if ok else " **disagrees**"
            said = "–" if same is None else f"{same:,.2f}"
            cells.append(f"{got:,.2f} / {said} [{min(values):,.2f}–{max(values):,.2f}]{mark}")
        lines.append(
            f"| {row['profile']} {row['mode']} | {row['scenario']} | {row['load']:g} | "
            f"{row['policy']} | {row['seed']} | " + " | ".join(cells) + " |"
        )
    lines += [
        "",
        (
            f"{inside} figures agree with their prediction (±{AGREE:.0%} of the same seed's, "
            f"or within the virtual seeds' spread), {outside} do not."
        ),
        "",
        "| scenario | load | policy | seeds | "
        + " | ".join(f"{name}: wall clock / virtual, mean (difference)" for name in SPOT_FIELDS)
        + " |",
        "|---|---|---|---|" + "---|" * len(SPOT_FIELDS),
    ]
    for point, pairs in means.items():
        twins = [twin for _, twin in pairs if twin is not None]
        if len(twins) < len(pairs):
            continue
        cells = []
        for name in SPOT_FIELDS:
            got = sum(float(row[name] or 0) for row, _ in pairs) / len(pairs)
            predicted = sum(float(twin[name] or 0) for twin in twins) / len(twins)
            change = f"{got / predicted - 1:+.0%}" if predicted else "–"
            cells.append(f"{got:,.2f} / {predicted:,.2f} ({change})")
        lines.append(
            f"| {point[1]} | {point[2]:g} | {point[3]} | {len(pairs)} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def _point(row: Row) -> tuple[str, str, float, str]:
    return (row["profile"], row["scenario"], float(row["load"]), row["policy"])


def _close(got: float, predicted: float | None) -> bool:
    """Within ±`AGREE` of the prediction (both zero agree)."""
    if predicted is None:
        return False
    return abs(got - predicted) <= AGREE * abs(predicted)


def plot(groups: dict[Key, dict[str, dict[int, Row]]], directory: Path) -> list[str]:
    """One PNG per profile: goodput against load (10-seed medians, the seeds' range as a
    band), one line per policy, one panel per scenario."""
    try:
        import matplotlib as mpl  # noqa: PLC0415 - optional
    except ImportError:
        return ["plots: matplotlib is not installed here (make bench-loop installs it)"]
    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    directory.mkdir(parents=True, exist_ok=True)
    by_profile: dict[str, dict[str, list[Key]]] = defaultdict(lambda: defaultdict(list))
    for key in sorted(groups):
        by_profile[key[0]][key[1]].append(key)
    written = []
    for profile, scenes in by_profile.items():
        figure, axes = plt.subplots(1, len(scenes), figsize=(5.5 * len(scenes), 4.5), squeeze=False)
        for axis, (scenario, keys) in zip(axes[0], scenes.items(), strict=True):
            labels = list(dict.fromkeys(label for key in keys for label in groups[key]))
            for label in labels:
                xs, mid, low, high = [], [], [], []
                for key in keys:
                    got = [r["goodput"] for r in groups[key].get(label, {}).values()]
                    if got:
                        xs.append(key[2])
                        mid.append(100 * statistics.median(got))
                        low.append(100 * min(got))
                        high.append(100 * max(got))
                kind = _kind(label)
                style: tuple[Any, str] = _STYLE.get(kind, ("tab:green", "-"))
                cap = _cap(label)
                if cap is not None:  # the caps in shades of blue, tighter darker
                    caps = sorted(c for c in map(_cap, labels) if c is not None)
                    shade = 0.9 - 0.5 * caps.index(cap) / max(1, len(caps) - 1)
                    style = (mpl.colormaps["Blues"](shade), ":")
                width = 2.4 if kind == "edgemon" else 1.2
                axis.plot(
                    xs,
                    mid,
                    marker="o",
                    color=style[0],
                    linestyle=style[1],
                    linewidth=width,
                    label=label,
                    markersize=3,
                )
                if kind in {"edgemon", "open"}:
                    axis.fill_between(xs, low, high, color=style[0], alpha=0.12)
            axis.set_xlabel("load (share of estimated capacity)")
            axis.set_ylabel("goodput (% of requests good)")
            axis.set_ylim(0, 100)
            params = next(iter(next(iter(groups[keys[0]].values())).values()))
            axis.set_title(str(params.get("scenario_params", scenario)))
            axis.grid(alpha=0.3)
            axis.legend(fontsize=7)
        slo = next(iter(next(iter(groups[next(iter(scenes.values()))[0]].values())).values()))
        figure.suptitle(
            f"{profile}: goodput (start ≤ {slo.get('start_slo_ms', 3000):g} ms, longest gap ≤ "
            f"{slo.get('gap_slo_ms', 100):g} ms), medians over seeds, virtual clock"
        )
        figure.tight_layout()
        path = directory / f"goodput-{profile}.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(f"plot: {path}")
    return written


_STYLE = {
    "open": ("tab:red", "-"),
    "cap": ("tab:blue", ":"),
    "gate": ("tab:orange", "--"),
    "realtime": ("tab:purple", "--"),
    "edgemon": ("black", "-"),
}


def _kind(label: str) -> str:
    if label in {"open", "edgemon", "realtime"}:
        return label
    if _cap(label) is not None:
        return "cap"
    if label.startswith("gate:"):
        return "gate"
    return "mine"


def write_rows(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    """Write `rows` to `path` as JSON lines (its folder created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as file:
        for line in rows:
            file.write(json.dumps(line) + "\n")
