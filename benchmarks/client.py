"""What the two ends of the loop cost their callers, per call, against baselines in the same run.

Run: `.venv/bin/python benchmarks/client.py`. No broker is needed: nothing here waits for
the network (a Reporter that was never opened checks and queues exactly as an open one does).
Prints nanoseconds per call and ratios:
  1. `ThrottleGate.should_throttle_prefills()` while released (the common case) and while
     holding, following one device and following every device (`+`) with 1,000 of them
     known, against a bare method call returning an attribute (the cheapest possible gate);
  2. `Reporter.chunk(pcm_bytes=...)` against encoding the same event object as JSON (what
     any reporter must at least do to put the event on the wire).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from typing import TYPE_CHECKING

from edgemon.client import DeviceThrottle, Reporter, ThrottleGate

if TYPE_CHECKING:
    from collections.abc import Callable


class _Bare:
    __slots__ = ("flag",)

    def __init__(self) -> None:
        self.flag = False

    def read(self) -> bool:
        return self.flag


def per_call_ns(
    named: dict[str, Callable[[], object]], calls: int, rounds: int = 7
) -> dict[str, float]:
    """Nanoseconds per call of each callable: the best of `rounds` runs of `calls` calls,
    the callables taking turns within each round (so load on the machine hits all alike)."""
    best = dict.fromkeys(named, float("inf"))
    for _ in range(rounds):
        for name, call in named.items():
            gc.disable()
            started = time.perf_counter_ns()
            for _ in range(calls):
                call()
            elapsed = time.perf_counter_ns() - started
            gc.enable()
            best[name] = min(best[name], elapsed / calls)
    return best


def _holding(device: str, devices: int) -> ThrottleGate:
    """A gate holding without a broker: connected, edgemon online, `devices` devices known of
    which the first is throttled (set as the network thread would)."""
    gate = ThrottleGate("mqtt://127.0.0.1:1", device, max_hold_ms=3_600_000)
    ids = [device] if devices == 1 else [f"dev-{i}" for i in range(devices)]
    heard = gate._heard  # noqa: SLF001 - a held state without a broker
    with heard.cond:
        heard.connected = heard.book.online = True
        for i, name in enumerate(ids):
            heard.book.put(name, DeviceThrottle(throttle=i == 0, seq=1))
        heard.refresh()
    return gate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100_000)
    args = parser.parse_args()
    calls: int = args.calls

    released = ThrottleGate("mqtt://127.0.0.1:1", "bench")
    holding = _holding("bench", 1)
    holding_many = _holding("+", 1_000)
    assert holding.should_throttle_prefills()
    assert holding_many.should_throttle_prefills()
    assert not released.should_throttle_prefills()

    reporter = Reporter(
        "mqtt://127.0.0.1:1",
        "bench",
        max_buffered_events=1_000,
        max_streams=1,
        audio_format="s16le:24000:1",
        merge_chunks=False,
    )  # no broker: the buffer stays full, the oldest chunk is dropped per call
    event = {"type": "chunk", "stream": "s", "t_ms": time.time() * 1000, "seq": 7,
             "audio_ms": 80.0, "audio_total_ms": 560.0}  # fmt: skip
    encode = json.JSONEncoder(separators=(",", ":")).encode

    ns = per_call_ns(
        {
            "bare": _Bare().read,
            "released": released.should_throttle_prefills,
            "holding": holding.should_throttle_prefills,
            "holding_many": holding_many.should_throttle_prefills,
            "json": lambda: encode(event),
            "chunk": lambda: reporter.chunk("s", pcm_bytes=3_840),
        },
        calls,
    )
    bare, json_ns = ns["bare"], ns["json"]
    print(f"bare method call        {bare:8.1f} ns")
    print(f"gate, released          {ns['released']:8.1f} ns  ({ns['released'] / bare:.1f}x bare)")
    print(f"gate, holding           {ns['holding']:8.1f} ns  ({ns['holding'] / bare:.1f}x bare)")
    many = ns["holding_many"]
    print(f"gate, holding, '+' with 1,000 devices {many:8.1f} ns  ({many / bare:.1f}x bare, "
          f"{many / ns['holding']:.2f}x one device)")  # fmt: skip
    print(f"JSON of the event       {json_ns:8.1f} ns")
    print(f"Reporter.chunk          {ns['chunk']:8.1f} ns  ({ns['chunk'] / json_ns:.1f}x its JSON)")


if __name__ == "__main__":
    main()
