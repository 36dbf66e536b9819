"""The daemon's hot path: the deadline poke, the loggers, and on the wire, reading and
acknowledging (a broker that records the bytes)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import math
from typing import TYPE_CHECKING

import pytest
import structlog
from hypothesis import HealthCheck, given, settings

from edgemon.adapters.connection_state import ConnectionState
from edgemon.daemon.deadline_timer import DeadlineTimer
from edgemon.daemon.logs import configure_logging
from edgemon.daemon.mqtt import LinkHooks, MqttLink
from edgemon.daemon.wall_clock import MonotonicWallClock
from edgemon.engine import EngineConfig
from edgemon.engine.outputs import UnderrunBegan
from edgemon.monitor import Monitor
from edgemon.settings import LogSettings, MqttSettings
from edgemon.wire.topics import Topics

from fake_broker import FakeBroker
from links import until
from properties import examples
from strategies import Scenario, scenarios

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator

    from edgemon.engine.outputs import Output


def _chunk(stream: str, t: float, seq: int, audio: float) -> bytes:
    event = {"type": "chunk", "stream": stream, "t_ms": t, "seq": seq, "audio_ms": audio}
    return json.dumps(event | {"eta_ms": 0}).encode()


def _floor_holds(monitor: Monitor) -> None:
    deadline = monitor.next_deadline()
    assert monitor.engine.deadline_floor() <= (math.inf if deadline is None else deadline)


@pytest.mark.slow  # a property: many generated examples
@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_deadline_floor_never_passes_the_next_deadline(sc: Scenario) -> None:
    """Whatever messages arrive and whatever timers fire, the O(1) `deadline_floor()` the
    deadline timer's poke reads is never later than `next_deadline()`: a message that brings the
    next deadline forward always wakes the timer task."""
    monitor = Monitor(sc.config)
    out: list[Output] = []
    for record in sc.records():
        deadline = monitor.next_deadline()
        while deadline is not None and deadline < record.recv_ms:  # the timer task's part
            monitor.advance(max(deadline, monitor.engine.deadline_floor()), out)
            _floor_holds(monitor)
            deadline = monitor.next_deadline()
        monitor.advance(record.recv_ms, out, inclusive=False)
        monitor.receive(record.topic, record.payload, record.recv_ms, out)
        _floor_holds(monitor)  # what a poke right after the message sees
        monitor.advance(record.recv_ms, out)
        _floor_holds(monitor)
        out.clear()


class CountingMonitor(Monitor):
    """A real Monitor that counts how often the next deadline is computed."""

    __slots__ = ("computed",)

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.computed = 0

    def next_deadline(self) -> float | None:
        """`Monitor.next_deadline`, counted."""
        self.computed += 1
        return super().next_deadline()


@contextlib.asynccontextmanager
async def sleeping_a_minute(
    monitor: Monitor, clock: MonotonicWallClock, handle: Callable[[list[Output]], None]
) -> AsyncIterator[DeadlineTimer]:
    """A running deadline timer whose task sleeps until a deadline a minute away (device
    `far`, stream `s`: 60 s of audio); cancelled on the way out."""
    timer = DeadlineTimer(monitor, clock=clock, handle=handle)
    out: list[Output] = []
    now = clock.now_ms()
    monitor.receive("edgemon/v1/far/events", _chunk("s", now, 0, 60_000), now, out)
    monitor.advance(now, out)
    task = asyncio.create_task(timer.run())
    try:
        for _ in range(20):  # the task computes its deadline and sleeps until it
            await asyncio.sleep(0)
        yield timer
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


@pytest.mark.asyncio
async def test_poke_costs_no_recomputation_when_the_deadline_stays() -> None:
    """1,000 messages that leave the next deadline where it is (a stream with 60 s of audio
    gets more): each poke compares the engine's heap head with the deadline the timer task
    sleeps until, and the task recomputes nothing (not 1,000 computations)."""
    clock = MonotonicWallClock()
    monitor = CountingMonitor(EngineConfig())
    out: list[Output] = []
    async with sleeping_a_minute(monitor, clock, lambda _outputs: None) as timer:
        computed = monitor.computed
        assert computed >= 1
        for seq in range(1, 1_001):
            now = clock.now_ms()
            monitor.receive("edgemon/v1/other/events", _chunk("t", now, seq - 1, 600), now, out)
            monitor.advance(now, out)
            out.clear()
            if seq == 1:  # the new device's first deadline is earlier: one wake-up
                timer.poke()
                for _ in range(20):
                    await asyncio.sleep(0)
                computed = monitor.computed
                continue
            timer.poke()
            await asyncio.sleep(0)
        assert monitor.computed == computed


@pytest.mark.asyncio
async def test_a_message_that_brings_the_deadline_forward_wakes_the_timer() -> None:
    """The timer task sleeps until a deadline a minute away; a message with 100 ms of audio
    on another device brings an underrun forward, and the poke after it makes the task fire
    that underrun (long before the minute is up)."""
    clock = MonotonicWallClock()
    monitor = Monitor(EngineConfig())
    underran = asyncio.Event()

    def handle(outputs: list[Output]) -> None:
        if any(isinstance(o, UnderrunBegan) and o.device == "near" for o in outputs):
            underran.set()

    out: list[Output] = []
    async with sleeping_a_minute(monitor, clock, handle) as timer:
        now = clock.now_ms()
        monitor.receive("edgemon/v1/near/events", _chunk("s", now, 0, 100), now, out)
        monitor.advance(now, out)
        handle(out)
        timer.poke()
        async with asyncio.timeout(20):  # generous; the far deadline is 60 s away
            await underran.wait()


@pytest.fixture
def default_structlog() -> Iterator[None]:
    """structlog's default configuration again after the test."""
    yield
    structlog.reset_defaults()


@pytest.mark.usefixtures("default_structlog")
def test_daemon_loggers_resolve_their_configuration_once() -> None:
    """`configure_logging` caches each logger on first use: later calls skip the lazy
    proxy's bind, so a configuration made afterwards does not reach a logger already used."""
    first, later = io.StringIO(), io.StringIO()
    configure_logging(LogSettings(format="json", level="info"), stream=first)
    log = structlog.get_logger("edgemon")
    log.info("one")
    configure_logging(LogSettings(format="json", level="info"), stream=later)
    log.info("two")
    assert [json.loads(line)["event"] for line in first.getvalue().splitlines()] == ["one", "two"]
    assert later.getvalue() == ""


class Durability:
    """A write-ahead log whose commits the test makes: `when_durable` callbacks wait in
    `held` until `release()`; after `open = True` they run at once."""

    def __init__(self) -> None:
        self.held: list[Callable[[], None]] = []
        self.open = False

    def __call__(self, callback: Callable[[], None]) -> None:
        if self.open:
            callback()
        else:
            self.held.append(callback)

    def release(self) -> None:
        """Every batch held so far is durable now."""
        held, self.held = self.held, []
        for callback in held:
            callback()


@contextlib.asynccontextmanager
async def linked(
    broker: FakeBroker, durability: Durability, applied: list[bytes], *, pending: int
) -> AsyncIterator[MqttLink]:
    """The daemon's real MQTT link to `broker`, subscribed; messages applied go to `applied`,
    durability is `durability`'s, reading pauses at `pending` messages not yet durable."""
    settings = MqttSettings(url=f"mqtt://127.0.0.1:{broker.port}", client_id="wire")
    hooks = LinkHooks(
        on_message=lambda _topic, payload: applied.append(payload),
        status_payload=lambda state: state.encode(),
        when_durable=durability,
    )
    link = MqttLink(
        settings, topics=Topics(), connection=ConnectionState(), hooks=hooks,
        log=structlog.get_logger("wire"), pending_limits=(pending, 1 << 40),
    )  # fmt: skip
    stop = asyncio.Event()

    async def farewell() -> None:
        return None

    task = asyncio.create_task(link.run(stop, farewell))
    try:
        await until(lambda: link.connection.subscribed, "subscribed")
        yield link
    finally:
        durability.open = True
        durability.release()
        stop.set()
        async with asyncio.timeout(30):
            await task


@pytest.mark.asyncio
async def test_pubacks_leave_only_once_durable_and_together() -> None:
    """On the wire: 100 QoS 1 messages in, applied; the link then publishes a marker, which
    the broker reads after anything the link wrote before it: no PUBACK among those bytes
    while the batches wait for the log. Once the log says they are durable, the 100 PUBACKs
    come, each message's id once, all in one read of the broker's socket (one write)."""
    broker = FakeBroker()
    durability, applied = Durability(), list[bytes]()
    try:
        async with linked(broker, durability, applied, pending=4096) as link:
            topic = "edgemon/v1/d/events"
            broker.publish([(topic, b"%d" % n, n) for n in range(1, 101)])
            await until(lambda: len(applied) == 100, "all 100 applied")
            await link.publish("edgemon/v1/marker", b"m", qos=1, retain=False)  # acked: read
            assert broker.pubacks() == []
            assert durability.held
            durability.release()
            await until(lambda: len(broker.pubacks()) == 100, "100 PUBACKs")
            acks = broker.pubacks()
            assert [ack.mid for ack in acks] == list(range(1, 101))  # in the order received
            assert len({ack.read for ack in acks}) == 1
            assert len(broker.reads[acks[0].read]) == 4 * 100  # that read: the PUBACKs only
    finally:
        broker.close()


@pytest.mark.asyncio
async def test_a_paused_intake_stops_reading_the_socket() -> None:
    """A flood of 400 QoS 1 messages of 60 kB (24 MB, far more than the sockets buffer) while
    the log holds every batch: the intake applies 8 (its limit here) and stops reading, so
    the broker's sends block (TCP backpressure) with exactly 8 applied. Once the log catches
    up, reading resumes and every message is applied and acknowledged, none shed."""
    broker = FakeBroker()
    durability, applied = Durability(), list[bytes]()
    count = 400
    try:
        async with linked(broker, durability, applied, pending=8) as link:
            broker.flood("edgemon/v1/d/events", [b"%05d" % n + b"x" * 60_000 for n in range(count)])
            await until(lambda: broker.blocked.is_set() and len(applied) >= 8, "broker blocked")
            assert len(applied) == 8
            assert link.intake.paused
            assert broker.pubacks() == []
            durability.open = True
            durability.release()
            await until(lambda: len(broker.pubacks()) == count, "every message acknowledged")
            assert len(applied) == count
            assert [payload[:5] for payload in applied] == [b"%05d" % n for n in range(count)]
            assert [ack.mid for ack in broker.pubacks()] == list(range(1, count + 1))
    finally:
        broker.close()
