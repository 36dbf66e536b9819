"""Ingest speed: edgemon's CPU per message, batch gain, throttle reaction time, edge-load cost.

Run: `.venv/bin/python benchmarks/ingest.py [--quick]`. In one run, through one real Mosquitto
started here on a free loopback port, with the load generator (paho-mqtt) in its own process
and `python -m edgemon run` as a subprocess, it measures and prints every ingest target (the
SUMMARY table) and a few more figures:
  1. edgemon's messages per CPU-second of its own process vs a bare aiomqtt subscriber
     process that only `json.loads` each message (same messages, QoS 1, same rate), and the
     ratio. Target ≥ 1.0. (1w) The same messages to a second edgemon with `[state] wal =
     false` (prefix `edgenow/v1`): with the write-ahead log / without. Target ≥ 0.9.
  2. batches of 100 chunk events: edgemon's events per CPU-second, as a multiple of the bare
     subscriber's single-message rate (part 1, same run). Target ≥ 12×.
  3. reaction latency: a probe (one process, `time.perf_counter` at both ends) publishes a
     chunk that puts its stream at risk, or safe again, and waits for the throttle object on
     `edgemon/v1/<dev>/throttle`, under a background load of 1,000 events/s from 64 streams of
     another device. p50, p99. Target p99 ≤ 5 ms. And (3b) the same with no other traffic.
  4. a realistic edge load, 64 streams × 12.5 chunks/s: edgemon's CPU time / wall time (% of
     one core) and its RSS at the end. Once with one chunk per message (4a, target ≤ 8 %),
     once with each 80 ms of chunks in one batch (4b, ≤ 2 %); RSS ≤ 80 MB. The bare
     subscriber decodes the same messages meanwhile, for comparison.
  5. the same load sent through the real `edgemon.client.Reporter` (one per device, default
     batching: `flush_ms` 5), driven in the load generator's process: edgemon's CPU % of one
     core. Target ≤ 1 %.
  6. the slack feed's cost: part 5's load sent to a third edgemon with `[mqtt] feed_ms = 0`
     (prefix `edgeoff/v1`), alternating with the first (feed on, the default) for `rounds`
     rounds: the difference of their CPU shares. Target ≤ 2 % of one core.

CPU time is utime + stime of the process from /proc, read before a phase and once the process
is idle again after it; each phase checks on `/metrics` (`edgemon_messages_total`) or with
the bare subscriber's own count that exactly the published messages were processed. The bare
subscriber listens under `baresub/v1`, a prefix as long as `edgemon/v1`, so both receive the
same bytes while the other idles; rounds alternate and each side's best round is kept.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import os
import queue
import random
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiomqtt
from _support import (
    Edgemon,
    JobProcess,
    Window,
    cpu_seconds,
    dumps,
    mosquitto,
    percentile,
    rss_bytes,
    scrape_cost,
)
from paho.mqtt import client as paho
from paho.mqtt.enums import CallbackAPIVersion

from edgemon.client import Reporter

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.synchronize import Event as MpEvent

PREFIX = "edgemon/v1"
BARE_PREFIX = "baresub/v1"  # as long as PREFIX: the same bytes on the wire
#: The second edgemon, with `[state] wal = false`: the write-ahead log's cost, same run.
NO_WAL_PREFIX = "edgenow/v1"
#: The third edgemon, with `[mqtt] feed_ms = 0`: the slack feed's cost, same run.
NO_FEED_PREFIX = "edgeoff/v1"
assert len(PREFIX) == len(BARE_PREFIX) == len(NO_WAL_PREFIX) == len(NO_FEED_PREFIX)
FIRST_AUDIO_MS = 300.0
#: Queues large enough that nothing is dropped; TCP_NODELAY on the broker's sockets, as a
#: latency-minded deployment sets it (without it each hop broker → client can add a 40 ms
#: delayed-ACK stall, which would measure the broker's configuration, not edgemon).
MOSQUITTO_OPTIONS = "max_queued_messages 1000000\nmax_inflight_messages 100\nset_tcp_nodelay true\n"
EDGE = "edge"  # the device of part 4
QUIET_PROBES = 60  # part 3b
#: Part 3 needs the throttle to follow risk at once (docs/semantics.md: both 0); the other parts do
#: not depend on them, and one edgemon serves the whole run.
EDGEMON_CONFIG = "[slack]\nhysteresis_ms = 0\nmin_on_ms = 0\n"
Json = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Scale:
    """How much of each part to run."""

    messages: int  # part 1, per round and side
    rounds: int
    rate: float  # part 1, messages/s
    batches: int  # part 2
    batch_rate: float  # part 2, batches/s
    probes: int  # part 3
    warm_s: float  # parts 3 and 4
    edge_s: float  # part 4


FULL = Scale(
    messages=24_000, rounds=3, rate=4000, batches=600, batch_rate=100, probes=300,
    warm_s=3.0, edge_s=20.0,
)  # fmt: skip
QUICK = Scale(
    messages=6_000, rounds=1, rate=4000, batches=300, batch_rate=100, probes=200,
    warm_s=1.5, edge_s=8.0,
)  # fmt: skip


def no_delay(client: paho.Client) -> None:
    """TCP_NODELAY: each publish leaves at once, as from many devices (and the probe's
    publish does not wait behind its previous PUBACK for a delayed ACK: Nagle's algorithm)."""
    sock = client.socket()
    assert isinstance(sock, socket.socket)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


# ---------------------------------------------------------------------------- chunk events
class Fleet:
    """The streams of one device, served round-robin: valid chunk events of docs/protocol.md.

    Each stream starts with a 300 ms chunk, then brings 5-50 % more audio per chunk than the
    time between its chunks (`gap_ms`), with an `eta_ms` within 10 % of that gap: healthy
    streams, as on a box that keeps up. With `churn`, a stream lasts 30-150 chunks, its last
    one `final`, and a new stream takes its place.
    """

    def __init__(
        self, topic: str, streams: int, gap_ms: float, rng: random.Random, *, churn: bool
    ) -> None:
        self.topic = topic
        self._gap = gap_ms
        self._rng = rng
        self._churn = churn
        self._names = [f"s{i}.0" for i in range(streams)]
        self._seq = [0] * streams
        self._left = [self._life() for _ in range(streams)]
        self._next = 0

    def _life(self) -> int:
        return self._rng.randint(30, 150) if self._churn else -1

    def chunk(self, t_ms: float) -> Json:
        """The next chunk event, of the next stream in turn, that reached its player at t_ms."""
        i = self._next
        self._next = (i + 1) % len(self._names)
        rng, gap, seq = self._rng, self._gap, self._seq[i]
        event: Json = {
            "type": "chunk",
            "stream": self._names[i],
            "t_ms": round(t_ms, 3),
            "seq": seq,
            "audio_ms": FIRST_AUDIO_MS if seq == 0 else round(gap * rng.uniform(1.05, 1.5), 1),
            "eta_ms": round(gap * rng.uniform(0.9, 1.1), 1),
        }
        self._left[i] -= 1
        if self._left[i] == 0:
            event["final"] = True
            name, _, generation = self._names[i].rpartition(".")
            self._names[i] = f"{name}.{int(generation) + 1}"
            self._seq[i] = 0
            self._left[i] = self._life()
        else:
            self._seq[i] = seq + 1
        return event

    def ends(self, t_ms: float) -> list[Json]:
        """`end` events for every stream that has begun."""
        return [
            {"type": "end", "stream": name, "t_ms": round(t_ms, 3), "reason": "completed"}
            for name, seq in zip(self._names, self._seq, strict=True)
            if seq > 0
        ]


# ---------------------------------------------------------------------------- load generator
class _Publisher:
    """The load generator's side: one paho client publishing at QoS 1, counting the acks."""

    def __init__(self, port: int, stop_flag: MpEvent) -> None:
        self._port = port
        self._stop = stop_flag
        self._acked = 0
        self._sent = 0
        self._cond = threading.Condition()
        self.fleets: list[Fleet] = []
        client = paho.Client(
            CallbackAPIVersion.VERSION2, client_id="bench-loadgen", protocol=paho.MQTTv311
        )
        client.max_inflight_messages_set(1000)
        client.on_publish = self._on_publish
        connected = threading.Event()
        client.on_connect = lambda *_: connected.set()
        client.connect("127.0.0.1", port)
        no_delay(client)
        client.loop_start()
        if not connected.wait(10):
            raise RuntimeError("load generator: no connection to the broker")
        self._client = client

    def _on_publish(self, *_: object) -> None:
        with self._cond:
            self._acked += 1
            self._cond.notify_all()

    def _publish(self, topic: str, payload: bytes) -> None:
        self._client.publish(topic, payload, qos=1)
        self._sent += 1

    def _wait_acked(self) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self._acked >= self._sent, timeout=60):
                raise RuntimeError("load generator: the broker did not acknowledge everything")

    def run(self, job: Json) -> Json:
        """Do one job; what was sent."""
        kind = job["kind"]
        if kind == "end":
            return self._end()
        if kind == "reporter":
            return self._reporter(job)
        rng = random.Random(job["seed"])
        devices = job["devices"]
        streams = job["streams"]
        batch = job["batch"]
        events_per_s = job["rate"] * batch
        gap_ms = streams * len(devices) * 1000.0 / events_per_s
        self.fleets = [
            Fleet(f"{job['prefix']}/{device}/events", streams, gap_ms, rng, churn=job["churn"])
            for device in devices
        ]
        return self._paced(job["rate"], job["messages"], job["seconds"], batch, 1000 / events_per_s)

    def _paced(
        self, rate: float, messages: int, seconds: float, batch: int, spacing_ms: float
    ) -> Json:
        fleets = self.fleets
        start = time.perf_counter()
        sent = 0
        while sent < messages and not (sent % 50 == 0 and self._stop.is_set()):
            due = start + sent / rate
            now = time.perf_counter()
            if now - start > seconds:
                break
            if due > now:
                time.sleep(due - now)
            fleet = fleets[sent % len(fleets)]
            wall_ms = time.time() * 1000.0
            if batch == 1:
                payload = dumps(fleet.chunk(wall_ms))
            else:
                payload = dumps(
                    [fleet.chunk(wall_ms - (batch - 1 - k) * spacing_ms) for k in range(batch)]
                )
            self._publish(fleet.topic, payload)
            sent += 1
        elapsed = time.perf_counter() - start
        self._wait_acked()
        return {"messages": sent, "events": sent * batch, "seconds": elapsed}

    def _reporter(self, job: Json) -> Json:
        """Chunks of `streams` streams on each device, through one real Reporter per device
        (default settings), `rate` chunks/s in all, until stopped; then every stream ends."""
        rng = random.Random(job["seed"])
        devices, streams, rate = job["devices"], job["streams"], job["rate"]
        gap_ms = streams * len(devices) * 1000.0 / rate
        reporters = [
            Reporter(
                f"mqtt://127.0.0.1:{self._port}", device, topic_prefix=job["prefix"],
                client_id=f"bench-reporter-{device}",
            ).open()
            for device in devices
        ]  # fmt: skip
        names = [[f"r{i}.0" for i in range(streams)] for _ in devices]
        seqs = [[0] * streams for _ in devices]
        start = time.perf_counter()
        sent = 0
        while not (sent % 50 == 0 and self._stop.is_set()):
            due = start + sent / rate
            now = time.perf_counter()
            if now - start > job["seconds"]:
                break
            if due > now:
                time.sleep(due - now)
            d, i = sent % len(devices), (sent // len(devices)) % streams
            seq = seqs[d][i]
            final = seq >= 30 and rng.random() < 1 / 90  # streams of ~30-150 chunks
            reporters[d].chunk(
                names[d][i],
                audio_ms=FIRST_AUDIO_MS if seq == 0 else round(gap_ms * rng.uniform(1.05, 1.5), 1),
                eta_ms=round(gap_ms * rng.uniform(0.9, 1.1), 1),
                final=final,
            )
            if final:
                name, _, generation = names[d][i].rpartition(".")
                names[d][i] = f"{name}.{int(generation) + 1}"
                seqs[d][i] = 0
            else:
                seqs[d][i] = seq + 1
            sent += 1
        elapsed = time.perf_counter() - start
        for d, reporter in enumerate(reporters):
            for name, seq in zip(names[d], seqs[d], strict=True):
                if seq:
                    reporter.end(name)
            if not reporter.flush(30):
                raise RuntimeError("load generator: a Reporter did not flush")
        stats = [reporter.stats for reporter in reporters]
        for reporter in reporters:
            reporter.close()
        return {
            "messages": sum(s.messages for s in stats),
            "events": sum(s.sent for s in stats),
            "chunks": sent,
            "dropped": sum(s.dropped for s in stats),
            "seconds": elapsed,
        }

    def _end(self) -> Json:
        events = 0
        for fleet in self.fleets:
            ends = fleet.ends(time.time() * 1000.0)
            if ends:
                self._publish(fleet.topic, dumps(ends))
                events += len(ends)
        self._wait_acked()
        return {"events": events}


def loadgen_main(port: int, conn: Connection, stop_flag: MpEvent) -> None:
    """The load generator process: jobs in over `conn`, results out; `None` ends it."""
    publisher = _Publisher(port, stop_flag)
    conn.send("ready")
    while (job := conn.recv()) is not None:
        conn.send(publisher.run(job))


class LoadGen(JobProcess):
    """The main process's handle on the load generator process."""

    def __init__(self, port: int) -> None:
        super().__init__(loadgen_main, port, name="loadgen")

    def start(self, **job: Any) -> None:
        """Begin a job: kind burst/load (prefix, devices, streams, rate, messages, seconds,
        batch, seed, churn) or end (the streams of the last job)."""
        defaults = {"kind": "burst", "batch": 1, "churn": False, "messages": 10**9, "seconds": 1e9}
        self.send(defaults | job)

    def result(self, timeout: float = 120) -> Json:
        """Wait for the job to finish: what it sent."""
        result: Json = super().result(timeout)
        return result

    def run(self, **job: Any) -> Json:
        """Do a job and wait for it."""
        self.start(**job)
        return self.result()


def _expect(conn: Connection, what: str, timeout: float) -> None:
    if not conn.poll(timeout) or conn.recv() != what:
        raise RuntimeError(f"expected {what!r} from a child process")


# ---------------------------------------------------------------------------- bare subscriber
class _Counter:
    __slots__ = ("conn", "count", "target")

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.count = 0
        self.target = -1

    def command(self) -> None:
        self.target = self.conn.recv()
        if 0 <= self.target <= self.count:
            self.conn.send(self.count)


async def _bare(port: int, conn: Connection) -> None:
    counter = _Counter(conn)
    loads = json.loads
    async with aiomqtt.Client("127.0.0.1", port, identifier="bench-bare") as client:
        # Part 4 gives both the same messages at once: a baseline at the same load.
        await client.subscribe([(f"{BARE_PREFIX}/+/events", 1), (f"{PREFIX}/{EDGE}/events", 1)])
        asyncio.get_running_loop().add_reader(conn.fileno(), counter.command)
        conn.send("ready")
        async for message in client.messages:
            loads(message.payload)
            counter.count += 1
            if counter.count == counter.target:
                conn.send(counter.count)


def bare_main(port: int, conn: Connection) -> None:
    """The bare subscriber process: counts what it decodes; tells `conn` when it reaches the
    target the main process sent."""
    asyncio.run(_bare(port, conn))


class Bare:
    """The main process's handle on the bare subscriber."""

    def __init__(self, port: int) -> None:
        context = mp.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=bare_main, args=(port, child), name="bare", daemon=True
        )
        self._process.start()
        self.count = 0

    @property
    def pid(self) -> int:
        """Its process id."""
        assert self._process.pid is not None
        return self._process.pid

    def ready(self) -> None:
        """Wait until it is subscribed."""
        _expect(self._conn, "ready", 30)

    def expect(self, messages: int) -> None:
        """Report once `messages` more have been decoded."""
        self.count += messages
        self._conn.send(self.count)

    def wait(self, timeout: float = 60) -> None:
        """Wait for that report."""
        if not self._conn.poll(timeout):
            raise RuntimeError("bare subscriber: messages missing")
        got = self._conn.recv()
        assert got == self.count, (got, self.count)

    def close(self) -> None:
        """End the process."""
        self._process.terminate()
        self._process.join(10)


# ---------------------------------------------------------------------------- parts
@dataclass(frozen=True, slots=True)
class Single:
    """Part 1: messages per CPU-second, each side's best round."""

    bare_rate: float
    edgemon_rate: float
    no_wal_rate: float
    rounds: list[str]

    @property
    def ratio(self) -> float:
        """edgemon / bare."""
        return self.edgemon_rate / self.bare_rate

    @property
    def wal_ratio(self) -> float:
        """edgemon with its write-ahead log / edgemon without."""
        return self.edgemon_rate / self.no_wal_rate


def part_single(
    scale: Scale,
    loadgen: LoadGen,
    bare: Bare,
    edgemon: Edgemon,
    no_wal: Edgemon,
    scrape_cpu: float,
    seed: int,
) -> Single:
    """Part 1: the same messages (4 devices × 64 streams) to the bare subscriber, then edgemon
    (write-ahead log on, the default), then edgemon with `[state] wal = false`."""
    n = scale.messages
    job = {"streams": 64, "rate": scale.rate, "messages": n}
    bare_rates: list[float] = []
    edgemon_rates: list[float] = []
    no_wal_rates: list[float] = []
    lines: list[str] = []
    for r in range(scale.rounds):
        devices = [f"single-r{r}-d{d}" for d in range(4)]
        bare.expect(n)
        time.sleep(0.05)
        cpu0 = cpu_seconds(bare.pid)
        sent = loadgen.run(**job, prefix=BARE_PREFIX, devices=devices, seed=seed + r)
        bare.wait()
        time.sleep(0.05)
        bare_cpu = cpu_seconds(bare.pid) - cpu0
        bare_rates.append(n / bare_cpu)
        lines.append(
            f"  round {r + 1} bare:    {n:,} messages, {bare_cpu:.2f} CPU s, "
            f"{n / bare_cpu:,.0f} msg/CPU-s  (sent at {sent['messages'] / sent['seconds']:,.0f}/s)"
        )

        window = Window(edgemon, scrape_cpu)
        window.open()
        sent = loadgen.run(**job, prefix=PREFIX, devices=devices, seed=seed + r)
        cpu, accepted = window.close(n)
        _check(accepted, n, "part 1")
        edgemon_rates.append(n / cpu)
        lines.append(
            f"  round {r + 1} edgemon: {n:,} messages, {cpu:.2f} CPU s, "
            f"{n / cpu:,.0f} msg/CPU-s  (sent at {sent['messages'] / sent['seconds']:,.0f}/s, "
            f"{accepted:,.0f} accepted)"
        )
        _end_streams(loadgen, edgemon, scrape_cpu)

        window = Window(no_wal, scrape_cpu)
        window.open()
        sent = loadgen.run(**job, prefix=NO_WAL_PREFIX, devices=devices, seed=seed + r)
        cpu, accepted = window.close(n)
        _check(accepted, n, "part 1, no log")
        no_wal_rates.append(n / cpu)
        lines.append(
            f"  round {r + 1} edgemon without its log: {n:,} messages, {cpu:.2f} CPU s, "
            f"{n / cpu:,.0f} msg/CPU-s  (sent at {sent['messages'] / sent['seconds']:,.0f}/s)"
        )
        _end_streams(loadgen, no_wal, scrape_cpu)
    return Single(max(bare_rates), max(edgemon_rates), max(no_wal_rates), lines)


def part_batched(
    scale: Scale, loadgen: LoadGen, edgemon: Edgemon, scrape_cpu: float, seed: int
) -> tuple[float, str]:
    """Part 2: arrays of 100 chunk events (4 devices × 64 streams): events per CPU-second."""
    devices = [f"batch-d{d}" for d in range(4)]
    window = Window(edgemon, scrape_cpu)
    window.open()
    sent = loadgen.run(
        prefix=PREFIX, devices=devices, streams=64, rate=scale.batch_rate,
        messages=scale.batches, batch=100, seed=seed + 100,
    )  # fmt: skip
    events = sent["events"]
    cpu, accepted = window.close(events)
    _check(accepted, events, "part 2")
    _end_streams(loadgen, edgemon, scrape_cpu)
    line = (
        f"  {sent['messages']:,} batches × 100 = {events:,} events, {cpu:.2f} CPU s, "
        f"{events / cpu:,.0f} events/CPU-s  (sent at {events / sent['seconds']:,.0f} events/s)"
    )
    return events / cpu, line


class Probe:
    """Publishes probe chunks and receives the throttle objects of its device (one process)."""

    def __init__(self, port: int, device: str) -> None:
        self.device = device
        self.topic = f"{PREFIX}/{device}/events"
        self.received: queue.Queue[tuple[float, bytes]] = queue.Queue()
        subscribed = threading.Event()
        client = paho.Client(
            CallbackAPIVersion.VERSION2, client_id="bench-probe", protocol=paho.MQTTv311
        )
        client.on_message = lambda _c, _u, message: self.received.put(
            (time.perf_counter(), bytes(message.payload))
        )
        client.on_subscribe = lambda *_: subscribed.set()
        client.connect("127.0.0.1", port)
        no_delay(client)
        client.loop_start()
        client.subscribe(f"{PREFIX}/{device}/throttle", qos=1)
        if not subscribed.wait(10):
            raise RuntimeError("probe: not subscribed")
        self._client = client
        self._seq = 0

    def send(self, *, audio_ms: float, eta_ms: float) -> float:
        """Publish the next chunk of the probe stream; when (perf_counter) it was handed over."""
        payload = dumps({
            "type": "chunk", "stream": "probe", "t_ms": round(time.time() * 1000.0, 3),
            "seq": self._seq, "audio_ms": audio_ms, "eta_ms": eta_ms,
        })  # fmt: skip
        self._seq += 1
        sent = time.perf_counter()
        self._client.publish(self.topic, payload, qos=1)
        return sent

    def wait_for(self, active: bool, timeout: float = 2.0) -> float | None:
        """When the throttle object saying `active` arrived (perf_counter), None if not."""
        deadline = time.perf_counter() + timeout
        while (left := deadline - time.perf_counter()) > 0:
            try:
                at, payload = self.received.get(timeout=left)
            except queue.Empty:
                break
            if json.loads(payload)["throttle"] is active:
                return at
        return None

    def close(self) -> None:
        """Disconnect."""
        self._client.disconnect()
        self._client.loop_stop()


@dataclass(frozen=True, slots=True)
class Latency:
    """Part 3: milliseconds from publishing a probe chunk to receiving the throttle object."""

    values: list[float]
    lost: int
    context: str

    @property
    def line(self) -> str:
        """The report."""
        return (
            f"{self.context}\n  {len(self.values)} received, {self.lost} lost; "
            f"p50 {self.p50:.2f} ms, p99 {self.p99:.2f} ms, "
            f"max {max(self.values, default=math.nan):.2f} ms"
        )

    @property
    def p50(self) -> float:
        """Median."""
        return percentile(self.values, 50)

    @property
    def p99(self) -> float:
        """99th percentile."""
        return percentile(self.values, 99)

    @property
    def met(self) -> bool:
        """The target: p99 ≤ 5 ms, nothing lost."""
        return self.p99 <= 5.0 and self.lost == 0

    @property
    def figure(self) -> str:
        """p99 and p50."""
        return f"{self.p99:.2f} ms (p50 {self.p50:.2f})"


def part_latency(
    scale: Scale, loadgen: LoadGen, port: int, seed: int, *, probes: int, background: bool
) -> Latency:
    """Part 3: publish → throttle object, alternating at risk / safe, `probes` times, with or
    without 1,000 events/s from 64 streams of another device meanwhile."""
    rng = random.Random(seed + 200 + background)
    if background:
        loadgen.start(
            prefix=PREFIX, devices=["background"], streams=64, rate=1000.0, churn=True,
            seed=seed + 300,
        )  # fmt: skip
    probe = Probe(port, "probe" if background else "probe-quiet")
    time.sleep(scale.warm_s)
    # A long first chunk (30 s of audio): the stream is safe with eta 0, and at risk at once
    # with an eta of an hour (headroom = slack − eta < margin).
    probe.send(audio_ms=30_000.0, eta_ms=0.0)
    time.sleep(0.2)
    latencies: list[float] = []
    lost = 0
    for i in range(probes):
        at_risk = i % 2 == 0
        sent = probe.send(audio_ms=40.0, eta_ms=3_600_000.0 if at_risk else 0.0)
        arrived = probe.wait_for(at_risk)
        if arrived is None:
            lost += 1
        else:
            latencies.append((arrived - sent) * 1000.0)
        time.sleep(rng.uniform(0.005, 0.02))
    probe.close()
    line = "  no other traffic"
    if background:
        loadgen.stop.set()
        sent_bg = loadgen.result()
        _end_streams(loadgen, None, 0.0)
        line = (
            f"  background: {sent_bg['events']:,} events in {sent_bg['seconds']:.1f} s "
            f"({sent_bg['events'] / sent_bg['seconds']:,.0f}/s, 64 streams)"
        )
    return Latency(latencies, lost, line)


@dataclass(frozen=True, slots=True)
class Edge:
    """Part 4: edgemon's and the bare subscriber's CPU share, edgemon's RSS, a report line."""

    share: float
    bare_share: float
    rss: int
    line: str

    @property
    def figure(self) -> str:
        """edgemon's share, and the bare subscriber's for comparison."""
        return f"{self.share:.2f} % (bare {self.bare_share:.2f} %)"


def idle_share(edgemon: Edgemon, seconds: float) -> float:
    """edgemon's CPU share (% of one core) with no traffic."""
    cpu0, wall0 = edgemon.cpu(), time.perf_counter()
    time.sleep(seconds)
    return (edgemon.cpu() - cpu0) / (time.perf_counter() - wall0) * 100.0


@dataclass(frozen=True, slots=True)
class Shares:
    """One measuring window of a steady load: CPU shares, RSS, what edgemon counted."""

    share: float
    bare_share: float
    rss: int
    counted_per_s: float
    cpu_s: float
    wall_s: float
    sent: Json

    def cpu_line(self) -> str:
        """The window's CPU and the two shares."""
        return (
            f"{self.cpu_s:.2f} CPU s in {self.wall_s:.1f} s wall\n"
            f"  edgemon CPU {self.share:.2f} % of one core (bare subscriber, same messages: "
            f"{self.bare_share:.2f} %)"
        )


def measure_shares(scale: Scale, loadgen: LoadGen, edgemon: Edgemon, bare: Bare) -> Shares:
    """With a load started: warm up, then edgemon's and the bare subscriber's CPU % of one
    core over `scale.edge_s`; the load is stopped and its report taken."""
    time.sleep(scale.warm_s)
    total0 = sum(edgemon.results().values())
    cpu0, bare0, wall0 = edgemon.cpu(), cpu_seconds(bare.pid), time.perf_counter()
    time.sleep(scale.edge_s)
    cpu1, bare1, wall1 = edgemon.cpu(), cpu_seconds(bare.pid), time.perf_counter()
    rss = rss_bytes(edgemon.pid)
    total1 = sum(edgemon.results().values())
    loadgen.stop.set()
    sent = loadgen.result()
    wall = wall1 - wall0
    return Shares(
        share=(cpu1 - cpu0) / wall * 100.0,
        bare_share=(bare1 - bare0) / wall * 100.0,
        rss=rss,
        counted_per_s=(total1 - total0) / wall,
        cpu_s=cpu1 - cpu0,
        wall_s=wall,
        sent=sent,
    )


def part_edge(
    scale: Scale, loadgen: LoadGen, edgemon: Edgemon, bare: Bare, seed: int, *, batch: int
) -> Edge:
    """Part 4: 64 streams × 12.5 chunks/s on one device, one chunk per message (`batch` 1) or
    the chunks of 80 ms per message (`batch` 64, 12.5 messages/s); CPU % of one core over the
    window, RSS at its end.

    The bare subscriber decodes the same messages meanwhile: its share is what a Python MQTT
    client that does nothing else pays for this message rate.
    """
    loadgen.start(
        prefix=PREFIX, devices=[EDGE], streams=64, rate=800.0 / batch, batch=batch,
        churn=True, seed=seed + 400 + batch,
    )  # fmt: skip
    m = measure_shares(scale, loadgen, edgemon, bare)
    _end_streams(loadgen, None, 0.0)
    sent = m.sent
    line = (
        f"  {sent['messages'] / sent['seconds']:,.1f} messages/s sent, "
        f"{m.counted_per_s:,.0f} events/s counted by edgemon; {m.cpu_line()}, "
        f"RSS {m.rss / 2**20:.1f} MiB"
    )
    return Edge(m.share, m.bare_share, m.rss, line)


def part_reporter(
    scale: Scale, loadgen: LoadGen, edgemon: Edgemon, bare: Bare, seed: int, prefix: str = PREFIX
) -> Edge:
    """Part 5: the edge load of part 4 through real Reporters (default batching): edgemon's
    CPU % of one core; the bare subscriber decodes the same batches meanwhile (under
    `PREFIX` only)."""
    loadgen.start(
        kind="reporter", prefix=prefix, devices=[EDGE], streams=64, rate=800.0, seed=seed + 500
    )
    m = measure_shares(scale, loadgen, edgemon, bare)
    sent = m.sent
    line = (
        f"  {sent['chunks'] / sent['seconds']:,.1f} chunks/s reported in "
        f"{sent['messages'] / sent['seconds']:,.1f} messages/s "
        f"({sent['events'] / max(sent['messages'], 1):.1f} events per message, "
        f"{sent['dropped']} dropped); {m.counted_per_s:,.0f} events/s counted by "
        f"edgemon; {m.cpu_line()}"
    )
    return Edge(m.share, m.bare_share, m.rss, line)


def part_feed(
    scale: Scale, loadgen: LoadGen, edgemon: Edgemon, no_feed: Edgemon, bare: Bare, seed: int
) -> tuple[float, str]:
    """Part 6: part 5's load on `edgemon` (the feed on) and on `no_feed` (`feed_ms = 0`),
    alternating for `scale.rounds` rounds; the mean difference of their CPU shares."""
    lines, differences = [], []
    for r in range(scale.rounds):
        on = part_reporter(scale, loadgen, edgemon, bare, seed + 10 * r)
        _end_streams(loadgen, None, 0.0)
        off = part_reporter(scale, loadgen, no_feed, bare, seed + 10 * r, prefix=NO_FEED_PREFIX)
        _end_streams(loadgen, None, 0.0)
        differences.append(on.share - off.share)
        lines.append(
            f"  round {r + 1}: feed on {on.share:.2f} %, off {off.share:.2f} % of one core: "
            f"{differences[-1]:+.2f}"
        )
    return sum(differences) / len(differences), "\n".join(lines)


def _check(accepted: float, expected: int, part: str) -> None:
    if accepted != expected:
        print(f"  WARNING {part}: {accepted:,.0f} accepted of {expected:,} sent")


def _end_streams(loadgen: LoadGen, edgemon: Edgemon | None, scrape_cpu: float) -> None:
    """End the streams of the last job, so their timers do not fire during later parts."""
    if edgemon is None:
        loadgen.run(kind="end")
        return
    window = Window(edgemon, scrape_cpu)
    window.open()
    ended = loadgen.run(kind="end")
    window.close(ended["events"])


def verdict(ok: bool) -> str:
    """met / NOT MET."""
    return "met" if ok else "NOT MET"


# ---------------------------------------------------------------------------- main
def main() -> None:
    """Measure and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a smaller, shorter run")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="FILE",
        help="run edgemon under cProfile and write its stats to FILE (figures are then inflated)",
    )
    args = parser.parse_args()
    scale = QUICK if args.quick else FULL
    seed = args.seed
    started = time.perf_counter()
    load_before = os.getloadavg()
    print(f"edgemon ingest benchmark ({'quick' if args.quick else 'full'}), "
          f"{os.cpu_count()} CPUs, load average {load_before[0]:.2f} {load_before[1]:.2f} "
          f"{load_before[2]:.2f}")  # fmt: skip

    with (
        tempfile.TemporaryDirectory(prefix="edgemon-bench-") as tmp,
        mosquitto(Path(tmp), options=MOSQUITTO_OPTIONS) as port,
    ):
        directory = Path(tmp)
        edgemon = Edgemon(
            directory, port, config=EDGEMON_CONFIG, profile=args.profile and args.profile.resolve()
        )
        (directory / "no-wal").mkdir()
        no_wal = Edgemon(
            directory / "no-wal",
            port,
            config="wal = false\n" + EDGEMON_CONFIG,
            mqtt=f'topic_prefix = "{NO_WAL_PREFIX}"\n',
            client_id="edgemon-bench-no-wal",
        )
        (directory / "no-feed").mkdir()
        no_feed = Edgemon(
            directory / "no-feed",
            port,
            config=EDGEMON_CONFIG,
            mqtt=f'topic_prefix = "{NO_FEED_PREFIX}"\nfeed_ms = 0\n',
            client_id="edgemon-bench-no-feed",
        )
        loadgen = LoadGen(port)
        bare = Bare(port)
        try:
            loadgen.ready()
            bare.ready()
            edgemon.ready()
            no_wal.ready()
            no_feed.ready()
            scrape_cpu = scrape_cost(edgemon)
            print(f"mosquitto on 127.0.0.1:{port}; edgemon pid {edgemon.pid}; "
                  f"one /metrics scrape costs edgemon {scrape_cpu * 1000:.1f} ms CPU")  # fmt: skip

            print(f"\n1. single messages, 4 devices × 64 streams, QoS 1, {scale.rate:,.0f}/s")
            single = part_single(scale, loadgen, bare, edgemon, no_wal, scrape_cpu, seed)
            print("\n".join(single.rounds))
            print(f"  best: bare {single.bare_rate:,.0f} msg/CPU-s, edgemon "
                  f"{single.edgemon_rate:,.0f} msg/CPU-s, ratio {single.ratio:.2f}; without its "
                  f"log {single.no_wal_rate:,.0f} msg/CPU-s, with/without "
                  f"{single.wal_ratio:.2f}")  # fmt: skip

            print("\n2. batches of 100 chunk events, 4 devices × 64 streams")
            batch_rate, line = part_batched(scale, loadgen, edgemon, scrape_cpu, seed)
            batch_ratio = batch_rate / single.bare_rate
            print(f"{line}\n  vs bare single-message rate: {batch_ratio:.1f}×")

            print(f"\n3. reaction latency, {scale.probes} flips, background 1,000 events/s")
            latency = part_latency(scale, loadgen, port, seed, probes=scale.probes, background=True)
            print(latency.line)
            print(f"\n3b. reaction latency, {QUIET_PROBES} flips, no other traffic")
            quiet = part_latency(scale, loadgen, port, seed, probes=QUIET_PROBES, background=False)
            print(quiet.line)

            print(f"\n4. edge load, 64 streams × 12.5 chunks/s on one device, {scale.edge_s:.0f} s")
            print(f"  idle: {idle_share(edgemon, scale.warm_s):.2f} % of one core")
            edge = part_edge(scale, loadgen, edgemon, bare, seed, batch=1)
            print(f"  a) one chunk per message\n{edge.line}")
            batched = part_edge(scale, loadgen, edgemon, bare, seed, batch=64)
            print(f"  b) the chunks of each 80 ms in one message (64 per batch)\n{batched.line}")

            print("\n5. the same edge load through edgemon.client.Reporter, default batching")
            reported = part_reporter(scale, loadgen, edgemon, bare, seed)
            print(reported.line)
            _end_streams(loadgen, None, 0.0)

            print(f"\n6. the slack feed's cost: part 5 with the feed and without, {scale.rounds} "
                  "round(s)")  # fmt: skip
            feed_cost, line = part_feed(scale, loadgen, edgemon, no_feed, bare, seed + 600)
            print(line)
        finally:
            loadgen.close()
            bare.close()
            no_wal.close()
            no_feed.close()
            code = edgemon.close()
    load_after = os.getloadavg()

    table = [  # the ingest targets
        ("4a. 64 streams × 12.5 chunks/s, one per message, CPU", edge.figure, "≤ 8 %",
         edge.share <= 8.0),
        ("5. the same through the Reporter, CPU", reported.figure, "≤ 1 %",
         reported.share <= 1.0),
        ("1. single-message ingest ÷ bare, msg per CPU-s", f"{single.ratio:.2f}×", "≥ 1.0×",
         single.ratio >= 1.0),
        ("2. batched (100) events/CPU-s ÷ bare msg/CPU-s", f"{batch_ratio:.1f}×", "≥ 12×",
         batch_ratio >= 12.0),
    ]  # fmt: skip
    rows = [
        ("1w. with the log ÷ without, msg per CPU-s", f"{single.wal_ratio:.2f}×", "≥ 0.9×",
         single.wal_ratio >= 0.9),
        ("3. reaction latency p99, under load", latency.figure, "≤ 5 ms", latency.met),
        ("3b. reaction latency p99, quiet", quiet.figure, "≤ 5 ms", quiet.met),
        ("4a. RSS at the end", f"{edge.rss / 2**20:.1f} MiB", "≤ 80 MB", edge.rss <= 80e6),
        ("4b. CPU, 800 chunks/s, batches of 64", batched.figure, "≤ 2 %", batched.share <= 2.0),
        ("6. the slack feed, CPU (with − without)", f"{feed_cost:+.2f} %", "≤ 2 %",
         feed_cost <= 2.0),
    ]  # fmt: skip
    print("\nSUMMARY (ingest targets; ratios against the bare subscriber of this run)")
    for name, value, target, ok in table:
        print(f"  {name:<52} {value:<24} target {target:<7} {verdict(ok)}")
    print("more")
    for name, value, target, ok in rows:
        print(f"  {name:<52} {value:<24} target {target:<7} {verdict(ok)}")
    print(f"  edgemon exit code {code}; {time.perf_counter() - started:.0f} s; load average "
          f"before {load_before[0]:.2f}, after {load_after[0]:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
