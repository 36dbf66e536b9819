"""Engine throughput: chunk events per second, and whether history or stream count slow it.

Run: `.venv/bin/python benchmarks/engine.py` (or `make bench`). Prints, in one run:
  1. 1,000,000 chunk events over 10,000 concurrent streams on 100 devices (with every
     deadline fired on the way: advance() runs before each event), events per second, for
     a realistic mix (10% of streams struggling) and a stress mix (all struggling);
  2. the same number of chunk events into ONE stream;
  and the ratio of the per-event costs (2 / 1). Targets: ≥ 150,000 events/s; ratio ≤ 1.5.
Only engine calls are timed; building the events is not.
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from typing import TYPE_CHECKING

from edgemon.engine.config import EngineConfig
from edgemon.engine.engine import Engine
from edgemon.engine.events import ChunkEvent, Event

if TYPE_CHECKING:
    from edgemon.engine.outputs import Output

Work = list[tuple[str, list[Event], float]]


def many_streams(
    total: int, devices: int, streams: int, seed: int, *, struggling: float = 0.1
) -> Work:
    """Round-robin chunks, one every 200 ms per stream.

    A healthy stream brings 220-320 ms of audio per chunk; a struggling one (the share
    `struggling`) 160-260 ms, so it hovers near its margin, crosses it and underruns: the
    deadlines that fire between messages are real work in this benchmark.
    """
    rng = random.Random(seed)
    low = [160.0 if rng.random() < struggling else 220.0 for _ in range(streams)]
    per_device = streams // devices
    rounds = total // streams
    interval = 200.0
    work: Work = []
    for r in range(rounds):
        base = r * interval
        for i in range(streams):
            t = base + i * interval / streams
            device = f"dev{i % devices}"
            stream = f"s{i // devices}"
            assert i // devices < per_device
            event = ChunkEvent(
                stream=stream,
                t_ms=t,
                seq=r,
                audio_ms=rng.uniform(low[i], low[i] + 100.0),
                eta_ms=rng.uniform(150.0, 260.0) if rng.random() < 0.8 else None,
            )
            work.append((device, [event], t))
    return work


def one_stream(total: int, seed: int) -> Work:
    """The same number of chunks, all into one stream."""
    rng = random.Random(seed)
    work: Work = []
    for seq in range(total):
        t = seq * 200.0
        event = ChunkEvent(
            stream="only",
            t_ms=t,
            seq=seq,
            audio_ms=rng.uniform(160.0, 260.0),
            eta_ms=rng.uniform(150.0, 260.0) if rng.random() < 0.8 else None,
        )
        work.append(("dev0", [event], t))
    return work


def run(work: Work) -> tuple[float, int]:
    """Seconds spent in the engine for all of `work`, and how many outputs it produced."""
    engine = Engine(EngineConfig())
    out: list[Output] = []
    produced = 0
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        for device, events, recv in work:
            engine.advance(recv, out)
            engine.apply(device, events, recv, out)
            if len(out) > 4096:
                produced += len(out)
                out.clear()
        elapsed = time.perf_counter() - start
    finally:
        gc.enable()
    return elapsed, produced + len(out)


def main() -> None:
    """Measure and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--devices", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    for label, share in (("10% struggling", 0.1), ("all struggling (stress)", 1.0)):
        work = many_streams(args.events, args.devices, args.streams, args.seed, struggling=share)
        many_s, many_out = run(work)
        n_many = len(work)
        del work
        print(f"{n_many:,} chunk events, {args.streams:,} streams on {args.devices} devices, "
              f"{label}: {many_s:.2f} s, {n_many / many_s:,.0f} events/s, "
              f"{many_s / n_many * 1e6:.2f} µs/event, {many_out:,} outputs")  # fmt: skip

    work = one_stream(args.events, args.seed)
    one_s, one_out = run(work)
    n_one = len(work)
    del work
    print(f"{n_one:,} chunk events, 1 stream: {one_s:.2f} s, {n_one / one_s:,.0f} events/s, "
          f"{one_s / n_one * 1e6:.2f} µs/event, {one_out:,} outputs")  # fmt: skip
    ratio = (one_s / n_one) / (many_s / n_many)
    print(f"per-event cost, one long stream / many streams (stress): {ratio:.2f}")


if __name__ == "__main__":
    main()
