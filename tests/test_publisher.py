"""The throttle publisher's `busy`: what a scrape waits for before its next slice."""

from __future__ import annotations

import asyncio

import pytest

from edgemon.adapters.exposition import Slicer
from edgemon.daemon.publisher import SeqSource, ThrottlePublisher
from edgemon.daemon.wall_clock import MonotonicWallClock
from edgemon.engine.outputs import ThrottleChanged

CHANGE = ThrottleChanged(
    "dev", 1.0, active=True, streams=("s",), min_headroom_ms=5.0, margin_ms=80.0
)


class Sink:
    """A broker link that is up or down on demand; a publish completes when `ack` is set."""

    def __init__(self) -> None:
        self.up = asyncio.Event()
        self.ack = asyncio.Event()
        self.sent: list[str] = []

    async def publish(self, topic: str, _payload: bytes, *, qos: int, retain: bool) -> None:
        assert (qos, retain) == (1, True)
        await self.ack.wait()
        self.sent.append(topic)

    async def wait_connected(self) -> None:
        await self.up.wait()


@pytest.mark.asyncio
async def test_busy_from_submit_to_the_brokers_ack_but_not_while_offline() -> None:
    """Idle: not busy. A submitted object makes it busy until the broker acknowledges it;
    while there is no session the publisher only waits, and a scrape must not wait with it."""
    sink = Sink()
    publisher = ThrottlePublisher(
        sink, seq=SeqSource(MonotonicWallClock()), topic=lambda device: f"t/{device}"
    )
    task = asyncio.create_task(publisher.run())
    await asyncio.sleep(0)
    assert not publisher.busy
    publisher.submit(CHANGE)
    assert publisher.busy  # before the publisher task has even run
    await asyncio.sleep(0)
    assert not publisher.busy  # waiting for a session: offline
    sink.up.set()
    for _ in range(3):
        await asyncio.sleep(0)
    assert publisher.busy  # sent, not yet acknowledged
    sink.ack.set()
    async with asyncio.timeout(5):
        await publisher.drain()
    assert not publisher.busy
    assert sink.sent == ["t/dev"]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.asyncio
async def test_no_slice_starts_while_a_throttle_object_is_on_its_way_out() -> None:
    """The slicer hands the loop over until `busy` turns false (here: after 5 turns of the
    loop), and waits at most `max_wait_s` for a publisher that stays busy."""
    polls: list[int] = []

    def busy() -> bool:
        polls.append(1)
        return len(polls) <= 5

    slicer = Slicer(0.0, busy=busy)
    await slicer()
    assert len(polls) == 6
    stuck = Slicer(0.0, busy=lambda: True, max_wait_s=0.01)
    async with asyncio.timeout(5):
        await stuck()


@pytest.mark.asyncio
async def test_a_device_not_owned_gets_no_throttle_object() -> None:
    """With `[mqtt] devices` ("own"), a change of another device (state restored from an
    earlier configuration) is not sent: its owner publishes that device's throttle. The
    owned device's change is."""
    sink = Sink()
    sink.up.set()
    sink.ack.set()
    publisher = ThrottlePublisher(
        sink, seq=SeqSource(MonotonicWallClock()), topic=lambda d: f"p/{d}/throttle",
        devices=frozenset({"own"}),
    )  # fmt: skip
    task = asyncio.create_task(publisher.run())
    try:
        publisher.submit(CHANGE)  # device "dev": not owned
        publisher.submit(ThrottleChanged("own", 1.0, active=True, streams=("s",),
                                         min_headroom_ms=5.0, margin_ms=80.0))  # fmt: skip
        async with asyncio.timeout(10):
            await publisher.drain()
    finally:
        task.cancel()
    assert sink.sent == ["p/own/throttle"]
    assert publisher.published == 1
