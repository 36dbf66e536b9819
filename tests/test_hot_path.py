"""The per-message costs of the daemon's hot path: the deadline poke, the loggers, reading."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import io
import json
import math
import socket
from typing import TYPE_CHECKING

import paho.mqtt.client as mqtt
import pytest
import structlog
from hypothesis import HealthCheck, given, settings
from paho.mqtt.enums import CallbackAPIVersion

from edgemon.daemon.clock import MonotonicWallClock
from edgemon.daemon.intake import ReadBuffer
from edgemon.daemon.logs import configure_logging
from edgemon.daemon.scheduler import Scheduler
from edgemon.engine import EngineConfig
from edgemon.engine.outputs import UnderrunBegan
from edgemon.monitor import Monitor
from edgemon.settings import LogSettings

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
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_deadline_floor_never_passes_the_next_deadline(sc: Scenario) -> None:
    """Whatever messages arrive and whatever timers fire, the O(1) `deadline_floor()` the
    scheduler's poke reads is never later than `next_deadline()`: a message that brings the
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
) -> AsyncIterator[Scheduler]:
    """A running scheduler whose timer task sleeps until a deadline a minute away (device
    `far`, stream `s`: 60 s of audio); cancelled on the way out."""
    scheduler = Scheduler(monitor, clock=clock, handle=handle)
    out: list[Output] = []
    now = clock.now_ms()
    monitor.receive("edgemon/v1/far/events", _chunk("s", now, 0, 60_000), now, out)
    monitor.advance(now, out)
    task = asyncio.create_task(scheduler.run())
    try:
        for _ in range(20):  # the task computes its deadline and sleeps until it
            await asyncio.sleep(0)
        yield scheduler
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


@pytest.mark.asyncio
async def test_poke_costs_no_recomputation_when_the_deadline_stays() -> None:
    """1,000 messages that leave the next deadline where it is (a stream with 60 s of audio
    gets more): each poke compares the engine's heap head with the deadline the timer task
    sleeps until, and the task recomputes nothing. (Before, every poke recomputed the next
    deadline: 1,000 computations.)"""
    clock = MonotonicWallClock()
    monitor = CountingMonitor(EngineConfig())
    out: list[Output] = []
    async with sleeping_a_minute(monitor, clock, lambda _outputs: None) as scheduler:
        computed = monitor.computed
        assert computed >= 1
        for seq in range(1, 1_001):
            now = clock.now_ms()
            monitor.receive("edgemon/v1/other/events", _chunk("t", now, seq - 1, 600), now, out)
            monitor.advance(now, out)
            out.clear()
            if seq == 1:  # the new device's first deadline is earlier: one wake-up
                scheduler.poke()
                for _ in range(20):
                    await asyncio.sleep(0)
                computed = monitor.computed
                continue
            scheduler.poke()
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
    async with sleeping_a_minute(monitor, clock, handle) as scheduler:
        now = clock.now_ms()
        monitor.receive("edgemon/v1/near/events", _chunk("s", now, 0, 100), now, out)
        monitor.advance(now, out)
        handle(out)
        scheduler.poke()
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
    proxy's bind, so a configuration made afterwards no longer reaches a logger already used
    (before: every call rebuilt the logger from the current configuration)."""
    first, later = io.StringIO(), io.StringIO()
    configure_logging(LogSettings(format="json", level="info"), stream=first)
    log = structlog.get_logger("edgemon")
    log.info("one")
    configure_logging(LogSettings(format="json", level="info"), stream=later)
    log.info("two")
    assert [json.loads(line)["event"] for line in first.getvalue().splitlines()] == ["one", "two"]
    assert later.getvalue() == ""


def test_read_buffer_serves_paho_from_one_read_of_the_socket() -> None:
    """Three PUBLISH-sized packets written at once: paho's first 1-byte `recv` reads them
    all from the socket, the later `recv`s are served from the buffer (`pending()` counts
    what is left), sizes are respected, and an empty socket raises BlockingIOError as the
    socket itself would; b"" at the end of the stream."""
    left, right = socket.socketpair()
    with left, right:
        right.setblocking(False)
        reader = ReadBuffer(right)
        data = b"".join(bytes((0x32, 5)) + bytes([n]) * 5 for n in range(3))
        left.sendall(data)
        got = bytearray(reader.recv(1))
        assert reader.pending() == len(data) - 1  # one read took the whole block
        while reader.pending():
            got += reader.recv(1)
            got += reader.recv(1 + len(got) % 6)
        assert bytes(got) == data
        with pytest.raises(BlockingIOError):
            reader.recv(1)
        left.close()
        assert reader.recv(1) == b""
        assert reader.fileno() == right.fileno()


def test_the_private_paho_parts_the_intake_relies_on_are_there() -> None:
    """The intake swaps paho's socket for a `ReadBuffer` (`Client._sock`) and queues its
    batched PUBACKs as one packet (`Client._packet_queue(command, packet, mid, qos)`): a paho
    release that renames either must fail here, not quietly read past the buffer."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="pinned")
    assert "_sock" in vars(client)
    assert client._sock is None  # not connected: paho's own slot, as the intake finds it
    queue = inspect.signature(client._packet_queue)
    assert list(queue.parameters)[:4] == ["command", "packet", "mid", "qos"]
