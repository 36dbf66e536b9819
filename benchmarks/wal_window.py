"""The write-ahead log's commit window: its CPU cost against the acknowledgement latency.

Run: `.venv/bin/python benchmarks/wal_window.py [--seconds S]`. In this process, on the
state directory's kind of storage (a temporary directory under `--dir`, default the system
temp dir; `/var/lib/edgemon` is where it lives on a box), the real `WriteAheadLog` on its
worker thread, driven as the daemon drives it: messages of 300 bytes appended one loop
iteration at a time at a steady rate, each acknowledged (`when_durable`) once committed.

For each message rate (50/s, the 155/s a Reporter sends in the storm of `storm.py`, 800/s)
and each commit window (0, 5, 10, 20, 40 ms), over `--seconds`: commits per second, the
log's CPU (process CPU time, all threads, minus that of the same pacing loop without a log,
measured in the same run) as a share of one core, and the time from append to
acknowledgement, p50 / p99 / max.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import structlog
from _support import percentile

from edgemon.daemon.wal import WriteAheadLog

RATES = (50.0, 155.0, 800.0)
WINDOWS_MS = (0.0, 5.0, 10.0, 20.0, 40.0)
PAYLOAD = b"x" * 300
TOPIC = "edgemon/v1/box/events"


async def _drive(wal: WriteAheadLog | None, rate: float, seconds: float) -> list[float]:
    """Append at `rate` for `seconds`; the append-to-acknowledgement times, in ms."""
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    pending = 0
    done = asyncio.Event()

    def acknowledged(appended: float) -> None:
        nonlocal pending
        latencies.append((time.perf_counter() - appended) * 1000.0)
        pending -= 1
        if not pending:
            done.set()

    start = loop.time()
    n = 0
    while (due := start + n / rate) < start + seconds:
        await asyncio.sleep(max(0.0, due - loop.time()))
        appended = time.perf_counter()
        if wal is not None:
            pending += 1
            done.clear()
            wal.append(time.time() * 1000.0, TOPIC, PAYLOAD)
            wal.when_durable(functools.partial(acknowledged, appended))
        n += 1
    if pending:
        await done.wait()
    return latencies


async def _measure(directory: Path, rate: float, window_ms: float | None, seconds: float) -> str:
    """One row: `window_ms` None is the pacing loop alone (the baseline)."""
    with ThreadPoolExecutor(1) as executor:
        commits: list[float] = []
        wal = None
        if window_ms is not None:
            wal = WriteAheadLog(
                directory,
                0,
                executor=executor,
                on_commit=commits.append,
                log=structlog.get_logger(),
                commit_window_s=window_ms / 1000.0,
            )
        cpu0 = time.process_time()
        latencies = await _drive(wal, rate, seconds)
        cpu = time.process_time() - cpu0
        if wal is not None:
            await wal.close()
    share = cpu / seconds * 100.0
    if window_ms is None:
        return f"{share:.2f}"
    return (
        f"{window_ms:6.0f} ms  {len(commits) / seconds:6.1f}/s  {share:6.2f} %   "
        f"{percentile(latencies, 50):6.2f} {percentile(latencies, 99):6.2f} "
        f"{max(latencies):6.2f}"
    )


async def _main(seconds: float, base: str | None) -> None:
    for rate in RATES:
        with tempfile.TemporaryDirectory(prefix="edgemon-wal-", dir=base) as tmp:
            baseline = await _measure(Path(tmp), rate, None, seconds)
            print(f"\n{rate:.0f} messages/s (the pacing loop alone: {baseline} % of one core)")
            print("  window   commits   CPU (all)   ack ms: p50    p99    max")
            for window_ms in WINDOWS_MS:
                print("  " + await _measure(Path(tmp), rate, window_ms, seconds))


def main() -> None:
    """Measure and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0, help="per rate and window")
    parser.add_argument("--dir", help="where the temporary log directory is made")
    args = parser.parse_args()
    load = os.getloadavg()
    print(
        "edgemon write-ahead log, commit window vs acknowledgement latency; "
        f"{os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    asyncio.run(_main(args.seconds, args.dir))
    load = os.getloadavg()
    print(f"\nload average after {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
