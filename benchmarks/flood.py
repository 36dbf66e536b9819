"""A QoS 1 flood against an unbounded broker queue: is every message the broker
accepted one chunk edgemon applied?

Run: `.venv/bin/python benchmarks/flood.py [--messages 20000] [--streams 1000] [--devices 10]`.
A real Mosquitto with `max_queued_messages 0` (no queue limit) on a free loopback port,
`python -m edgemon run` as a subprocess (defaults, state in a temporary directory), and one
paho publisher process sending `--messages` single-chunk QoS 1 messages as fast as it can,
round-robin over `--streams` streams on `--devices` devices (seq 0, 1, … per stream, each
chunk with `audio_total_ms`). Once the broker has acknowledged every message and edgemon has
counted as many, it prints what edgemon counted by result (`accepted`, `gap`, `overloaded`,
…) and `edgemon_chunks_total`: every message the broker accepted should be one chunk applied.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _support import Edgemon, http_get, mosquitto, samples

from flood_publisher import SCRIPT as FLOOD


def main() -> None:
    """Flood, wait, print the counts."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--streams", type=int, default=1_000)
    parser.add_argument("--devices", type=int, default=10)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="edgemon-flood-") as tmp,
        mosquitto(Path(tmp), options="max_queued_messages 0\n") as port,
    ):
        edgemon = Edgemon(Path(tmp), port)
        try:
            edgemon.ready()
            cpu0 = edgemon.cpu()
            publisher = subprocess.run(
                [sys.executable, FLOOD, str(port), "count", str(args.messages),
                 str(args.streams), str(args.devices), "flood-publisher"],
                capture_output=True, text=True, check=True, timeout=600,
            )  # fmt: skip
            sent = json.loads(publisher.stdout)
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                results = edgemon.results()
                if sum(results.values()) >= args.messages:
                    break
                time.sleep(0.2)
            cpu = edgemon.cpu() - cpu0
            _, text = http_get(f"http://127.0.0.1:{edgemon.http_port}/metrics")
        finally:
            code = edgemon.close()
    chunks = sum(samples(text, "edgemon_chunks_total").values())
    commits = samples(text, "edgemon_wal_commit_seconds_count").get("", 0.0)
    commit_s = samples(text, "edgemon_wal_commit_seconds_sum").get("", 0.0)
    counted = {k.partition('"')[2].rstrip('"'): int(v) for k, v in results.items()}
    print(
        f"flood: {args.messages:,} QoS 1 messages ({args.streams:,} streams on "
        f"{args.devices} devices), broker acknowledged {sent['acked']:,} in "
        f"{sent['seconds']:.1f} s"
    )
    print(f"  edgemon counted {counted}; {cpu:.1f} CPU s")
    print(
        f"  overloaded {counted.get('overloaded', 0):,}, gap {counted.get('gap', 0):,}, "
        f"chunks applied {chunks:,.0f} of {args.messages:,}; exit code {code}"
    )
    if commits:
        print(
            f"  write-ahead log: {commits:,.0f} group commits "
            f"({args.messages / commits:.1f} messages each), "
            f"{commit_s / commits * 1000:.2f} ms per commit on average"
        )


if __name__ == "__main__":
    main()
