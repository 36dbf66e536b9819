"""Does edgemon cut underruns? The loop closed vs open, with vLLM's real scheduler in it.

Per run, in real time:

- **Engine.** vLLM V1's scheduler (`edgemon.integrations.vllm.EdgemonScheduler`, built offline
  the way `tests/vllm/harness.py` builds it) runs every step; the forward pass is replaced by
  the step-time model of a hardware profile (`edgemon/simulate/profiles.py`): the benchmark
  sleeps `base + per token × prefill tokens + per seq × decodes` and feeds the scheduler one
  sampled token (one codec frame) per request that finished its prompt (`update_from_output`).
- **Load.** Poisson TTS requests with log-normal prompt and audio lengths (seeded: gate off and
  on see the same requests); frames are cut into chunks as vLLM-Omni streams Qwen3-TTS (a
  short first chunk, then 25 frames = 2 s).
- **Players.** Each stream's player gets its chunks after a network delay and reports them
  through a real `edgemon.client.Reporter`; underruns are scored on the players' clocks
  (conceal model), never taken from edgemon.
- **Stack.** A real Mosquitto on a free port and a real `edgemon run` subprocess decide the
  throttle; with the gate on, the scheduler reads it through a real `ThrottleGate`.

For each load level (light, near capacity, overloaded: shares of the profile's estimated
capacity) it runs the gate off, then on; then it sweeps `margin_ms` × `max_hold_ms` near
capacity. It prints a table per part and writes the rows as JSON lines and a plot (PNG) next
to `--out`.

Run it from a fresh clone with `make bench-loop` (it builds `.venv-vllm`, vLLM's CPU build
plus matplotlib) or: `.venv-vllm/bin/python benchmarks/closed_loop.py --profile jetson`.
A full run is 14–15 runs of `--duration` seconds plus a few seconds each;
`--duration 20 --no-sweep` is a quick look.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _support import ROOT, Edgemon, http_get, mosquitto, samples

sys.path.insert(0, str(ROOT / "tests" / "vllm"))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
for _name in ("EDGEMON_GATE_DEVICE", "EDGEMON_GATE_BROKER"):
    os.environ.pop(_name, None)  # gate off must mean vLLM's own scheduling

from _vllm_engine import VllmEngine  # noqa: E402

from edgemon.client import Reporter, ThrottleGate  # noqa: E402
from edgemon.integrations.vllm import EdgemonScheduler  # noqa: E402
from edgemon.simulate.players import Delivery  # noqa: E402
from edgemon.simulate.profiles import PROFILES, Profile  # noqa: E402
from edgemon.simulate.realtime import Box  # noqa: E402
from edgemon.simulate.workload import Arrivals  # noqa: E402

from conftest import TINY_CONFIG  # noqa: E402 - the vLLM tier's tiny model config
from harness import build_scheduler  # noqa: E402

LOADS = {"light": 0.5, "near": 0.9, "overloaded": 1.3}
#: Margins of the sweep stay below the players' 200 ms prebuffer cushion: with a margin at or
#: above it, every new stream is at risk from its first chunk and the box is throttled nearly
#: all the time (a first sweep with 200 and 400 ms showed 75-98 % throttle share).
MARGINS_MS = (40.0, 80.0, 150.0)
HOLDS_MS = (500.0, 1000.0, 2000.0)
MAX_MODEL_LEN = 4096
KV_BLOCKS = 20_000
#: Time for edgemon to take the last reports of a run before its throttle time is read.
SETTLE_S = 0.5
#: A run whose driver fell further behind the step model than this is marked disturbed.
LAG_LIMIT_MS = 250.0


@dataclasses.dataclass(frozen=True, slots=True)
class Run:
    """One run's settings."""

    part: str
    load: str
    gate: bool
    margin_ms: float
    max_hold_ms: float


def run_one(
    spec: Run, index: int, args: argparse.Namespace, broker: str, edgemon: Edgemon, model: Path
) -> dict[str, Any]:
    """Serve one run in real time; its row."""
    profile: Profile = PROFILES[args.profile]
    device = f"bench-{index}"
    rate = LOADS[spec.load] * profile.capacity_rps()
    gate = None
    if spec.gate:
        gate = ThrottleGate(broker, device, max_hold_ms=spec.max_hold_ms).open()
        if not gate.wait_until(lambda s: s.connected and s.edgemon_online, 10.0):
            raise RuntimeError("the gate did not see edgemon online")
    scheduler = build_scheduler(
        EdgemonScheduler,
        model,
        max_num_batched_tokens=profile.max_num_batched_tokens,
        max_num_seqs=profile.max_num_seqs,
        num_blocks=KV_BLOCKS,
        max_model_len=MAX_MODEL_LEN,
        edgemon_gate=gate,
    )
    reporter = Reporter(broker, device).open()
    box = Box(
        device=device,
        engine=VllmEngine(scheduler, profile),
        arrivals=Arrivals(rate, profile.workload, seed=args.seed),
        delivery=Delivery(profile.network_ms, profile.network_jitter_ms, args.seed),
        reporter=reporter,
        margin_ms=spec.margin_ms,
        eta_hints=args.eta == "hints",
    )
    try:
        score = asyncio.run(box.run(args.duration))
    finally:
        reporter.close()
        if gate is not None:
            gate.close()
        scheduler.shutdown()
    time.sleep(SETTLE_S)
    status, text = http_get(f"http://127.0.0.1:{edgemon.http_port}/metrics")
    if status != 200:
        raise RuntimeError(f"/metrics answered {status}")
    throttled = samples(text, "edgemon_throttle_seconds_total").get(f'device="{device}"', 0.0)
    elapsed_s = (box.end_ms - box.origin_ms) / 1000.0
    return {
        **dataclasses.asdict(spec),
        "profile": profile.name,
        "rate_rps": round(rate, 3),
        "duration_s": round(elapsed_s, 2),
        "requests": score.requests,
        "streams": score.streams,
        "completed_rps": round(score.completed / elapsed_s, 3),
        "stream_minutes": round(score.stream_minutes, 2),
        "underruns": score.underruns,
        "underruns_per_stream_min": round(score.underruns_per_stream_minute, 3),
        "underrun_s": round(score.underrun_s, 2),
        "ttfa_p50_ms": _round(score.ttfa_p50_ms),
        "ttfa_p99_ms": _round(score.ttfa_p99_ms),
        "throttle_share": round(throttled / elapsed_s, 3),
        "holds": 0 if gate is None else gate.stats.holds,
        "held_steps": scheduler.edgemon_stats.held_steps,
        "lag_max_ms": round(box.status.max_lag_ms, 1),
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


# ---------------------------------------------------------------------- output
HEADER = (
    "| load | gate | margin ms | max hold ms | req/s in | underruns /stream-min | "
    "underrun s | TTFA p50 ms | TTFA p99 ms | completed req/s | throttle share | "
    "driver lag max ms |"
)


def table(rows: list[dict[str, Any]]) -> list[str]:
    """Rows as a Markdown table (what the README shows)."""
    lines = [HEADER, "|" + "---|" * HEADER.count(" | ") + "---|"]
    lines.extend(
        (
            f"| {row['load']} | {'on' if row['gate'] else 'off'} | {row['margin_ms']:g} | "
            f"{row['max_hold_ms']:g} | {row['rate_rps']:.2f} | "
            f"{row['underruns_per_stream_min']:.2f} | {row['underrun_s']:.1f} | "
            f"{_num(row['ttfa_p50_ms'])} | {_num(row['ttfa_p99_ms'])} | "
            f"{row['completed_rps']:.2f} | {row['throttle_share']:.0%} |"
            + (
                f" {row['lag_max_ms']:,.0f}"
                + (" (disturbed)" if row["lag_max_ms"] > LAG_LIMIT_MS else "")
                + " |"
            )
        )
        for row in rows
    )
    return lines


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f}"


def verdicts(rows: list[dict[str, Any]]) -> list[str]:
    """Per load: how much closing the loop changed underrun time and p99 time to first audio."""
    out = []
    for load in LOADS:
        pair = {r["gate"]: r for r in rows if r["part"] == "levels" and r["load"] == load}
        if len(pair) < 2:
            continue
        off, on = pair[False], pair[True]
        change = on["underrun_s"] / off["underrun_s"] - 1 if off["underrun_s"] else 0.0
        p99 = (
            on["ttfa_p99_ms"] / off["ttfa_p99_ms"] - 1
            if off["ttfa_p99_ms"] and on["ttfa_p99_ms"]
            else 0.0
        )
        out.append(
            f"{load}: underrun time {off['underrun_s']:.1f} s → {on['underrun_s']:.1f} s "
            f"({change:+.0%}), p99 TTFA {_num(off['ttfa_p99_ms'])} → "
            f"{_num(on['ttfa_p99_ms'])} ms ({p99:+.0%})"
        )
    return out


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Underrun seconds and p99 TTFA per load, gate off vs on; and the sweep's trade-off."""
    import matplotlib as mpl  # noqa: PLC0415 - only in the vLLM venv

    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    levels = [r for r in rows if r["part"] == "levels"]
    sweep = [r for r in rows if r["part"] in {"sweep", "levels"} and r["load"] == "near"]
    figure, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4.5))
    loads = [load for load in LOADS if any(r["load"] == load for r in levels)]
    xs = range(len(loads))
    for offset, gate, colour in ((-0.2, False, "tab:red"), (0.2, True, "tab:green")):
        by_load = {r["load"]: r for r in levels if r["gate"] is gate}
        label = "gate on (loop closed)" if gate else "gate off (loop open)"
        left.bar(
            [x + offset for x in xs],
            [by_load[load]["underrun_s"] for load in loads],
            0.4,
            color=colour,
            label=label,
        )
        middle.bar(
            [x + offset for x in xs],
            [by_load[load]["ttfa_p99_ms"] or 0 for load in loads],
            0.4,
            color=colour,
            label=label,
        )
    for axis, name in ((left, "underrun seconds (players' clocks)"), (middle, "p99 TTFA (ms)")):
        axis.set_xticks(list(xs), loads)
        axis.set_title(name)
        axis.legend()
    for row in sweep:
        colour = "tab:green" if row["gate"] else "tab:red"
        right.scatter(row["ttfa_p99_ms"] or 0, row["underrun_s"], color=colour)
        label = f"{row['margin_ms']:g}/{row['max_hold_ms']:g}" if row["gate"] else "off"
        right.annotate(label, (row["ttfa_p99_ms"] or 0, row["underrun_s"]), fontsize=8)
    right.set_xlabel("p99 TTFA (ms)")
    right.set_ylabel("underrun seconds")
    right.set_title("near capacity: margin/max hold (ms)")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


# ---------------------------------------------------------------------- main
def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="jetson")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds per run")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--loads", default=",".join(LOADS), help="levels to run, e.g. near")
    parser.add_argument("--no-sweep", action="store_true", help="skip the margin × hold sweep")
    parser.add_argument(
        "--eta", choices=("hints", "none"), default="hints", help="players pass eta_ms or not"
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="JSON lines output (default benchmarks/out/closed_loop-<profile>.jsonl); "
        "the PNG goes next to it",
    )
    return parser.parse_args(argv)


def plan(args: argparse.Namespace) -> list[Run]:
    profile = PROFILES[args.profile]
    margin = profile.margin_ms
    runs = [
        Run("levels", load, gate=gate, margin_ms=margin, max_hold_ms=2000.0)
        for load in args.loads.split(",")
        for gate in (False, True)
    ]
    if not args.no_sweep:
        runs += [
            Run("sweep", "near", gate=True, margin_ms=m, max_hold_ms=h)
            for m in MARGINS_MS
            for h in HOLDS_MS
            if not (m == margin and h == 2000.0)
        ]
    return runs


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    for load in args.loads.split(","):
        if load not in LOADS:
            raise SystemExit(f"unknown load {load!r}: {', '.join(LOADS)}")
    profile = PROFILES[args.profile]
    out = args.out or ROOT / "benchmarks" / "out" / f"closed_loop-{profile.name}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    runs = plan(args)
    started = datetime.now(UTC)
    print(f"# closed loop, profile {profile.name}: {profile.title}")
    print(
        f"# capacity ≈ {profile.capacity_rps():.2f} req/s (estimate), {len(runs)} runs × "
        f"{args.duration:g} s, seed {args.seed}, eta {args.eta}; {platform.node()}, "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
        f"{started:%Y-%m-%d %H:%M} UTC",
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="edgemon-loop-") as tmp:
        directory = Path(tmp)
        model = directory / "model"
        model.mkdir()
        config = {**TINY_CONFIG, "max_position_embeddings": MAX_MODEL_LEN}
        (model / "config.json").write_text(json.dumps(config))
        with mosquitto(directory) as port:
            edgemon = Edgemon(directory, port)
            try:
                edgemon.ready()
                broker = f"mqtt://127.0.0.1:{port}"
                for index, spec in enumerate(runs):
                    row = run_one(spec, index, args, broker, edgemon, model)
                    rows.append(row)
                    print("# " + json.dumps(row), flush=True)
            finally:
                edgemon.close()
    with out.open("w", encoding="utf-8") as file:
        for row in rows:
            file.write(json.dumps(row) + "\n")
    levels = [r for r in rows if r["part"] == "levels"]
    print()
    print("\n".join(table(levels)))
    print()
    print("\n".join(verdicts(rows)))
    sweep = sorted(
        (r for r in rows if r["load"] == "near"),
        key=lambda r: (r["gate"], r["margin_ms"], r["max_hold_ms"]),
    )
    if len(sweep) > 2:
        print("\nnear capacity, margin × max hold (underrun s vs p99 TTFA):")
        print("\n".join(table(sweep)))
    picture = out.with_suffix(".png")
    plot(rows, picture, f"edgemon closed loop — {profile.name}, {args.duration:g} s runs")
    print(f"\nrows: {out}\nplot: {picture}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
