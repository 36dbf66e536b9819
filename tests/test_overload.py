"""Overload through the real broker (docs/reliability.md "Flow control, not shedding"): publisher
processes flood the daemon with large batches faster than it can apply them. edgemon reads
the socket only as fast as it applies (TCP backpressure: the broker holds the rest), so it
sheds nothing (`overloaded` stays 0), its memory stays bounded, and the throttle objects of
another device keep flowing.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from edgemon.daemon import Daemon

from clients import device, now_ms, scrape, settings_for, watching
from daemons import rejections, running
from flood_publisher import SCRIPT as FLOOD
from scrapes import sample

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, MutableMapping

    from brokers import Broker
    from clients import Watcher

pytestmark = [pytest.mark.integration, pytest.mark.asyncio, pytest.mark.slow]

P = "edgemon/v1"
FLOOD_S = 2.0
#: RSS growth allowed during the flood: the queue's 8 MB of payloads, their message objects,
#: the flooders' streams (bounded by the limits) and allocator slack. Measured: see the docs.
RSS_BOUND_MB = 100.0


def rss_mb() -> float:
    """This process's resident set size (VmRSS), in MB."""
    for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")  # pragma: no cover


def legit_latency(daemon: Daemon) -> list[float]:
    """Delivery delays (ms, publish `t_ms` → the engine takes it) of the legit device's
    messages, recorded by wrapping the link's message hook."""
    delays: list[float] = []
    deliver = daemon.link.intake._apply

    def on_message(topic: str, payload: bytes) -> None:
        if topic == f"{P}/legit/events":
            value = json.loads(payload)
            first = value[0] if isinstance(value, list) else value
            delays.append(now_ms() - first["t_ms"])
        deliver(topic, payload)

    daemon.link.intake._apply = on_message
    return delays


async def legit_cycle(client: Any, watcher: Watcher, k: int) -> tuple[float, float]:
    """One throttle ON/OFF cycle of the legit device: chunk 0 with 300 ms of audio (ON by the
    timer, or at once if it is applied late), then 2 s refills, each a new chunk with a fresh
    `t_ms` every 0.5 s, as a real device would send them, until OFF. Under overload any of
    them may be late by the broker's backlog, hence a fresh refill every 0.5 s.
    Returns the ON and OFF `t_ms`: the first ON naming this cycle's stream, and the first OFF
    after it (see `first`)."""
    stream = f"c{k}"
    t0 = now_ms()
    first = [
        {"type": "start", "stream": stream, "t_ms": t0},
        {"type": "chunk", "stream": stream, "t_ms": t0, "seq": 0, "audio_ms": 300, "eta_ms": 50},
    ]
    on = await resend_until(client, lambda _: first, lambda: first_on(watcher, stream))

    def refill(n: int) -> list[dict[str, Any]]:
        t = now_ms()
        return [{"type": "chunk", "stream": stream, "t_ms": t, "seq": n + 1, "audio_ms": 2_000}]

    off = await resend_until(client, refill, lambda: first_off(watcher, after=on["t_ms"]))
    end = {"type": "end", "stream": stream, "t_ms": now_ms()}
    await client.publish(f"{P}/legit/events", json.dumps(end), qos=1)
    return on["t_ms"], off["t_ms"]


def applied(daemon: Daemon, device_id: str, stream: str) -> bool:
    """Whether the daemon's engine has `stream` of `device_id` now."""
    device = daemon.monitor.engine.device(device_id)
    return device is not None and stream in device.streams


def first_on(watcher: Watcher, stream: str) -> dict[str, Any] | None:
    """The legit device's first ON object naming `stream` at risk, once it came.

    Not "the next ON": under the flood the previous cycle's stream can run low again before
    its `end` (queued behind the backlog) is applied, and that ON may come during this cycle."""
    return next((o for o in _unique(watcher) if o["throttle"] and stream in o["streams"]), None)


def first_off(watcher: Watcher, *, after: float) -> dict[str, Any] | None:
    """The legit device's first OFF object stamped after `after` (the cycle's ON), once it came.

    Not "the next OFF": the publisher sends a device's latest state and replaces an older one
    still waiting for its turn (docs/protocol.md), so a late ON of the previous cycle's stream
    can be replaced by its OFF, which then comes unpaired during this cycle."""
    return next((o for o in _unique(watcher) if not o["throttle"] and o["t_ms"] > after), None)


def _unique(watcher: Watcher) -> list[dict[str, Any]]:
    """The legit device's throttle objects in `seq` order, each once: under the flood the broker
    may deliver a QoS 1 object to the watcher twice (a redelivery)."""
    unique = {o["seq"]: o for o in watcher.throttles("legit")}
    return [o for _, o in sorted(unique.items())]


async def resend_until(
    client: Any, batch: Callable[[int], list[dict[str, Any]]], found: Any
) -> dict[str, Any]:
    """Publish `batch(n)` (n = 0, 1, …) every 0.5 s until `found()` gives a throttle object.

    The bound is about liveness, not latency: under the flood the broker's own backlog delays
    every device by seconds (docs/reliability.md), more so on a loaded 2-core CI machine,
    where coverage's tracing makes applying a flood's backlog take about 40 s."""
    async with asyncio.timeout(120):
        for n in itertools.count():
            await client.publish(f"{P}/legit/events", json.dumps(batch(n)), qos=1)
            deadline = time.monotonic() + 0.5
            while time.monotonic() < deadline:
                obj = found()
                if obj is not None:
                    return obj  # type: ignore[no-any-return]
                await asyncio.sleep(0.01)
    raise AssertionError("unreachable")  # pragma: no cover


@contextlib.asynccontextmanager
async def flooders(port: int, count: int) -> AsyncIterator[list[asyncio.subprocess.Process]]:
    """`count` flooder processes (the first at QoS 1, the others at QoS 0) for `FLOOD_S`."""
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, FLOOD, str(port), "batches", f"flood{i}", str(int(i == 0)),
            str(FLOOD_S),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for i in range(count)
    ]  # fmt: skip
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
            await proc.communicate()


async def batches_sent(proc: asyncio.subprocess.Process) -> int:
    """What a flooder printed: how many batches it published (0 if it failed)."""
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return int(out or 0)


async def test_a_flood_is_held_back_not_shed_with_bounded_memory(
    private_broker: Broker, captured_logs: list[MutableMapping[str, Any]]
) -> None:
    """Three publisher processes (one at QoS 1, two at QoS 0) send ~90 kB batches of 1000
    chunks for 2 s, more than the daemon can apply: nothing is shed
    (`edgemon_messages_total{result="overloaded"}` is 0, no `overloaded` log line), RSS grows
    by less than `RSS_BOUND_MB`, the daemon stays up on one connection (the PUBACKs of its
    throttle objects wait behind the backlog, late, not lost), and a legit device's throttle
    ON/OFF objects keep arriving during the flood."""
    broker = private_broker  # the broker holds the flood's backlog: it is the test's own
    daemon = Daemon(settings_for(broker), environ={}, install_signal_handlers=False)
    latency = legit_latency(daemon)
    async with (
        watching(broker) as watcher,
        running(daemon, logs=captured_logs) as task,
        device(broker) as legit,
    ):
        await legit_cycle(legit, watcher, 0)  # warm: the legit device exists before the flood
        rss_before = rss_mb()
        peak = rss_before
        cycles: list[tuple[float, float, float]] = []
        started = time.monotonic()
        async with flooders(broker.port, 3) as procs:
            while time.monotonic() - started < FLOOD_S and len(cycles) < 20:
                began = time.monotonic()
                on, off = await legit_cycle(legit, watcher, len(cycles) + 1)
                peak = max(peak, rss_mb())
                cycles.append((on, off, time.monotonic() - began))
            sent = await asyncio.gather(*(batches_sent(p) for p in procs))
            # The broker's backlog for edgemon drained: a stream started after the flood (queued
            # behind it for edgemon's session) has been applied. Then the memory is read. Its
            # ten minutes of audio keep it from expiring however late it comes: a bare start
            # applied more than `stream_idle_timeout_ms` after its `t_ms` expires at once.
            t, stream = now_ms(), "after-flood"
            marker = [
                {"type": "start", "stream": stream, "t_ms": t},
                {"type": "chunk", "stream": stream, "t_ms": t, "seq": 0, "audio_ms": 600_000},
            ]
            await legit.publish(f"{P}/legit/events", json.dumps(marker), qos=1)
            async with asyncio.timeout(120):
                while not applied(daemon, "legit", stream):  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
            peak = max(peak, rss_mb())
        assert not task.done()
        assert daemon.http_port is not None
        _, text = await scrape(daemon.http_port, "/metrics")
    overloaded = sample(text, "edgemon_messages_total", {"result": "overloaded"})
    accepted = sample(text, "edgemon_messages_total", {"result": "accepted"})
    reconnects = sample(text, "edgemon_mqtt_reconnects_total", {})
    print(
        f"\noverload: sent {sent} batches, accepted {accepted} events, overloaded={overloaded}, "
        f"reading paused {daemon.link.intake.pauses} times, reconnects={reconnects}, "
        f"RSS +{peak - rss_before:.1f} MB peak, legit cycles (s) "
        f"{[round(c[2], 2) for c in cycles]}, "
        f"legit delivery delay max {max(latency):.0f} ms"
    )
    assert overloaded in {None, 0.0}
    assert reconnects in {None, 0.0}  # a reconnection would drop the backlog's QoS 0 part
    assert not rejections(captured_logs, None, "overloaded")
    assert peak - rss_before < RSS_BOUND_MB
    assert sum(sent) > 0
    assert cycles, "no legit ON/OFF cycle completed during the flood"
    for on, off, _ in cycles:
        assert off >= on + 250  # min-on holds even when the refill came late
