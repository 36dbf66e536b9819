"""Event decoding: msgspec (what edgemon runs) against pydantic-core, same payloads.

Run: `.venv/bin/python benchmarks/decode.py`. No broker. It measures msgspec's tagged
`Struct`s against pydantic-core, so that edgemon runs the faster. Both decoders here give one
verdict per event, and on these payloads the same verdicts (checked before timing):
  - edgemon's `decode_events` (msgspec: tagged structs, constraints in `msgspec.Meta`);
  - a pydantic decoder of the same events (`tests/pydantic_events.py`: discriminated union,
    strict JSON, Python predicates for stream ids and finite times);
on three loads: one chunk event per message, batches of 100 chunk events, and batches of 100
of which every tenth event is invalid (a negative `seq`). Prints events per CPU-second of each
(the best of 7 rounds, the two decoders taking turns) and the ratio msgspec ÷ pydantic.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from typing import TYPE_CHECKING

from _support import ROOT

sys.path.insert(0, str(ROOT / "tests"))

from edgemon.wire.decode import Problem, decode_events

from pydantic_events import old_decode

if TYPE_CHECKING:
    from collections.abc import Callable


def chunk(seq: int, stream: int) -> dict[str, object]:
    """A chunk event as a TTS player reports it (every optional field a Reporter fills)."""
    return {
        "type": "chunk",
        "stream": f"req-{stream:04d}.talker",
        "t_ms": 1_764_547_200_000.0 + seq * 80.0,
        "seq": seq,
        "audio_ms": 80.0,
        "eta_ms": 74.5,
        "audio_total_ms": 80.0 * (seq + 1),
    }


def loads(events: int) -> dict[str, list[bytes]]:
    """The three loads, `events` events each."""
    batches = events // 100

    def batch(first: int, *, bad: bool) -> bytes:
        items = [chunk(first + j, j % 64) for j in range(100)]
        if bad:
            for j in range(0, 100, 10):
                items[j]["seq"] = -1
        return json.dumps(items).encode()

    return {
        "one event per message": [json.dumps(chunk(i, i % 64)).encode() for i in range(events)],
        "batches of 100": [batch(i * 100, bad=False) for i in range(batches)],
        "batches of 100, 10 % invalid": [batch(i * 100, bad=True) for i in range(batches)],
    }


def edgemon_verdicts(payload: bytes) -> list[bool]:
    decoded = decode_events(payload, max_bytes=1 << 20, max_batch=1_000)
    assert not isinstance(decoded, Problem)
    return [not isinstance(item, Problem) for item in decoded]


def pydantic_verdicts(payload: bytes) -> list[bool]:
    decoded = old_decode(payload)
    assert decoded is not None
    return [item is not None for item in decoded]


def rates(
    decoders: dict[str, Callable[[bytes], object]], payloads: list[bytes], events: int
) -> dict[str, float]:
    """Events per CPU-second of each decoder: best of 7 rounds, the decoders taking turns."""
    best = dict.fromkeys(decoders, float("inf"))
    for _ in range(7):
        for name, decode in decoders.items():
            gc.collect()
            started = time.process_time()
            for payload in payloads:
                decode(payload)
            best[name] = min(best[name], time.process_time() - started)
    return {name: events / seconds for name, seconds in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000, help="events per load")
    events: int = parser.parse_args().events
    decoders: dict[str, Callable[[bytes], object]] = {
        "msgspec (edgemon)": lambda p: decode_events(p, max_bytes=1 << 20, max_batch=1_000),
        "pydantic-core (before)": old_decode,
    }
    print(f"{'load':30} {'msgspec ev/s':>14} {'pydantic ev/s':>14} {'ratio':>7}")
    for name, payloads in loads(events).items():
        for payload in payloads:
            assert edgemon_verdicts(payload) == pydantic_verdicts(payload), payload
        rate = rates(decoders, payloads, events)
        fast, slow = rate["msgspec (edgemon)"], rate["pydantic-core (before)"]
        print(f"{name:30} {fast:>14,.0f} {slow:>14,.0f} {fast / slow:>6.2f}×")


if __name__ == "__main__":
    main()
