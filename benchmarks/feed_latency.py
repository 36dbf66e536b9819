"""The slack feed's latency: a player's event → the feed that carries it, against the bare
delivery of the same event.
Run: `.venv/bin/python benchmarks/feed_latency.py [--quick]`. Through one real Mosquitto
started here on a free loopback port, `python -m edgemon run` as a subprocess (defaults: the
feed every 150 ms at most), and a background load of 1,000 streams (10 devices × 100 streams
× 12.5 chunks/s, batches of 25 chunk events) from ingest.py's load generator process, a probe
(one process, `time.perf_counter` at both ends, subscribed to its own events topic and to the
feed) publishes a new stream's start and first chunk, and times:
  - the bare delivery: the broker handing the probe its own message back;
  - the feed: the first object on `P/{device}/slack` that lists the new stream.
  a) on a quiet device (the probe's own): its first change goes out at once. Target: p99 of
     the feed ≤ 50 ms.
  b) on a busy device (one of the background's, 100 streams changing all the time): the feed
     is rate-limited to one per period, so it waits up to 150 ms by design.
The probes are 200–300 ms apart (beyond a period). Prints p50, p99 and max of each, and the
daemon's added latency (feed − bare delivery, probe by probe).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import tempfile
import threading
import time
from pathlib import Path

from _support import Edgemon, dumps, mosquitto, percentile
from ingest import EDGEMON_CONFIG, MOSQUITTO_OPTIONS, PREFIX, LoadGen, no_delay
from paho.mqtt import client as paho
from paho.mqtt.enums import CallbackAPIVersion

BACKGROUND = [f"fleet{i}" for i in range(10)]
STREAMS_PER_DEVICE = 100
BATCH = 25
EVENTS_PER_S = 12.5 * STREAMS_PER_DEVICE * len(BACKGROUND)


class FeedProbe:
    """Publishes probe streams and receives its own events and the feed of its device."""

    def __init__(self, port: int, device: str) -> None:
        self.device = device
        self.events = f"{PREFIX}/{device}/events"
        self.received: queue.Queue[tuple[float, str, bytes]] = queue.Queue()
        subscribed = threading.Event()
        client = paho.Client(
            CallbackAPIVersion.VERSION2, client_id=f"feed-probe-{device}", protocol=paho.MQTTv311
        )
        client.on_message = lambda _c, _u, m: self.received.put(
            (time.perf_counter(), m.topic, bytes(m.payload))
        )
        client.on_subscribe = lambda *_: subscribed.set()
        client.connect("127.0.0.1", port)
        no_delay(client)
        client.loop_start()
        client.subscribe([(self.events, 1), (f"{PREFIX}/{device}/slack", 0)])
        if not subscribed.wait(10):
            raise RuntimeError("probe: not subscribed")
        self._client = client
        self._n = 0

    def probe(self, timeout: float = 5.0) -> tuple[float, float] | None:
        """A new stream (the last one ended in the same message): ms to its bare delivery and
        to the first feed listing it; None if either did not come."""
        name, last = f"probe{self._n}", f"probe{self._n - 1}"
        t_ms = round(time.time() * 1000.0, 3)
        batch = [
            {"type": "start", "stream": name, "t_ms": t_ms},
            {"type": "chunk", "stream": name, "t_ms": t_ms, "seq": 0, "audio_ms": 2_000.0},
        ]
        if self._n:
            batch.insert(0, {"type": "end", "stream": last, "t_ms": t_ms})
        self._n += 1
        payload = dumps(batch)
        sent = time.perf_counter()
        self._client.publish(self.events, payload, qos=1)
        bare = feed = None
        deadline = sent + timeout
        while (bare is None or feed is None) and (left := deadline - time.perf_counter()) > 0:
            try:
                at, topic, body = self.received.get(timeout=left)
            except queue.Empty:
                break
            if topic == self.events:
                if body == payload:
                    bare = at
            elif feed is None and any(s["stream"] == name for s in json.loads(body)["streams"]):
                feed = at
        if bare is None or feed is None:
            return None
        return (bare - sent) * 1000.0, (feed - sent) * 1000.0

    def close(self) -> None:
        """Disconnect."""
        self._client.disconnect()
        self._client.loop_stop()


def measure(port: int, device: str, probes: int, rng: random.Random) -> str:
    """`probes` probes on `device`: the report lines."""
    probe = FeedProbe(port, device)
    bare, feed, added, lost = [], [], [], 0
    for _ in range(probes):
        got = probe.probe()
        if got is None:
            lost += 1
        else:
            bare.append(got[0])
            feed.append(got[1])
            added.append(got[1] - got[0])
        time.sleep(rng.uniform(0.2, 0.3))
    probe.close()

    def line(name: str, values: list[float]) -> str:
        return (
            f"    {name:<26} p50 {percentile(values, 50):7.2f} ms  p99 "
            f"{percentile(values, 99):7.2f} ms  max {max(values):7.2f} ms"
        )

    return "\n".join([
        f"  {len(feed)} probes, {lost} lost",
        line("bare delivery", bare),
        line("feed", feed),
        line("added by edgemon", added),
        f"    feed ÷ bare, p99: {percentile(feed, 99) / percentile(bare, 99):.1f}×",
    ])  # fmt: skip


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="50 probes per part, not 200")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    probes = 50 if args.quick else 200
    rng = random.Random(args.seed)
    load = os.getloadavg()[0]
    print(f"slack feed latency, {os.cpu_count()} CPUs, load average {load:.2f}")
    with (
        tempfile.TemporaryDirectory(prefix="edgemon-bench-") as tmp,
        mosquitto(Path(tmp), options=MOSQUITTO_OPTIONS) as port,
    ):
        edgemon = Edgemon(Path(tmp), port, config=EDGEMON_CONFIG)
        loadgen = LoadGen(port)
        try:
            loadgen.ready()
            edgemon.ready()
            loadgen.start(
                prefix=PREFIX, devices=BACKGROUND, streams=STREAMS_PER_DEVICE,
                rate=EVENTS_PER_S / BATCH, batch=BATCH, churn=True, seed=args.seed,
            )  # fmt: skip
            time.sleep(3.0)  # every background stream under way
            streams = len(BACKGROUND) * STREAMS_PER_DEVICE
            print(f"background: {EVENTS_PER_S:,.0f} chunk events/s, {streams:,} streams on "
                  f"{len(BACKGROUND)} devices")  # fmt: skip
            print("a) a quiet device")
            print(measure(port, "feedprobe", probes, rng))
            print(f"b) a busy device ({BACKGROUND[0]}, {STREAMS_PER_DEVICE} streams)")
            print(measure(port, BACKGROUND[0], probes, rng))
            loadgen.stop.set()
            sent = loadgen.result()
            print(f"background sent {sent['events']:,} events in {sent['seconds']:.1f} s "
                  f"({sent['events'] / sent['seconds']:,.0f}/s); edgemon CPU "
                  f"{edgemon.cpu():.1f} s")  # fmt: skip
        finally:
            loadgen.close()
            code = edgemon.close()
    print(f"edgemon exit code {code}")


if __name__ == "__main__":
    main()
