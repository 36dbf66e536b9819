"""Throttle objects out (protocol.md): retained, QoS 1, one per change, `seq` strictly increasing.

`seq` is `max(last seq of the device + 1, wall-clock microseconds)`. Within one run it
increases by construction; across restarts it increases because a restart takes longer than
a microsecond and the daemon's clock is the system clock at start plus monotonic time. No
state file is needed, so it also holds on a fresh or read-only state directory. It would
only break if the system clock were stepped back across a restart by more than the downtime
(microseconds stay below 2^53, so JSON readers in any language read them exactly).

Publishing never blocks the engine: changes go into an outbox keyed by topic, where a newer
object replaces one not yet sent (retained topics only need the latest); the publisher task
sends them while the broker is connected and keeps them while it is not. Devices do not wait
for each other: each topic has at most one object on its way (so a resent older object can
never land after a newer one), and up to `window` topics are on their way at once. Under a
flood the broker's PUBACKs queue behind its deliveries; one object at a time would make every
device's throttle wait for the whole backlog ahead of the previous device's PUBACK.
"""

from __future__ import annotations

import asyncio
import json
from itertools import islice
from typing import TYPE_CHECKING, Protocol

from edgemon.errors import PublishError

if TYPE_CHECKING:
    from edgemon.daemon.wall_clock import Clock
    from edgemon.engine.outputs import ThrottleChanged


class Sink(Protocol):
    """Where messages go: the MQTT link."""

    async def publish(self, topic: str, payload: bytes, *, qos: int, retain: bool) -> None:
        """Publish one message; raises PublishError when it could not be sent."""
        ...

    async def wait_connected(self) -> None:
        """Return once connected to the broker."""
        ...


class SeqSource:
    """`seq` per device: `max(last + 1, wall-clock µs)`."""

    __slots__ = ("_clock", "_last")

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._last: dict[str, int] = {}

    def next(self, device: str) -> int:
        """The next sequence number of `device`."""
        seq = int(self._clock.now_ms() * 1000)
        last = self._last.get(device)
        if last is not None and seq <= last:
            seq = last + 1
        self._last[device] = seq
        return seq

    def forget(self, device: str) -> None:
        """Drop what is kept for `device` (forgotten after `device_idle_s`). Its next `seq`
        still exceeds the last: that one was taken from a wall clock long since passed."""
        self._last.pop(device, None)


def throttle_payload(change: ThrottleChanged, seq: int, owner: str | None = None) -> bytes:
    """The throttle object of docs/protocol.md for one change; `owner`, the client id of the
    instance that publishes it, lets a gate void it when that instance is gone."""
    obj = {
        "device": change.device,
        "throttle": change.active,
        "t_ms": change.t_ms,
        "seq": seq,
        "streams": list(change.streams),
        "min_headroom_ms": change.min_headroom_ms,
        "margin_ms": change.margin_ms,
    }
    if owner is not None:
        obj["owner"] = owner
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()


class ThrottlePublisher:
    """Turns throttle changes into retained messages and sends them in order per device."""

    __slots__ = (
        "_devices",
        "_idle",
        "_on_the_way",
        "_outbox",
        "_owner",
        "_retry_s",
        "_sending",
        "_seq",
        "_sink",
        "_stalled",
        "_topic",
        "_wake",
        "_window",
        "published",
    )

    def __init__(
        self,
        sink: Sink,
        *,
        seq: SeqSource,
        topic: TopicFor,
        retry_s: float = 0.2,
        devices: frozenset[str] | None = None,
        owner: str | None = None,
        window: int = 64,
    ) -> None:
        self._sink = sink
        #: The `owner` every object names: this instance's MQTT client id.
        self._owner = owner
        #: The devices this instance owns (`[mqtt] devices`); None: every device.
        self._devices = devices
        self._seq = seq
        self._topic = topic
        self._outbox: dict[str, bytes] = {}
        #: Topics with an object sent and not yet acknowledged, or waiting to be sent again.
        self._on_the_way: set[str] = set()
        #: How many of those are sent and not yet acknowledged.
        self._sending = 0
        self._window = window
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._retry_s = retry_s
        self._stalled = False
        self.published = 0

    def submit(self, change: ThrottleChanged) -> None:
        """Queue one change (never blocks); a pending older object of the device is replaced.
        A device this instance does not own (state restored from an earlier configuration)
        gets nothing: its owner publishes its throttle."""
        if self._devices is not None and change.device not in self._devices:
            return
        topic = self._topic(change.device)
        self._outbox.pop(topic, None)
        self._outbox[topic] = throttle_payload(change, self._seq.next(change.device), self._owner)
        self._idle.clear()
        self._wake.set()

    def forget(self, device: str) -> None:
        """A forgotten device keeps no `seq` here (what is still to be sent for it is sent)."""
        self._seq.forget(device)

    @property
    def pending(self) -> int:
        """Objects not yet acknowledged by the broker."""
        return len(self._outbox) + self._sending

    @property
    def busy(self) -> bool:
        """Whether an object is about to be sent or being sent (until the broker's PUBACK);
        not while the publisher waits for a session or to retry."""
        if self._stalled:
            return False
        return self._sending > 0 or any(t not in self._on_the_way for t in self._outbox)

    async def drain(self) -> None:
        """Return once everything submitted so far has been published."""
        await self._idle.wait()

    async def run(self) -> None:
        """Send the outbox forever (the `publisher` task; each object is sent by a task of
        its own, which this one owns)."""
        outbox, on_the_way = self._outbox, self._on_the_way
        async with asyncio.TaskGroup() as sends:
            while True:
                self._wake.clear()
                # Outbox topics on their way are at most `window`: the scan stops early.
                free = self._window - len(on_the_way)  # never below 0: only this loop adds
                ready = list(islice((t for t in outbox if t not in on_the_way), free))
                if not ready:
                    if not outbox and not on_the_way:
                        self._idle.set()
                    await self._wake.wait()
                    continue
                self._stalled = True
                await self._sink.wait_connected()
                self._stalled = False
                for topic in ready:
                    on_the_way.add(topic)
                    self._sending += 1  # busy from now, before its task first runs
                    sends.create_task(self._send(topic, outbox.pop(topic)))

    async def _send(self, topic: str, payload: bytes) -> None:
        """Publish one object; on failure keep it (unless a newer one came meanwhile) and hold
        the topic back for `retry_s`."""
        try:
            if await self._acknowledged(topic, payload):
                self.published += 1
            else:
                self._outbox.setdefault(topic, payload)
                await asyncio.sleep(self._retry_s)
        finally:
            self._on_the_way.discard(topic)
            self._wake.set()

    async def _acknowledged(self, topic: str, payload: bytes) -> bool:
        """Whether the broker acknowledged the object (one of `_sending` until then)."""
        try:
            await self._sink.publish(topic, payload, qos=1, retain=True)
        except PublishError:
            return False
        finally:
            self._sending -= 1
        return True


class TopicFor(Protocol):
    """The throttle topic of a device."""

    def __call__(self, device: str, /) -> str:
        """The topic."""
        ...
