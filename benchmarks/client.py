"""What the two ends of the loop cost their callers, per call, against baselines in the same run.

Run: `.venv/bin/python benchmarks/client.py`. No broker is needed: nothing here waits for
the network (a Reporter that was never opened checks and queues exactly as an open one does).
Prints nanoseconds per call and ratios:
  1. `ThrottleGate.should_throttle_prefills()` while released (the common case) and while
     holding, against a bare method call returning an attribute (the cheapest possible gate);
  2. `Reporter.chunk(pcm_bytes=...)` against encoding the same event object as JSON (what
     any reporter must at least do to put the event on the wire).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from typing import TYPE_CHECKING

from edgemon.client import Reporter, ThrottleGate
from edgemon.client.gate import GateState

if TYPE_CHECKING:
    from collections.abc import Callable


class _Bare:
    __slots__ = ("flag",)

    def __init__(self) -> None:
        self.flag = False

    def read(self) -> bool:
        return self.flag


def per_call_ns(call: Callable[[], object], calls: int) -> float:
    """Best of five runs of `calls` calls, in nanoseconds per call."""
    best = float("inf")
    for _ in range(5):
        gc.disable()
        started = time.perf_counter_ns()
        for _ in range(calls):
            call()
        elapsed = time.perf_counter_ns() - started
        gc.enable()
        best = min(best, elapsed / calls)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    args = parser.parse_args()
    calls: int = args.calls

    bare = _Bare().read
    gate = ThrottleGate("mqtt://127.0.0.1:1", "bench", max_hold_ms=3_600_000)
    released = per_call_ns(gate.should_throttle_prefills, calls)
    with gate._cond:  # noqa: SLF001 - a held state without a broker
        gate._set(GateState(connected=True, edgemon_online=True, throttle=True))  # noqa: SLF001
    assert gate.should_throttle_prefills()
    holding = per_call_ns(gate.should_throttle_prefills, calls)
    baseline = per_call_ns(bare, calls)
    print(f"bare method call        {baseline:8.1f} ns")
    print(f"gate, released          {released:8.1f} ns  ({released / baseline:.1f}x bare)")
    print(f"gate, holding           {holding:8.1f} ns  ({holding / baseline:.1f}x bare)")

    reporter = Reporter(
        "mqtt://127.0.0.1:1", "bench", max_buffered_events=1_000, max_streams=1
    )  # never opened: the buffer stays full, the oldest event is dropped per call
    chunk = per_call_ns(lambda: reporter.chunk("s", pcm_bytes=3_840), calls)
    event = {"type": "chunk", "stream": "s", "t_ms": time.time() * 1000, "seq": 7,
             "audio_ms": 80.0, "audio_total_ms": 560.0}  # fmt: skip
    encode = json.JSONEncoder(separators=(",", ":")).encode
    dumps = per_call_ns(lambda: encode(event), calls)
    print(f"JSON of the event       {dumps:8.1f} ns")
    print(f"Reporter.chunk          {chunk:8.1f} ns  ({chunk / dumps:.1f}x its JSON)")


if __name__ == "__main__":
    main()
