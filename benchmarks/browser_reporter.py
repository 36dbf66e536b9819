"""The web player's Reporter: its cost on the page's main thread, and its weight
(`make test-browser` runs it with `--check` after the browser tests).

Run: `.venv/bin/python benchmarks/browser_reporter.py [--check] [--pairs 4] [--seconds 3]
[--handoff-ms 0] [--in-page] [--floor]`.

The test player (clients/js/test/page), served cross-origin isolated (so its Reporter hands
its chunks to its worker through shared memory; `--not-isolated`: a page that is not, a
message a call; `--messages`: isolated, messages all the same), in Debian's headless
Chromium plays 4 streams of one
80 ms chunk every 80 ms each (12.5 chunks a second per stream, staggered) on one AudioContext,
in rounds of two phases of `--seconds` in the same page: a baseline phase schedules the chunks
itself, a report phase plays them through `WebAudioStream` and a `Reporter` connected to a
real Mosquitto over WebSocket (each chunk reported, batched, published at QoS 1 and
acknowledged). One unmeasured round first (the page's code compiled, the Reporter's worker
started and connected), then `--pairs` rounds. Chrome's own performance metrics (CDP
`Performance.getMetrics` in thread time, so a busy machine's waits do not count:
`ScriptDuration`, the main thread's JavaScript, and `TaskDuration`, all its tasks) are read
where each phase starts and ends; a round's reporting cost is its report phase's ms a second
less its baseline's, and the figure is the median of the rounds (each printed). `--floor`
adds a third phase to each round: the baseline's scheduling and one `postMessage` of a
number a chunk to a worker that does nothing with it, the least a page pays to hand each
chunk to a worker as it comes; its cost is printed the same way.

Targets (issue 41), each printed with its verdict:
- the main thread spends ≤ 1 ms a second reporting. Thread time is not load-proof on a shared
  2-core machine: as other processes load it, the baseline itself costs 2.0 to 4.5 ms a
  second, and the reporting cost moves too (by message 1.3 to 1.6 on a quiet one, more under
  load), not always with it: a postMessage (a worker woken) and the page's own DOM calls
  suffer differently from different loads. The ratio of the two (the reporting cost over the
  baseline's: 0.22 to 0.30 seen through shared memory, 0.29 to 0.96 by message) is printed
  too, and is what `--check` bounds.
- the bundle, minified: ≤ 120 kB. It is two files, both downloaded by every page that
  reports: the page's into the page, its worker's (the core and its MQTT link) into the
  worker, or into the page where no worker starts. Their sum is held raw (`npm run size` in
  clients/js prints each file's bytes module by module).
- no runtime dependency (the MQTT link is the package's own, clients/js/src/mqtt.ts).

`--check` exits 1 when the bundle's bound, a dependency, the reporting from the
worker (no worker failure) the way it was meant to (shared memory or messages), a lost event,
or the cost bound is not kept. The cost bound is `MAX_COST_RATIO` of the baseline, not the 1
ms a second of the target, which a loaded machine's thread time does not hold steady, and
which messages cannot keep (docs/how-to/web-player.md, "What was measured": one `postMessage`
to the worker a chunk is the least a page without shared memory can pay to hand its events
over within the 5 ms window, and here that alone costs 0.9 ms a second, `--floor`);
`--hold-target` holds the 1 ms a second as well. Reporting in the page (`--in-page`) costs
about twice the baseline: the ratio bound fails it.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from _support import ROOT

from brokers import end_process, launch_mosquitto, ws_listener
from web_players import BUNDLE, JS, WORKER_BUNDLE, PageServer, run_chromium

#: The targets.
MAX_COST_MS_PER_S = 1.0
MAX_BUNDLE_BYTES = 120_000
#: The bound `--check` holds on the reporting cost against the baseline: above what the
#: worker's reporting costs under any load measured (0.29 to 0.96 by message, 0.22 to 0.30
#: through shared memory), below what reporting in the page costs (1.75 to 1.92; it was 2.5 to
#: 4 with mqtt.js), so a Reporter that falls back to the page's thread fails it.
MAX_COST_RATIO = 1.5
STREAMS, CHUNK_MS = 4, 80
#: The Reporter's coalescing window: the page's default (`flushMs`).
FLUSH_MS = 5.0


async def measure(directory: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One page run: the phases' metrics and the page's result."""
    broker, (_, port) = launch_mosquitto(directory, ws_listener, listeners=2)
    plan = {
        "broker": f"ws://127.0.0.1:{port}",
        "flushMs": args.flush_ms, "mergeMs": 5, "handoffMs": args.handoff_ms,
        "worker": not args.in_page, "sharedMemory": not args.messages,
        "load": {
            "device": "web-load", "stream": "load", "streams": STREAMS, "chunkMs": CHUNK_MS,
            "seconds": args.seconds, "pairs": args.pairs, "warmupS": args.warmup_s,
            "floor": args.floor,
        },
    }  # fmt: skip
    server = PageServer(plan, {}, isolated=not args.not_isolated)
    await server.start()
    phases = 3 if args.floor else 2
    budget = (phases * (args.pairs * args.seconds + args.warmup_s)) * 3 + 60
    try:
        return await run_chromium(server.url, directory / "load.json", timeout_s=budget)
    finally:
        await server.stop()
        end_process(broker)


def per_second(phases: dict[str, dict[str, float]], phase: str, metric: str) -> float:
    """ms of `metric` per second of the phase's wall time."""
    start, end = phases[f"{phase}-start"], phases[f"{phase}-end"]
    return (end[metric] - start[metric]) / (end["Timestamp"] - start["Timestamp"]) * 1000


def costs(phases: dict[str, dict[str, float]], pairs: int, metric: str) -> list[float]:
    """Each round's reporting cost: its report phase's ms/s less its baseline's."""
    return [
        per_second(phases, f"report-{k}", metric) - per_second(phases, f"baseline-{k}", metric)
        for k in range(pairs)
    ]


def bundle_sizes() -> tuple[int, int]:
    """The two files' bytes together, what every page that reports downloads: (minified,
    gzip -9 each)."""
    files = {
        BUNDLE: "into the page",
        WORKER_BUNDLE: "into its worker, or the page where no worker starts",
    }
    raw = [path.read_bytes() for path in files]
    for (path, where), data in zip(files.items(), raw, strict=True):
        packed = len(gzip.compress(data, compresslevel=9))
        print(
            f"bundle {path.relative_to(ROOT)} ({where}): {len(data)} bytes minified, "
            f"{packed} gzip -9"
        )
    return sum(map(len, raw)), sum(len(gzip.compress(data, compresslevel=9)) for data in raw)


def main() -> int:
    """Measure, print, and with `--check` the verdict."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a bound is not kept")
    parser.add_argument(
        "--hold-target", action="store_true", help="with --check, hold the 1 ms/s target too"
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="each phase's playback")
    parser.add_argument("--pairs", type=int, default=4, help="rounds of baseline and report")
    parser.add_argument("--warmup-s", type=float, default=1.5, help="the unmeasured round's phases")
    parser.add_argument("--flush-ms", type=float, default=FLUSH_MS, help="the Reporter's window")
    parser.add_argument(
        "--handoff-ms", type=float, default=0.0, help="the page's window before the worker"
    )
    parser.add_argument("--in-page", action="store_true", help="the Reporter without its worker")
    parser.add_argument(
        "--not-isolated", action="store_true",
        help="a page that is not cross-origin isolated (no shared memory: a message a call)",
    )  # fmt: skip
    parser.add_argument(
        "--messages", action="store_true",
        help="an isolated page whose Reporter hands its calls over by message all the same",
    )  # fmt: skip
    parser.add_argument(
        "--floor", action="store_true", help="a third phase: a bare postMessage a chunk"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        report = asyncio.run(measure(Path(name), args))
    phases, result = report["phases"], report["result"]["load"]
    stats = result["reporter"]
    medians, ratios = {}, {}
    for metric in ("ScriptDuration", "TaskDuration"):
        rounds = costs(phases, args.pairs, metric)
        bases = [per_second(phases, f"baseline-{k}", metric) for k in range(args.pairs)]
        medians[metric] = statistics.median(rounds)
        ratios[metric] = statistics.median(c / b for c, b in zip(rounds, bases, strict=True))
        print(
            f"main thread, {metric}: reporting costs {medians[metric]:.3f} ms/s, "
            f"{ratios[metric]:.2f} x the baseline (medians of {args.pairs} rounds: "
            f"{', '.join(f'{c:.3f}' for c in rounds)} ms/s; baseline "
            f"{', '.join(f'{b:.3f}' for b in bases)} ms/s; {STREAMS} streams x "
            f"{1000 / CHUNK_MS:g} chunks/s, {args.seconds:g} s a phase)"
        )
    if args.floor:
        for metric in ("ScriptDuration", "TaskDuration"):
            floors = [
                per_second(phases, f"floor-{k}", metric)
                - per_second(phases, f"baseline-{k}", metric)
                for k in range(args.pairs)
            ]
            print(
                f"main thread, {metric}: the floor, one postMessage of a number a chunk to a "
                f"worker that does nothing, costs {statistics.median(floors):.3f} ms/s "
                f"(median of {args.pairs} rounds: {', '.join(f'{c:.3f}' for c in floors)} ms/s)"
            )
    where = "in its worker" if stats["worker"] else "in the page"
    how = "shared memory" if stats["sharedMemory"] else "messages"
    print(
        f"reporter ({where}, {stats['workerFailures']} worker failures, {how}, flushMs "
        f"{args.flush_ms:g}, handoffMs {args.handoff_ms:g}): {stats['events']} events, "
        f"{stats['sent']} acknowledged in {stats['messages']} messages, {stats['merged']} "
        f"merged, {stats['dropped']} dropped"
    )
    raw, packed = bundle_sizes()
    print(f"bundle, both files: {raw} bytes minified, {packed} bytes gzip -9")
    dependencies = json.loads((JS / "package.json").read_text())["dependencies"]
    print(f"runtime dependencies: {sorted(dependencies)}")
    failures = []
    for metric, cost in medians.items():
        verdict = "kept" if cost <= MAX_COST_MS_PER_S else "NOT kept"
        print(
            f"target: reporting ≤ {MAX_COST_MS_PER_S} ms/s of the main thread ({metric}): {verdict}"
        )
        if args.hold_target and cost > MAX_COST_MS_PER_S:
            failures.append(f"reporting costs {cost:.3f} ms/s of {metric} > {MAX_COST_MS_PER_S}")
        if ratios[metric] > MAX_COST_RATIO:
            failures.append(
                f"reporting costs {ratios[metric]:.2f} x the baseline's {metric} > {MAX_COST_RATIO}"
            )
    verdict = "kept" if raw <= MAX_BUNDLE_BYTES else "NOT kept"
    print(f"target: the bundle ≤ {MAX_BUNDLE_BYTES} bytes minified: {verdict} ({raw})")
    if raw > MAX_BUNDLE_BYTES:
        failures.append(f"the bundle is {raw} bytes minified > {MAX_BUNDLE_BYTES}")
    if dependencies:
        failures.append(f"runtime dependencies {sorted(dependencies)}: the package has none")
    if stats["worker"] == args.in_page or stats["workerFailures"]:
        failures.append("the Reporter did not report from where it was meant to")
    shared = not (args.in_page or args.not_isolated or args.messages or args.handoff_ms)
    if stats["sharedMemory"] != shared:
        failures.append(f"the Reporter's calls went {'not ' * shared}through shared memory")
    if stats["sent"] != stats["events"] or stats["dropped"] or not all(result["flushed"]):
        failures.append(f"the reporting phases lost events: {stats}")
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if args.check and failures else 0


if __name__ == "__main__":
    sys.exit(main())
