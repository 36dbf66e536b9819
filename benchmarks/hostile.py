"""The daemon and the capacity object under hostile clients (`make test-hostile`).

Run: `.venv/bin/python benchmarks/hostile.py [--check] [--part connections|memory|capacity]`.

A real Mosquitto with the shipped `mosquitto.conf` and ACL (`deploy/mosquitto/`: only the
port, paths and log changed; `--acl` names another ACL), logins for edgemon, three players
(`speaker-01` to `-03`) and the engine (`tts-engine`), and a real `edgemon run` under
`ulimit -n 256` with the agent check on. Three parts, each printing its figures:

1. **connections**: 1,000 idle and slow-header connections on each listener (HTTP and agent)
   for 30 s, from a process of their own, each opened again 1 s after edgemon closes it (as
   slowloris does each round), while a player reports a chunk every 20 ms (QoS 1). Printed:
   `/healthz`'s latency (a new connection every 100 ms; a probe unanswered within 2 s counts
   as 2 s), the bytes the write-ahead log grew by in each 5 s (read from its files), and,
   after a SIGKILL right at the end and a restart, the chunks the broker acknowledged against
   those edgemon applied (lost, or applied twice).
2. **memory**: 2,000 payloads of 256 KiB from one player, 100 a second (26 MB/s: faster, the
   broker's 64 MiB queue for edgemon overflows and it drops messages for edgemon, which no
   daemon can prevent; `--flood-rate 0` shows it), while two others report chunks:
   edgemon's RSS growth (its peak, sampled every 50 ms, over its RSS before), and the other
   players' chunks applied against those acknowledged.
3. **capacity**: the engine's real capacity object (`CapacityPublisher`), the HTTP middleware
   (`EdgemonShedMiddleware` and its `CapacityView`) and the agent check, while forged, stale,
   huge and malformed objects come from a player's login and from the engine's (there, only
   what a reader can judge: a fresh, readable object about its own device is the engine's
   word): requests refused against what the real object alone refuses, the largest
   `Retry-After`, the agent's lowest weight against the real object's, and how far
   `edgemon_engine_shed_total` moves when objects swing `shed_total` between 2^53 and 0.

Before the change, run it from a checkout of the old code with the ACL's hub lines switched
on (`--acl`), the engine logging in as its player (`--engine-user speaker-01`).

`--check` exits 1 when a figure is outside the bounds of docs/reliability.md ("Hostile
clients"): `/healthz` p99 below 100 ms, the log growing in every 5 s, nothing acknowledged
lost, RSS growth at most 30 MB, every other player's chunk applied, no more refusals than the
real object causes, `Retry-After` at most 4 × the start SLO, the agent never below the real
object's weight, the counter moving by at most 10,000.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import resource
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _support import Edgemon, http_get, percentile, rss_bytes, samples, stop
from paho.mqtt import client as paho
from paho.mqtt.enums import CallbackAPIVersion
from shipped_broker import ACL, launch_shipped

from edgemon.broker_url import parse_broker_url
from edgemon.shedding.middleware import CapacityView, EdgemonShedMiddleware
from edgemon.shedding.topic import CapacityPublisher, TopicConfig

from mqtt_probe import eventually

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, MutableMapping
    from multiprocessing.synchronize import Event as MpEvent

P = "edgemon/v1"
PASSWORDS = {
    "edgemon": "pw-edgemon",
    "speaker-01": "pw-speaker-01",
    "speaker-02": "pw-speaker-02",
    "speaker-03": "pw-speaker-03",
    "tts-engine": "pw-tts-engine",
}
NOFILE = 256
ATTACK_CONNECTIONS = 1000
ATTACK_S = 30.0
#: An attacker's connection closed by edgemon is opened again after this long.
ATTACK_REOPEN_S = 1.0
PROBE_EVERY_S = 0.1
PROBE_TIMEOUT_S = 2.0
WAL_WINDOW_S = 5.0
CHUNK_EVERY_S = 0.02
FLOOD_MESSAGES = 2000
FLOOD_BYTES = 262_144
#: Payloads a second: 26 MB/s, a 210 Mbit/s link. (The broker's queue for edgemon's session
#: is 64 MiB, `max_queued_bytes`: a device sending faster than edgemon reads fills it, and then
#: the broker drops messages for edgemon, other devices' too; no daemon can help that.)
FLOOD_RATE = 100.0
SLO_MS = 3000.0
#: The bounds `--check` holds the figures to.
HEALTHZ_P99_S = 0.100
RSS_GROWTH_BYTES = 30 * 1_000_000
RETRY_AFTER_SLOS = 4
SHED_MOVE = 10_000


# ---------------------------------------------------------------------- clients
class Player(threading.Thread):
    """A player reporting one chunk of `stream` every `every_s` (QoS 1) until `stop()`; the
    chunks the broker acknowledged."""

    def __init__(self, port: int, device: str, stream: str, every_s: float = CHUNK_EVERY_S) -> None:
        super().__init__(name=f"player-{device}", daemon=True)
        self.device, self.stream, self.every_s = device, stream, every_s
        self.sent = self.acked = 0
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self.client = mqtt_client(port, device, f"hostile-{device}-{stream}")
        self.client.on_publish = self._on_publish

    def _on_publish(self, *_: object) -> None:
        with self._lock:
            self.acked += 1

    def run(self) -> None:
        began = time.monotonic()
        while not self._halt.is_set():
            event = {
                "type": "chunk", "stream": self.stream, "t_ms": time.time() * 1000.0,
                "seq": self.sent, "audio_ms": 20.0, "eta_ms": 20.0,
            }  # fmt: skip
            self.client.publish(f"{P}/{self.device}/events", json.dumps(event), qos=1)
            self.sent += 1
            self._halt.wait(max(0.0, began + self.sent * self.every_s - time.monotonic()))

    def stop(self, timeout: float = 30.0) -> int:
        """Stop reporting; once the broker acknowledged every chunk sent (or `timeout`), the
        chunks acknowledged."""
        self._halt.set()
        self.join()
        eventually(lambda: self.acked >= self.sent, timeout)
        self.client.loop_stop()
        self.client.disconnect()
        return self.acked


def mqtt_client(port: int, user: str, client_id: str) -> paho.Client:
    """A connected paho client logged in as `user`, its network thread running."""
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id)
    client.username_pw_set(user, PASSWORDS[user])
    client.max_inflight_messages_set(20)
    client.connect("127.0.0.1", port)
    client.loop_start()
    return client


def publish(client: paho.Client, topic: str, payload: bytes | dict[str, Any]) -> None:
    """Publish retained at QoS 1 and wait for the broker's PUBACK."""
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    client.publish(topic, data, qos=1, retain=True).wait_for_publish(10)


def metric(edgemon: Edgemon, name: str, labels: str = "") -> float | None:
    """One sample of `/metrics` (None when the page or the sample is not there)."""
    status, text = http_get(f"http://127.0.0.1:{edgemon.http_port}/metrics", 5)
    return samples(text, name).get(labels) if status == 200 else None


def chunks_of(edgemon: Edgemon, device: str) -> Callable[[], float | None]:
    """A reader of `edgemon_chunks_total` of `device`."""
    return lambda: metric(edgemon, "edgemon_chunks_total", f'device="{device}"')


def settle(read: Callable[[], float | None], target: float, quiet_s: float = 3.0) -> float:
    """`read()` once it reached `target`, or once it stopped moving for `quiet_s` (60 s at most)."""
    last, since, deadline = None, time.monotonic(), time.monotonic() + 60
    while time.monotonic() < deadline:
        value = read()
        if value is not None and value >= target:
            return value
        if value != last:
            last, since = value, time.monotonic()
        elif time.monotonic() - since > quiet_s:
            break
        time.sleep(0.1)
    return last if last is not None else -1.0


@dataclass
class Checks:
    """What `--check` holds: each bound with whether it was kept."""

    kept: list[tuple[str, bool]] = field(default_factory=list)

    def __call__(self, what: str, ok: bool) -> None:
        self.kept.append((what, ok))
        print(f"  {'ok ' if ok else 'OUT'} {what}")

    @property
    def failed(self) -> list[str]:
        return [what for what, ok in self.kept if not ok]


# ---------------------------------------------------------------------- 1. connections
def attack(
    ports: list[int], per_port: int, stop_event: MpEvent, result: Any, reopen_s: float
) -> None:
    """The attacker's process: `per_port` connections on each port, half idle, half sending a
    request head one byte a second, each opened again `reopen_s` after the server closed it
    (as slowloris does each round)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    counts = {"opened": 0, "refused": 0, "closed_by_server": 0}

    async def one(port: int, slow: bool) -> None:
        head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 10_000
        while not stop_event.is_set():
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                counts["refused"] += 1
                await asyncio.sleep(0.5)
                continue
            counts["opened"] += 1
            try:
                sent = 0
                while not stop_event.is_set():
                    if slow and sent < len(head):
                        writer.write(head[sent : sent + 1])
                        sent += 1
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(1.0):
                            while await reader.read(4096):
                                pass
                            counts["closed_by_server"] += 1
                            break
            except OSError:
                counts["closed_by_server"] += 1
            finally:
                writer.close()
            await asyncio.sleep(reopen_s)

    async def main() -> None:
        tasks = [
            asyncio.create_task(one(port, slow=i % 2 == 1))
            for port in ports
            for i in range(per_port)
        ]
        while not stop_event.is_set():  # noqa: ASYNC110 - a process's event
            await asyncio.sleep(0.1)
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())
    result.put(counts)


def healthz_once(port: int) -> float:
    """Seconds for one `/healthz` on a new connection (`PROBE_TIMEOUT_S` if unanswered or not
    200)."""
    began = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=PROBE_TIMEOUT_S) as sock:
            sock.settimeout(max(0.001, began + PROBE_TIMEOUT_S - time.monotonic()))
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
    except OSError:
        return PROBE_TIMEOUT_S
    if not answer.startswith(b"HTTP/1.1 200"):
        return PROBE_TIMEOUT_S
    return time.monotonic() - began


class Sampler(threading.Thread):
    """Calls `sample()` every `every_s` until `stop()`; keeps what it returns."""

    def __init__(self, sample: Callable[[], Any], every_s: float) -> None:
        super().__init__(daemon=True)
        self._sample, self._every_s = sample, every_s
        self.values: list[tuple[float, Any]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.values.append((time.monotonic(), self._sample()))
            self._halt.wait(self._every_s)

    def stop(self) -> list[tuple[float, Any]]:
        self._halt.set()
        self.join()
        return self.values


def wal_written(directory: Path) -> Callable[[], int]:
    """A reader of the bytes the write-ahead log has had so far: each generation's largest
    size seen, summed (a snapshot deletes old generations, never shrinks one)."""
    largest: dict[str, int] = {}

    def read() -> int:
        for path in directory.glob("wal.*.jsonl"):
            with contextlib.suppress(FileNotFoundError):
                largest[path.name] = max(largest.get(path.name, 0), path.stat().st_size)
        return sum(largest.values())

    return read


def part_connections(
    directory: Path, port: int, check: Checks, edgemon: Edgemon, start: Callable[[], Edgemon]
) -> Edgemon:
    """Part 1 on `edgemon`; returns the edgemon `start()`ed after the SIGKILL."""
    player = Player(port, "speaker-01", "c1")
    player.start()
    assert edgemon.agent_port is not None
    ports = [edgemon.http_port, edgemon.agent_port]
    context = mp.get_context("spawn")
    stop_event, result = context.Event(), context.Queue()
    attacker = context.Process(
        target=attack,
        args=(ports, ATTACK_CONNECTIONS, stop_event, result, ATTACK_REOPEN_S),
        daemon=True,
    )
    wal = Sampler(wal_written(directory), 0.5)
    wal.start()
    attacker.start()
    probes = Sampler(lambda: healthz_once(edgemon.http_port), PROBE_EVERY_S)
    probes.start()
    time.sleep(ATTACK_S)
    edgemon.process.send_signal(signal.SIGKILL)
    edgemon.process.wait()
    latencies = [seconds for _, seconds in probes.stop()]
    written = wal.stop()
    stop_event.set()
    attacker.join(30)
    counts = result.get(timeout=5) if not result.empty() else {}
    acked = player.stop()
    edgemon = start()
    applied = settle(lambda: metric(edgemon, "edgemon_chunks_total", 'device="speaker-01"'), acked)
    duplicates = metric(edgemon, "edgemon_messages_total", 'result="duplicate"') or 0.0
    growth = []
    for began in range(int(ATTACK_S // WAL_WINDOW_S)):
        window = [v for t, v in written if written[0][0] + began * WAL_WINDOW_S <= t
                  < written[0][0] + (began + 1) * WAL_WINDOW_S]  # fmt: skip
        growth.append(window[-1] - window[0] if window else 0)
    p99 = percentile(latencies, 99)
    unanswered = sum(1 for s in latencies if s >= PROBE_TIMEOUT_S)
    print(
        f"connections: {ATTACK_CONNECTIONS:,} idle and slow-header connections on each of "
        f"HTTP and agent for {ATTACK_S:.0f} s, edgemon under ulimit -n {NOFILE}"
    )
    print(f"  attacker: {counts}")
    print(
        f"  /healthz: {len(latencies)} probes, p50 {percentile(latencies, 50) * 1000:.1f} ms, "
        f"p99 {p99 * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms, {unanswered} unanswered"
    )
    print(f"  WAL bytes written per {WAL_WINDOW_S:.0f} s: {growth}")
    print(
        f"  SIGKILL at the end: broker acknowledged {acked:,} chunks; edgemon applied "
        f"{applied:,.0f} after its restart; lost {acked - applied:,.0f}; "
        f"duplicates {duplicates:,.0f}"
    )
    check(f"/healthz p99 {p99 * 1000:.1f} ms < {HEALTHZ_P99_S * 1000:.0f} ms", p99 < HEALTHZ_P99_S)
    check("the WAL grew in every 5 s", all(g > 0 for g in growth))
    check(f"nothing acknowledged lost ({acked - applied:,.0f})", applied == acked)
    return edgemon


# ---------------------------------------------------------------------- 2. memory
def part_memory(port: int, check: Checks, edgemon: Edgemon, rate: float) -> None:
    """Part 2: the payloads sent at `rate` a second (0: as fast as the broker takes them)."""
    edgemon.ready()
    invalid0 = metric(edgemon, "edgemon_messages_total", 'result="invalid_json"') or 0.0
    others = [Player(port, "speaker-01", "m1", 0.05), Player(port, "speaker-03", "m3", 0.05)]
    before = [
        metric(edgemon, "edgemon_chunks_total", f'device="{p.device}"') or 0.0 for p in others
    ]
    time.sleep(1.0)
    baseline = rss_bytes(edgemon.pid)
    rss = Sampler(lambda: rss_bytes(edgemon.pid), 0.05)
    rss.start()
    for other in others:
        other.start()
    flood = mqtt_client(port, "speaker-02", "hostile-flood")
    payload = b"x" * FLOOD_BYTES
    began = time.monotonic()
    infos = []
    for n in range(FLOOD_MESSAGES):
        if rate:
            time.sleep(max(0.0, began + n / rate - time.monotonic()))
        infos.append(flood.publish(f"{P}/speaker-02/events", payload, qos=1))
    for info in infos:
        info.wait_for_publish(120)
    sent_s = time.monotonic() - began
    counted = settle(
        lambda: metric(edgemon, "edgemon_messages_total", 'result="invalid_json"'),
        invalid0 + FLOOD_MESSAGES,
    )
    acked = [other.stop() for other in others]
    applied = [
        settle(chunks_of(edgemon, p.device), b + a) - b
        for p, b, a in zip(others, before, acked, strict=True)
    ]
    peak = max(v for _, v in rss.stop())
    flood.loop_stop()
    flood.disconnect()
    growth = peak - baseline
    print(
        f"memory: {FLOOD_MESSAGES:,} payloads of {FLOOD_BYTES // 1024} KiB from speaker-02 "
        f"({'at once' if not rate else f'{rate:.0f}/s'}: sent in {sent_s:.1f} s), two players "
        "reporting meanwhile"
    )
    print(
        f"  RSS {baseline / 1e6:.1f} MB before, peak {peak / 1e6:.1f} MB: growth "
        f"{growth / 1e6:.1f} MB; flood counted invalid_json: {counted - invalid0:,.0f}"
    )
    for other, got, want in zip(others, applied, acked, strict=True):
        print(f"  {other.device}: {want} chunks acknowledged, {got:,.0f} applied")
    check(f"RSS growth {growth / 1e6:.1f} MB <= 30 MB", growth <= RSS_GROWTH_BYTES)
    check("every other player's chunk applied", applied == [float(a) for a in acked])


# ---------------------------------------------------------------------- 3. capacity
class Requests:
    """POSTs to `/v1/completions` through the shedding middleware (ASGI, in this process)."""

    def __init__(self, middleware: EdgemonShedMiddleware) -> None:
        self.middleware = middleware

    async def _one(self) -> tuple[int, int | None]:
        sent: list[dict[str, Any]] = []

        async def app(_scope: Any, _receive: Any, send: Any) -> None:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"generated"})

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"{}", "more_body": False}

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(dict(message))

        self.middleware.app = app
        scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}
        await self.middleware(scope, receive, send)
        start = sent[0]
        retry = dict(start["headers"]).get(b"retry-after")
        return start["status"], None if retry is None else int(retry)

    def judged(self, *, refuse: bool) -> Callable[[], bool]:
        """A check: whether a request now is refused (`refuse`) or not."""
        return lambda: (self.run(1)[0] == 1) == refuse

    def run(self, count: int) -> tuple[int, int]:
        """`count` requests, 10 ms apart: (refused, the largest Retry-After in s)."""
        refused = largest = 0
        for _ in range(count):
            status, retry = asyncio.run(self._one())
            if status == 503:
                refused += 1
                largest = max(largest, retry or 0)
            time.sleep(0.01)
        return refused, largest


def agent_weight(port: int) -> int:
    """The agent check's weight now (percent)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        line = sock.makefile("rb").readline().decode()
    return int(line.split()[1].rstrip("%"))


#: (what, payload or a function of now in ms giving it, whether it is the engine's word: a
#: fresh, readable object about its own device, which its own login may send as the real
#: engine would).
Forgery = tuple[str, Any, bool]
FORGERIES: list[Forgery] = [
    ("forged wait 1e9", lambda now: {"t_ms": now, "start_wait_ms": 1e9}, True),
    ("forged wait 1e300", lambda now: {"t_ms": now, "start_wait_ms": 1e300}, False),
    ("stale (1970)", {"t_ms": 1, "start_wait_ms": 1e9, "realtime_streams": 8, "running": 8}, False),
    ("forged full", lambda now: {"t_ms": now, "realtime_streams": 2**53, "running": 2**53}, True),
    ("forged all spare", lambda now: {"t_ms": now, "realtime_streams": 64, "running": 0}, True),
    ("huge counts", lambda now: {"t_ms": now, "running": 10**400, "start_wait_ms": 1e9}, False),
    ("400-digit integer", b'{"start_wait_ms": ' + b"9" * 400 + b"}", False),
    ("nested 100,000 deep", b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", False),
    ("not JSON", b"\xff\xfe garbage", False),
]


def _shown(retry_after: int) -> str:
    return f"{retry_after}" if retry_after < 10**9 else f"{retry_after:.3g}"


def part_capacity(port: int, check: Checks, edgemon: Edgemon, args: argparse.Namespace) -> None:
    """Part 3. The real engine says 8 real-time streams, 2 running (75 % spare) and a wait
    within the SLO ("admits"), then beyond it ("refuses"). A player's login sends every
    forgery; the engine's login every one but its word (a fresh, readable object about its
    own device is what the engine says, which no reader can tell from the real one), except
    a huge wait while the real object refuses anyway (its `Retry-After` must stay bounded)."""
    edgemon.ready()
    assert edgemon.agent_port is not None

    def config(user: str) -> TopicConfig:
        broker = parse_broker_url(
            f"mqtt://127.0.0.1:{port}", username=user, password=PASSWORDS[user]
        )
        return TopicConfig(broker, ("speaker-01",), P)

    engine = CapacityPublisher(config(args.engine_user), min_interval_s=0.2).open()
    view = CapacityView(config(args.view_user)).open()
    requests = Requests(EdgemonShedMiddleware(_no_app, view=view, slo_ms=SLO_MS))
    logins = {
        "player": mqtt_client(port, "speaker-01", "hostile-player"),
        "engine": mqtt_client(port, args.engine_user, "hostile-engine"),
    }
    topic = f"{P}/speaker-01/capacity"
    agent = edgemon.agent_port

    def real(start_wait_ms: float) -> None:
        engine.update(
            realtime_streams=8, running=2, waiting=1, start_wait_ms=start_wait_ms, shed={}
        )

    results: dict[str, dict[str, tuple[int, int, int]]] = {}
    try:
        view.link.wait_connected(30)
        for phase, wait_ms in (("admits", 500.0), ("refuses", 4200.0)):
            real(wait_ms)
            refuses = wait_ms > SLO_MS
            eventually(requests.judged(refuse=refuses), 30)
            refused, retry = requests.run(10)
            rows = results[phase] = {"real object": (refused, retry, agent_weight(agent))}
            for login, client in logins.items():
                for what, payload, word in FORGERIES:
                    if login == "engine" and word and not (refuses and "wait" in what):
                        continue
                    value = payload(time.time() * 1000.0) if callable(payload) else payload
                    publish(client, topic, value)
                    time.sleep(0.3)  # delivered to the middleware and edgemon
                    refused, retry = requests.run(10)
                    rows[f"{login}: {what}"] = (refused, retry, agent_weight(agent))
                    real(wait_ms + 1)  # the engine publishes again (it changed)
                    real(wait_ms)
                    time.sleep(0.5)
        shed0 = metric(edgemon, "edgemon_engine_shed_total", 'device="speaker-01"') or 0.0
        for _ in range(10):
            publish(logins["engine"], topic, {"t_ms": time.time() * 1000.0, "shed_total": 2**53})
            publish(logins["engine"], topic, {"t_ms": time.time() * 1000.0, "shed_total": 0})
        time.sleep(0.5)
        moved = (metric(edgemon, "edgemon_engine_shed_total", 'device="speaker-01"') or 0.0) - shed0
    finally:
        for client in logins.values():
            client.loop_stop()
            client.disconnect()
        view.close()
        engine.close()
    print(
        f"capacity: engine login {args.engine_user}, middleware login {args.view_user}, "
        f"SLO {SLO_MS / 1000:.0f} s"
    )
    bound = RETRY_AFTER_SLOS * SLO_MS / 1000
    for phase, rows in results.items():
        real_refused, _, real_weight = rows["real object"]
        print(f"  the real object {phase}: per row, of 10 requests refused, the largest "
              "Retry-After, the agent's weight")  # fmt: skip
        for what, (refused, retry, weight) in rows.items():
            print(f"    {what:<32} {refused:>3} {_shown(retry):>9} {weight:>4}%")
        worst = max(r for r, _, _ in rows.values())
        largest = max(r for _, r, _ in rows.values())
        lowest = min(w for _, _, w in rows.values())
        check(
            f"{phase}: refusals {worst} <= the real object's {real_refused}", worst <= real_refused
        )
        check(f"{phase}: Retry-After {_shown(largest)} s <= {bound:.0f} s", largest <= bound)
        check(
            f"{phase}: agent weight {lowest}% >= the real object's {real_weight}%",
            lowest >= real_weight,
        )
    print(f"  shed_total swung between 2^53 and 0 ten times: the counter moved by {moved:,.0f}")
    check(f"the counter moved by {moved:,.0f} <= {SHED_MOVE:,}", moved <= SHED_MOVE)


async def _no_app(_scope: Any, _receive: Any, _send: Any) -> None:
    raise AssertionError("replaced by Requests")


# ---------------------------------------------------------------------- main
@contextlib.contextmanager
def broker(directory: Path, acl: Path) -> Iterator[int]:
    """The shipped Mosquitto with `acl`: its port."""
    process, port = launch_shipped(directory, PASSWORDS, acl=acl)
    try:
        yield port
    finally:
        stop(process)


def main() -> int:
    """Every part (or one), its figures, and with `--check` the verdict."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a bound is not kept")
    parser.add_argument("--part", action="append", choices=("connections", "memory", "capacity"))
    parser.add_argument("--acl", type=Path, default=ACL, help="the broker's ACL (default: shipped)")
    parser.add_argument("--engine-user", default="tts-engine", help="the engine's login")
    parser.add_argument("--view-user", default="tts-engine", help="the middleware's login")
    parser.add_argument(
        "--flood-rate", type=float, default=FLOOD_RATE, help="large payloads a second (0: at once)"
    )
    args = parser.parse_args()
    parts = args.part or ["connections", "memory", "capacity"]
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the attacker's 2,000 sockets
    check = Checks()
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="edgemon-hostile-") as tmp:
        directory = Path(tmp)
        state = directory / "state"
        state.mkdir()
        secret = directory / "edgemon-password"
        secret.write_text(PASSWORDS["edgemon"], encoding="utf-8")
        secret.chmod(0o600)
        with broker(directory, args.acl) as port:

            def start() -> Edgemon:
                edgemon = Edgemon(
                    state, port, client_id="edgemon-hostile", nofile=NOFILE, agent=True,
                    mqtt=f'username = "edgemon"\npassword_file = "{secret}"\n',
                )  # fmt: skip
                edgemon.ready()
                return edgemon

            edgemon = start()
            try:
                if "connections" in parts:
                    edgemon = part_connections(state, port, check, edgemon, start)
                if "memory" in parts:
                    part_memory(port, check, edgemon, args.flood_rate)
                if "capacity" in parts:
                    part_capacity(port, check, edgemon, args)
            finally:
                edgemon.close()
    print(f"hostile: {time.monotonic() - began:.0f} s")
    if args.check and check.failed:
        print(f"hostile: {len(check.failed)} bound(s) not kept: {'; '.join(check.failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
