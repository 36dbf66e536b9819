"""Scrapes at fleet scale: /metrics and /api/v1/streams cost, and what they do to deadlines.

Run: `.venv/bin/python benchmarks/scrape.py [--quick]`. In one run, through one real Mosquitto
started here on a free loopback port and `python -m edgemon run` as a subprocess, with 10,000
live streams on 100 devices (each device's streams sent as one batch of chunk events: 10 min
of audio each, one in ten with an hour's ETA so that it is at risk), it measures and prints:
  1. `/metrics`: wall time per scrape over real HTTP (median, p90) and size. Target ≤ 10 ms.
  2. `/api/v1/streams`: the whole fleet (every page, following `next_cursor` where the daemon
     pages), one page, and one device (`?device=`): time and size.
  3. throttle onset lateness while `/metrics` is scraped back to back by another process: a
     probe device's stream is sent a chunk whose headroom crosses the margin 40-120 ms later;
     lateness is the arrival time of the throttle object (probe's wall clock) minus the `t_ms`
     in it (the device-clock instant of the change, on the probe's own clock). Target p99 ≤ 2
     ms. It is then split where it was spent (see below).
  4. the same with no scrapes and no other traffic ("quiet").
  5. the same under 1,000 chunk events/s from 64 streams of another device (one event per
     message, from another process).
In 3-5, where the daemon exports `edgemon_deadline_lateness_seconds` (docs/runbook.md: how late the
deadline task fired, without the MQTT hops), the transitions of that phase are summed from it
too, p50 and p99 given as the bucket bounds that hold them. Targets: deadline lateness p99
≤ 1 ms quiet, ≤ 2 ms under 1,000 events/s; onset lateness p99 ≤ 2 ms under scrapes.

An onset's lateness as the probe sees it includes about one MQTT round trip (the chunk's
trip to edgemon sets the device clock's offset, the throttle object's trip comes back), so
the run also measures the probe's own round trip through the broker (publish to a topic it
subscribes to) and prints it beside them: the floor no daemon can go below. And each phase
splits its onsets at two points edgemon reports (docs/protocol.md, docs/semantics.md):
- the transition is due on edgemon's clock at `t_ms` plus the probe device's clock offset
  (`edgemon_device_clock_offset_seconds`, read after the phase: the least one-way delay of
  the probe's messages to edgemon, which holds the probe's own publishing, the broker and
  edgemon's read; the offset only falls during a phase, so the last value overstates what
  follows it for the phase's earlier probes);
- edgemon queued the object for sending at its `seq` (wall-clock microseconds while changes
  are more than a microsecond apart, as the probe's are; edgemon's clock and the probe's are
  this machine's).
So "due → queued" is edgemon's own delay of the transition, which the README bounds by 2 ms
while `/metrics` is served (the SUMMARY's target for it), and "due → at the probe" is that
plus the object's way out (edgemon's send, the broker, the probe's client).

The probe is `Scale.probes` onsets a phase, so that the p99 is not simply the largest
(nearest rank: of 30 values the p99 is the 30th), after `WARM_UP` probes that are not
counted (a new device's first messages set its clock offset). The probe's client sets
`TCP_NODELAY`, as edgemon and Mosquitto do. Without it, a probe's message sent shortly after
the client's PUBACK of a throttle object waited for the broker's delayed ACK of that PUBACK
(Nagle's algorithm): 25 ms for the median chunk in a packet capture here, and the device
clock offset, the least delay over a minute, was 1.5-2.2 ms while scraped (0.55-0.85 ms
quiet) instead of 0.2 ms.

Before/after: run this same file from a checkout of the older tree (`python -m edgemon` is
started in the directory above this file, so it runs that tree's edgemon).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import queue
import random
import socket
import statistics
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _support import Edgemon, dumps, http_get, mosquitto, percentile, samples
from paho.mqtt import client as paho
from paho.mqtt.enums import CallbackAPIVersion

if TYPE_CHECKING:
    from multiprocessing.synchronize import Event as MpEvent

PREFIX = "edgemon/v1"
DEVICES = 100
STREAMS_PER_DEVICE = 100
MARGIN_MS = 80.0  # the default margin
#: Probes sent before the first phase, not counted: the device's first messages set its
#: clock offset, which falls to the least delay over the next few (then stays: 60 s window).
WARM_UP = 10
EDGEMON_CONFIG = "[slack]\nhysteresis_ms = 0\nmin_on_ms = 0\n"
MOSQUITTO_OPTIONS = "max_queued_messages 1000000\nset_tcp_nodelay true\n"


@dataclass(frozen=True, slots=True)
class Scale:
    """How much to measure."""

    scrapes: int
    probes: int


FULL = Scale(scrapes=60, probes=300)
QUICK = Scale(scrapes=20, probes=100)


def get(url: str) -> tuple[float, bytes]:
    """GET `url`: (wall seconds, body); raises unless 200."""
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as response:
        body: bytes = response.read()
        status = response.status
    elapsed = time.perf_counter() - started
    if status != 200:
        raise RuntimeError(f"{url} answered {status}")
    return elapsed, body


class Mqtt:
    """A paho client of the benchmark: publishes at QoS 1, collects throttle objects."""

    def __init__(self, port: int, client_id: str) -> None:
        self.received: queue.Queue[tuple[float, bytes]] = queue.Queue()
        self._acked = threading.Semaphore(0)
        ready = threading.Event()
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id)
        client.max_inflight_messages_set(1000)
        client.on_message = lambda _c, _u, message: self.received.put(
            (time.time() * 1000.0, bytes(message.payload))
        )
        client.on_publish = lambda *_: self._acked.release()
        client.on_subscribe = lambda *_: ready.set()
        client.connect("127.0.0.1", port)
        sock = client.socket()
        if isinstance(sock, socket.socket):  # no Nagle delay, as edgemon and Mosquitto do
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client.loop_start()
        self.client = client
        self._ready = ready

    def subscribe(self, topic: str) -> None:
        """Subscribe and wait for the acknowledgement."""
        self._ready.clear()
        self.client.subscribe(topic, qos=1)
        if not self._ready.wait(10):
            raise RuntimeError("not subscribed")

    def publish(self, topic: str, payload: bytes) -> None:
        """Publish and wait for the broker's PUBACK."""
        self.client.publish(topic, payload, qos=1)
        if not self._acked.acquire(timeout=30):
            raise RuntimeError("publish not acknowledged")

    def close(self) -> None:
        """Disconnect."""
        self.client.disconnect()
        self.client.loop_stop()


def load_fleet(mqtt: Mqtt) -> None:
    """10,000 live streams on 100 devices, one batch message per device."""
    now = time.time() * 1000.0
    for d in range(DEVICES):
        events = [
            {
                "type": "chunk",
                "stream": f"s{s}",
                "t_ms": round(now, 3),
                "seq": 0,
                "audio_ms": 600_000.0,
                "eta_ms": 3_600_000.0 if s % 10 == 0 else 1000.0,
            }
            for s in range(STREAMS_PER_DEVICE)
        ]
        mqtt.publish(f"{PREFIX}/fleet-{d:03d}/events", dumps(events))


def wait_streams(base: str, expected: int, timeout: float = 60) -> None:
    """Wait until /metrics counts `expected` active streams."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, text = http_get(f"{base}/metrics", 30)
        if status == 200 and sum(samples(text, "edgemon_streams_active").values()) >= expected:
            return
        time.sleep(0.2)
    raise RuntimeError(f"edgemon did not count {expected} streams")


def background_main(port: int, stop: MpEvent, rate: float, sent: Any) -> None:
    """Another process: chunk events of 64 streams of device `busy`, one per message at QoS 1,
    `rate` per second until `stop` (each stream gets more audio than it plays: no risk)."""
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id="bench-background")
    client.max_inflight_messages_set(1000)
    client.connect("127.0.0.1", port)
    client.loop_start()
    streams = 64
    seqs = [0] * streams
    step = 0.01  # a tick's worth of events every 10 ms
    per_tick = rate * step
    due = 0.0
    started = time.perf_counter()
    n = 0
    while not stop.is_set():
        due += per_tick
        while n < due:
            s = n % streams
            event = {
                "type": "chunk", "stream": f"b{s}", "t_ms": round(time.time() * 1000.0, 3),
                "seq": seqs[s], "audio_ms": 80.0, "eta_ms": 0.0,
            }  # fmt: skip
            seqs[s] += 1
            client.publish(f"{PREFIX}/busy/events", dumps(event), qos=1)
            n += 1
        time.sleep(max(0.0, started + (due / per_tick) * step - time.perf_counter()))
    with sent.get_lock():
        sent.value = n
    client.disconnect()
    client.loop_stop()


def round_trip(mqtt: Mqtt, port: int, count: int) -> list[float]:
    """MQTT round trips through the broker (ms): another client publishes, the probe's client
    receives (as a chunk goes out and a throttle object comes back)."""
    mqtt.subscribe("bench/echo")
    sender = Mqtt(port, "bench-echo")
    values = []
    for i in range(count):
        started = time.time() * 1000.0
        sender.publish("bench/echo", str(i).encode())
        while True:
            arrived, payload = mqtt.received.get(timeout=5)
            if payload == str(i).encode():
                break
        values.append(arrived - started)
        time.sleep(0.005)
    sender.close()
    return values


def scraper_main(url: str, stop: MpEvent, count: Any) -> None:
    """Another process: GET `url` back to back until `stop`; counts the scrapes."""
    while not stop.is_set():
        get(url)
        with count.get_lock():
            count.value += 1


@dataclass(frozen=True, slots=True)
class Onset:
    """One probe's onset: the object's `t_ms` and `seq`, and when it reached the probe (ms,
    the probe's wall clock)."""

    t_ms: float
    seq: int
    arrived_ms: float


@dataclass(frozen=True, slots=True)
class Onsets:
    """The throttle onsets of a phase's probes, and how many never came."""

    onsets: list[Onset]
    lost: int

    @property
    def values(self) -> list[float]:
        """Onset lateness as the probe sees it (ms): arrival minus `t_ms`."""
        return [o.arrived_ms - o.t_ms for o in self.onsets]

    def line(self) -> str:
        """p50, p99, max."""
        return f"{spread(self.values)} ({len(self.onsets)} probes, {self.lost} lost)"

    def queued(self, offset_ms: float) -> list[float]:
        """From the instant each change was due on edgemon's clock (`t_ms` plus the device's
        clock offset) to the object's `seq`, when edgemon queued it for sending (ms)."""
        return [o.seq / 1000.0 - o.t_ms - offset_ms for o in self.onsets]

    def arrived(self, offset_ms: float) -> list[float]:
        """From the instant each change was due on edgemon's clock to its arrival (ms)."""
        return [o.arrived_ms - o.t_ms - offset_ms for o in self.onsets]

    def split(self, offset_ms: float) -> str:
        """The phase's lateness split at the instant due and at `seq`."""
        return (
            f"device clock offset {offset_ms:.2f} ms (the probe's messages to edgemon)\n"
            f"  due on edgemon's clock → queued (seq): {spread(self.queued(offset_ms))}\n"
            f"  due on edgemon's clock → at the probe: {spread(self.arrived(offset_ms))}"
        )


def spread(values: list[float]) -> str:
    """p50, p99 and max of `values` (ms)."""
    return (
        f"p50 {percentile(values, 50):.2f} ms, p99 {percentile(values, 99):.2f} ms, "
        f"max {max(values, default=math.nan):.2f} ms"
    )


def probe_onsets(mqtt: Mqtt, device: str, probes: int, rng: random.Random) -> Onsets:
    """Each probe: a new stream whose headroom falls below the margin 40-120 ms after its
    first chunk; the throttle's onset; then the stream ends (throttle off)."""
    topic = f"{PREFIX}/{device}/events"
    onsets: list[Onset] = []
    lost = 0
    for i in range(probes):
        lead = rng.uniform(40.0, 120.0)
        t_ms = round(time.time() * 1000.0, 3)
        chunk = {
            "type": "chunk", "stream": f"p{i}", "t_ms": t_ms, "seq": 0,
            "audio_ms": round(MARGIN_MS + lead, 3), "eta_ms": 0.0,
        }  # fmt: skip
        mqtt.publish(topic, dumps(chunk))
        onset = wait_throttle(mqtt, active=True)
        if onset is None:
            lost += 1
        else:
            onsets.append(onset)
        end = {"type": "end", "stream": f"p{i}", "t_ms": round(time.time() * 1000.0, 3)}
        mqtt.publish(topic, dumps(end))
        wait_throttle(mqtt, active=False)
        time.sleep(rng.uniform(0.005, 0.03))
    return Onsets(onsets, lost)


def wait_throttle(mqtt: Mqtt, *, active: bool, timeout: float = 3.0) -> Onset | None:
    """The next throttle object saying `active`, as it arrived."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            arrived, payload = mqtt.received.get(timeout=left)
        except queue.Empty:
            break
        body = json.loads(payload)
        if body["throttle"] is active:
            return Onset(float(body["t_ms"]), int(body["seq"]), arrived)
    return None


def measure_metrics(base: str, scrapes: int) -> tuple[list[float], int]:
    """Wall ms per /metrics scrape, and the size of the last one."""
    times = []
    size = 0
    for _ in range(scrapes):
        elapsed, body = get(f"{base}/metrics")
        times.append(elapsed * 1000.0)
        size = len(body)
    return times, size


def measure_streams(base: str, scrapes: int) -> list[str]:
    """/api/v1/streams: the whole fleet page by page, the first page, one device."""
    lines = []
    whole: list[float] = []
    pages = 0
    total = 0
    streams = 0
    for _ in range(max(3, scrapes // 10)):
        cursor: str | None = None
        started = time.perf_counter()
        pages = total = streams = 0
        while True:
            query = "" if cursor is None else f"?cursor={cursor}"
            _, body = get(f"{base}/api/v1/streams{query}")
            pages += 1
            total += len(body)
            view = json.loads(body)
            streams += sum(len(device["streams"]) for device in view["devices"])
            cursor = view.get("next_cursor")
            if cursor is None:
                break
        whole.append((time.perf_counter() - started) * 1000.0)
    lines.append(
        f"  whole fleet: {streams:,} streams in {pages} page(s), {total / 1e6:.2f} MB, "
        f"median {statistics.median(whole):.1f} ms for all pages"
    )
    first = [get(f"{base}/api/v1/streams") for _ in range(scrapes)]
    lines.append(
        f"  one request (first page): median {statistics.median(t for t, _ in first) * 1000:.1f}"
        f" ms, p90 {percentile([t * 1000 for t, _ in first], 90):.1f} ms, "
        f"{len(first[-1][1]) / 1e6:.3f} MB"
    )
    one = [get(f"{base}/api/v1/streams?device=fleet-042") for _ in range(scrapes)]
    body = json.loads(one[-1][1])
    listed = sum(len(device["streams"]) for device in body["devices"])
    lines.append(
        f"  ?device=fleet-042: median {statistics.median(t for t, _ in one) * 1000:.1f} ms, "
        f"{len(one[-1][1]) / 1e3:.1f} kB, {len(body['devices'])} device(s), {listed} streams"
    )
    return lines


@dataclass(frozen=True, slots=True)
class Reading:
    """What a phase reads off `/metrics`: `edgemon_deadline_lateness_seconds` cumulative
    buckets by bound (ms; {} if absent), and the probe device's clock offset (ms)."""

    buckets: dict[float, float]
    offset_ms: float


def read_daemon(base: str) -> Reading:
    """One `/metrics` page's reading."""
    _, text = http_get(f"{base}/metrics", 30)
    buckets = samples(text, "edgemon_deadline_lateness_seconds_bucket")
    offsets = samples(text, "edgemon_device_clock_offset_seconds")
    return Reading(
        {float(labels.split('"')[1]) * 1000.0: n for labels, n in buckets.items()},
        offsets.get('device="probe"', math.nan) * 1000.0,
    )


def phase_lines(onsets: Onsets, before: Reading, after: Reading) -> str:
    """A phase's onsets, split at the instant due and at `seq`, and the deadline task's own
    lateness meanwhile."""
    return (
        f"  {onsets.line()}\n  {onsets.split(after.offset_ms)}\n"
        f"  {lateness_line(before.buckets, after.buckets)}"
    )


def lateness_line(before: dict[float, float], after: dict[float, float]) -> str:
    """The deadline task's own lateness between two readings: p50, p99 as bucket bounds."""
    if not after:
        return "edgemon_deadline_lateness_seconds: not exported"
    delta = {le: after[le] - before.get(le, 0.0) for le in sorted(after)}
    total = delta[math.inf]
    if not total:
        return "edgemon_deadline_lateness_seconds: no transitions"

    def bound(q: float) -> str:
        le = next(le for le, n in delta.items() if n >= q * total)
        return "> 1000 ms" if le == math.inf else f"≤ {le:g} ms"

    return (
        f"edgemon_deadline_lateness_seconds: {total:.0f} transitions, "
        f"p50 {bound(0.5)}, p99 {bound(0.99)}"
    )


def main() -> None:
    """Measure and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer scrapes and probes")
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    scale = QUICK if args.quick else FULL
    rng = random.Random(args.seed)
    load = os.getloadavg()
    print(f"edgemon scrape benchmark, {os.cpu_count()} CPUs, load average {load[0]:.2f}")
    with (
        tempfile.TemporaryDirectory(prefix="edgemon-bench-") as tmp,
        mosquitto(Path(tmp), options=MOSQUITTO_OPTIONS) as port,
    ):
        edgemon = Edgemon(Path(tmp), port, config=EDGEMON_CONFIG)
        base = f"http://127.0.0.1:{edgemon.http_port}"
        mqtt = Mqtt(port, "bench-scrape")
        stop = mp.Event()
        try:
            edgemon.ready()
            mqtt.subscribe(f"{PREFIX}/probe/throttle")
            load_fleet(mqtt)
            wait_streams(base, DEVICES * STREAMS_PER_DEVICE)
            print(f"{DEVICES * STREAMS_PER_DEVICE:,} live streams on {DEVICES} devices")

            times, size = measure_metrics(base, scale.scrapes)
            metrics_line = (
                f"median {statistics.median(times):.1f} ms, p90 {percentile(times, 90):.1f} ms,"
                f" {size / 1e6:.2f} MB"
            )
            print(f"\n1. /metrics, {scale.scrapes} scrapes\n  {metrics_line}")

            print("\n2. /api/v1/streams")
            for line in measure_streams(base, scale.scrapes):
                print(line)

            count = mp.Value("i", 0)
            scraper = mp.Process(target=scraper_main, args=(f"{base}/metrics", stop, count))
            scraper.start()
            time.sleep(0.5)
            probe_onsets(mqtt, "probe", WARM_UP, rng)  # the probe device's clock estimate settles
            started, count0 = time.perf_counter(), count.value
            before = read_daemon(base)
            busy = probe_onsets(mqtt, "probe", scale.probes, rng)
            busy_read = read_daemon(base)
            busy_hist = lateness_line(before.buckets, busy_read.buckets)
            rate = (count.value - count0) / (time.perf_counter() - started)
            stop.set()
            scraper.join(30)
            print(f"\n3. throttle onset lateness, /metrics scraped back to back ({rate:.0f}/s)")
            print(phase_lines(busy, before, busy_read))

            time.sleep(0.5)
            before = read_daemon(base)
            quiet = probe_onsets(mqtt, "probe", scale.probes, rng)
            after = read_daemon(base)
            quiet_hist = lateness_line(before.buckets, after.buckets)
            print("\n4. throttle onset lateness, quiet (no scrapes, no other traffic)")
            print(phase_lines(quiet, before, after))

            sent = mp.Value("i", 0)
            bg_stop = mp.Event()
            background = mp.Process(target=background_main, args=(port, bg_stop, 1000.0, sent))
            background.start()
            time.sleep(1.0)
            before = read_daemon(base)
            bg_started = time.perf_counter()
            loaded = probe_onsets(mqtt, "probe", scale.probes, rng)
            after = read_daemon(base)
            loaded_hist = lateness_line(before.buckets, after.buckets)
            bg_stop.set()
            background.join(30)
            bg_rate = sent.value / (time.perf_counter() - bg_started + 1.0)
            print(f"\n5. throttle onset lateness under {bg_rate:,.0f} events/s (64 streams)")
            print(phase_lines(loaded, before, after))

            trips = round_trip(mqtt, port, 50)
            floor = (
                f"probe → broker → probe p50 {percentile(trips, 50):.2f} ms, "
                f"p99 {percentile(trips, 99):.2f} ms"
            )
            print(f"\n6. the MQTT floor in every onset figure: {floor}")
        finally:
            stop.set()
            mqtt.close()
            code = edgemon.close()
    print("\nSUMMARY")
    print(f"  /metrics at 10,000 streams: {metrics_line}  target ≤ 10 ms")
    print(f"  deadline lateness quiet: {quiet_hist}  target p99 ≤ 1 ms")
    print(f"  deadline lateness under 1,000 events/s: {loaded_hist}  target p99 ≤ 2 ms")
    print(f"  onset lateness under back-to-back scrapes: {busy.line()}  target p99 ≤ 2 ms")
    print(f"    (deadline task: {busy_hist})")
    offset = busy_read.offset_ms
    print(
        "    edgemon's own delay, due on its clock → queued (seq):"
        f" {spread(busy.queued(offset))}  target p99 ≤ 2 ms"
    )
    print(
        f"    due on edgemon's clock → at the probe: {spread(busy.arrived(offset))};"
        f" device clock offset {offset:.2f} ms"
    )
    print(f"  onset lateness quiet: {quiet.line()}")
    print(f"  onset lateness under 1,000 events/s: {loaded.line()}")
    print(f"  the MQTT floor in the onset figures: {floor}")
    print(f"  edgemon exit code {code}; load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
