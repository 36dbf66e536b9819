"""The throttle publisher: its `busy` (what a scrape waits for before its next slice), and
how objects go out: one per topic on its way, topics at once, the newest after a failure."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

import pytest
import pytest_asyncio

from edgemon.adapters.exposition import Slicer
from edgemon.daemon.publisher import SeqSource, ThrottlePublisher
from edgemon.daemon.wall_clock import MonotonicWallClock
from edgemon.engine.outputs import ThrottleChanged
from edgemon.errors import PublishError

from links import until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


def change(device: str, *, active: bool = True) -> ThrottleChanged:
    """A throttle change of `device`."""
    return ThrottleChanged(
        device, 1.0, active=active, streams=("s",), min_headroom_ms=5.0, margin_ms=80.0
    )


async def settle() -> None:
    """Let every task that can run do so (before asserting that nothing more happened)."""
    for _ in range(10):
        await asyncio.sleep(0)


CHANGE = change("dev")


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
        publisher.submit(change("own"))
        async with asyncio.timeout(10):
            await publisher.drain()
    finally:
        task.cancel()
    assert sink.sent == ["p/own/throttle"]
    assert publisher.published == 1


class HeldSink:
    """A connected broker link that holds every publish until the test answers it:
    `answer(i)` acknowledges the i-th call, `answer(i, ok=False)` refuses it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self._answers: list[asyncio.Future[bool]] = []

    async def publish(self, topic: str, payload: bytes, *, qos: int, retain: bool) -> None:
        assert (qos, retain) == (1, True)
        answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.calls.append((topic, json.loads(payload)["seq"]))
        self._answers.append(answer)
        if not await answer:
            raise PublishError("refused")

    async def wait_connected(self) -> None:
        return

    def answer(self, call: int, *, ok: bool = True) -> None:
        """Answer the `call`-th publish."""
        self._answers[call].set_result(ok)


@pytest_asyncio.fixture
async def held(request: pytest.FixtureRequest) -> AsyncIterator[tuple[ThrottlePublisher, HeldSink]]:
    """A running publisher (retry after 10 ms; `window` the test's parameter, else 64) on a
    `HeldSink`."""
    sink = HeldSink()
    publisher = ThrottlePublisher(
        sink, seq=SeqSource(MonotonicWallClock()), topic=lambda d: f"t/{d}", retry_s=0.01,
        window=getattr(request, "param", 64),
    )  # fmt: skip
    task = asyncio.create_task(publisher.run())
    try:
        yield publisher, sink
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


@pytest.mark.asyncio
async def test_a_device_does_not_wait_for_another_devices_puback(
    held: tuple[ThrottlePublisher, HeldSink],
) -> None:
    """Device a's object is sent and its PUBACK does not come (under a flood it waits behind
    the broker's whole backlog); device b's object goes out meanwhile and is acknowledged
    while a's is still on its way: both pending until then, a's alone after."""
    publisher, sink = held
    publisher.submit(change("a"))
    await until(lambda: len(sink.calls) == 1, "a's object sent")
    publisher.submit(change("b"))
    await until(lambda: len(sink.calls) == 2, "b's object sent while a's waits")
    assert [topic for topic, _ in sink.calls] == ["t/a", "t/b"]
    assert publisher.pending == 2
    sink.answer(1)
    await until(lambda: publisher.published == 1, "b's object acknowledged")
    assert publisher.pending == 1
    assert publisher.busy
    sink.answer(0)
    async with asyncio.timeout(10):
        await publisher.drain()
    assert (publisher.published, publisher.pending, publisher.busy) == (2, 0, False)


@pytest.mark.asyncio
async def test_one_object_per_topic_on_its_way_and_the_newest_follows(
    held: tuple[ThrottlePublisher, HeldSink],
) -> None:
    """While a device's object waits for its PUBACK, two newer changes of the device are not
    sent: the second replaces the first in the outbox, and only it follows the PUBACK. A
    retained topic only needs the latest, and one object on its way per topic keeps the
    broker's order the order of `seq`."""
    publisher, sink = held
    publisher.submit(change("a"))
    await until(lambda: len(sink.calls) == 1, "the first object sent")
    publisher.submit(change("a", active=False))
    publisher.submit(change("a"))
    await settle()
    assert len(sink.calls) == 1
    sink.answer(0)
    await until(lambda: len(sink.calls) == 2, "the newest object sent")
    sink.answer(1)
    async with asyncio.timeout(10):
        await publisher.drain()
    (first, one), (second, other) = sink.calls
    assert (first, second, publisher.published) == ("t/a", "t/a", 2)
    assert other >= one + 2  # the newest: the one between never went out


@pytest.mark.asyncio
async def test_a_refused_object_is_sent_again_unless_a_newer_one_came(
    held: tuple[ThrottlePublisher, HeldSink],
) -> None:
    """A refused object is sent again after `retry_s`; refused while a newer change of the
    device came, the newer one is sent instead and the refused one never again."""
    publisher, sink = held
    publisher.submit(change("a"))
    await until(lambda: len(sink.calls) == 1, "sent")
    sink.answer(0, ok=False)
    await until(lambda: len(sink.calls) == 2, "sent again")
    assert sink.calls[1] == sink.calls[0]
    publisher.submit(change("a", active=False))
    sink.answer(1, ok=False)
    await until(lambda: len(sink.calls) == 3, "the newer one sent")
    assert sink.calls[2][1] > sink.calls[1][1]
    sink.answer(2)
    async with asyncio.timeout(10):
        await publisher.drain()
    assert (len(sink.calls), publisher.published) == (3, 1)


@pytest.mark.asyncio
@pytest.mark.parametrize("held", [2], indirect=True)
async def test_at_most_window_devices_objects_are_on_their_way(
    held: tuple[ThrottlePublisher, HeldSink],
) -> None:
    """With a window of 2, three devices' objects: two go out, the third once one of them is
    acknowledged."""
    publisher, sink = held
    for device in "abc":
        publisher.submit(change(device))
    await until(lambda: len(sink.calls) == 2, "two objects sent")
    await settle()
    assert [topic for topic, _ in sink.calls] == ["t/a", "t/b"]
    assert publisher.pending == 3
    sink.answer(0)
    await until(lambda: len(sink.calls) == 3, "the third sent")
    sink.answer(1)
    sink.answer(2)
    async with asyncio.timeout(10):
        await publisher.drain()
    assert publisher.published == 3
