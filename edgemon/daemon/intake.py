"""Messages in from the socket: applied as they are read, acknowledged once durable.

Flow control, not shedding (docs/reliability.md). The link's session splits each PUBLISH out
of what the broker's socket gave it, and `Intake.read` applies it right there: no queue
between the network and the engine, so nothing is read faster than it is applied, and
when edgemon falls behind the socket is simply read later (TCP backpressure: the broker holds
the rest). Messages read together (one loop iteration) form a batch; once the write-ahead log
says the batch is durable, its QoS 1 messages are acknowledged (PUBACK), in the order they
were received; a QoS 2 one (a broker should send none: edgemon subscribes at QoS 1) the same
way with PUBREC, the session answering the broker's PUBREL. While more than
`PENDING_MESSAGES` messages (or `PENDING_BYTES` payload bytes) wait for durability, QoS 0 ones
included (the log holds them too), the socket is not read at all (`paused`): a log that
cannot write holds every acknowledgement, and the broker keeps what follows.

A message applied whose PUBACK could not be sent (the session ended first), or was sent so
shortly before the end that it may not have reached the broker (the last `RECENT_ACKS`), will
be delivered again by the broker, with the DUP flag, to the next session (in the first
`REDELIVERY_WINDOW_S` of it, on `clock`): it is acknowledged then without being applied or
counted twice. So are the messages of the write-ahead log replayed after a crash
(`expect_redelivery`): edgemon cannot know which of them it had acknowledged. A redelivery is
recognised by its DUP flag and its exact topic and payload, through their digest
(`message_digest`, 16 bytes): what is remembered of a message is its digest and its size, never
its payload, so memory stays bounded in bytes whatever the payloads weigh (at most
`RECENT_ACKS` digests, and one per message awaiting durability).

Two costs a general-purpose client would pay per message are paid per read and per batch
instead: the socket is read in blocks (asyncio hands the connection whatever the socket holds,
which the session splits into packets itself), and the PUBACKs of every batch made durable in
one loop iteration leave in one write.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import Counter, deque
from typing import TYPE_CHECKING, Protocol

from edgemon.daemon.mqtt_codec import acknowledgement
from edgemon.daemon.mqtt_session import TooLarge

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from edgemon.daemon.mqtt_session import Event, Session

#: Messages applied but not yet durable and acknowledged beyond which reading pauses. The
#: log holds their lines meanwhile (and a commit their join): the bytes bound keeps that
#: within the daemon's memory budget however large the payloads (`benchmarks/hostile.py`).
PENDING_MESSAGES = 4096
PENDING_BYTES = 8 * 1024 * 1024
#: PUBACKs sent last that may still have been in transit when a session ended.
RECENT_ACKS = 4096
#: How long after a session begins redeliveries of the previous one are still expected.
REDELIVERY_WINDOW_S = 60.0

#: (its PUBACK or PUBREC, empty at QoS 0; the digest of its topic and payload, None at QoS 0;
#: its payload's size) of one received message awaiting durability.
Pending = tuple[bytes, bytes | None, int]


def message_digest(topic: str, payload: bytes) -> bytes:
    """What a redelivery is recognised by: 16 bytes of BLAKE2b over the topic and payload."""
    digest = hashlib.blake2b(topic.encode(), digest_size=16)
    digest.update(b"\0")
    digest.update(payload)
    return digest.digest()


class Wire(Protocol):
    """The session's side the intake drives: writing acknowledgements, and reading."""

    def write(self, data: bytes) -> None:
        """Send `data` to the broker now (dropped if the connection is gone)."""

    def pause_reading(self) -> None:
        """Read no more from the broker until `resume_reading`."""

    def resume_reading(self) -> None:
        """Read again, starting with what was received but not handled yet."""


def _no_wal(callback: Callable[[], None]) -> None:
    callback()


class Intake:
    """One broker connection's reading and acknowledging, across sessions."""

    def __init__(
        self,
        apply: Callable[[str, bytes], None],
        *,
        when_durable: Callable[[Callable[[], None]], None] = _no_wal,
        pending_limits: tuple[int, int] = (PENDING_MESSAGES, PENDING_BYTES),
        topics: frozenset[str] | None = None,
        too_large: Callable[[str, int], None] = lambda _topic, _size: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock`: monotonic seconds, for how long redeliveries are expected."""
        self._apply = apply
        self._clock = clock
        #: Told of each message too large to read (topic, packet size).
        self._too_large = too_large
        #: The topics this instance reads (its own devices'), or None for any.
        self._topics = topics
        #: Messages on other topics (another instance's devices): acknowledged, not applied.
        self.foreign = 0
        self._when_durable = when_durable
        self._max_messages, self._max_bytes = pending_limits
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wire: Wire | None = None
        self._session = 0
        self._batch: list[Pending] = []
        #: PUBACKs of durable batches, written together once per loop iteration.
        self._acks = bytearray()
        self._acks_scheduled = False
        #: Applied, not acknowledged yet: count and payload bytes.
        self.pending = 0
        self.pending_bytes = 0
        self.paused = False
        #: Times reading was paused for durability (a flood, or a slow disk).
        self.pauses = 0
        self._redelivery: Counter[bytes] = Counter()
        #: Until when (`clock`) the redeliveries in `_redelivery` may come.
        self._expected_until = float("inf")
        self._recent: deque[bytes] = deque(maxlen=RECENT_ACKS)
        self._drained = asyncio.Event()
        self._drained.set()
        self._closed = False
        #: Redeliveries recognised and acknowledged without being applied again.
        self.redelivered = 0

    # ------------------------------------------------------------------ sessions
    def begin(self, wire: Wire, *, persistent: bool) -> None:
        """CONNACK accepted: the messages of this session come to `on_message` from now on
        (a persistent session's queue comes right after CONNACK), acknowledged through
        `wire`."""
        self._loop = asyncio.get_running_loop()
        self._session += 1
        self._wire = wire
        self.paused = False
        self._expected_until = self._clock() + REDELIVERY_WINDOW_S
        if not persistent:
            self._redelivery.clear()

    def end(self, *, persistent: bool) -> None:
        """The session is over: what was applied but not acknowledged will come again (with a
        persistent session), to be recognised; reading resumes on the next session."""
        self._wire = None
        self._acks = bytearray()  # not sent: in `_recent`, so expected again
        self._session += 1
        batch, self._batch = self._batch, []
        self._unacknowledged(batch, persistent=persistent)
        self._released(batch)
        if persistent:  # acknowledged last: the PUBACK may not have reached the broker
            self._redelivery.update(self._recent)
        self._recent.clear()
        self.paused = False

    def expect_redelivery(self, messages: Iterable[tuple[str, bytes]]) -> None:
        """Messages already applied (a replayed log) that the broker may deliver again."""
        self._redelivery.update(message_digest(topic, payload) for topic, payload in messages)

    # ------------------------------------------------------------------ reading
    def read(
        self, session: Session, now: float, *, budget: int, control: Callable[[Event], None]
    ) -> bool:
        """Take one batch of what `session` received: each message applied (`budget` of them
        at most), one too large reported, anything else (a CONNACK, an answer) handed to
        `control`; until the intake pauses or nothing whole is left. Whether the budget ran
        out with more left to take."""
        try:
            while not self.paused:
                event = session.next_event(now)
                if event is None:
                    return False
                if type(event) is tuple:  # a Message
                    self.on_message(*event)
                    budget -= 1
                    if not budget:
                        return session.buffer.pending > 0
                elif type(event) is TooLarge:
                    self.on_too_large(event.topic, event.size, event.qos, event.mid)
                else:
                    control(event)
            return False
        finally:
            self.end_batch()

    def on_message(self, topic: str, payload: bytes, qos: int, dup: bool, mid: int) -> None:
        """One PUBLISH received: apply it (unless it is a known redelivery); a QoS 1 one is
        acknowledged once durable. The connection calls `end_batch` after what it read
        together."""
        if self._closed:
            return
        digest = message_digest(topic, payload) if qos else None
        if digest is not None and dup and self._redelivered(digest):
            self._queue(acknowledgement(qos, mid), digest, len(payload))
            return
        if self._topics is not None and topic not in self._topics:
            self.foreign += 1  # a subscription an earlier configuration left on the broker
        else:
            self._apply(topic, payload)
        self._queue(acknowledgement(qos, mid) if qos else b"", digest, len(payload))

    def _redelivered(self, digest: bytes) -> bool:
        """Whether a message with the DUP flag is one expected again (then counted as such);
        what was expected is forgotten `REDELIVERY_WINDOW_S` after the session began."""
        expected = self._redelivery
        if not expected:
            return False
        if self._clock() >= self._expected_until:
            expected.clear()
            return False
        if expected[digest] <= 0:
            return False
        expected[digest] -= 1
        self.redelivered += 1
        return True

    def on_too_large(self, topic: str, size: int, qos: int, mid: int) -> None:
        """A PUBLISH too large to read (MQTT 3.1.1: dropped as it arrives): not applied,
        reported, and acknowledged in its turn so that the broker does not deliver it again."""
        if self._closed:
            return
        self._too_large(topic, size)
        if qos:
            self._queue(acknowledgement(qos, mid), message_digest(topic, b""), 0)

    def end_batch(self) -> None:
        """What was read together has been applied: it is one batch for the log."""
        if self._batch:
            self._flush()

    def _queue(self, ack: bytes, digest: bytes | None, size: int) -> None:
        """A message awaiting durability (with its acknowledgement, unless QoS 0)."""
        self._batch.append((ack, digest, size))
        self._drained.clear()
        self.pending += 1
        self.pending_bytes += size
        if self.pending >= self._max_messages or self.pending_bytes >= self._max_bytes:
            self._pause()

    def _flush(self) -> None:
        """End of a batch: acknowledge it once the log says it is durable."""
        batch, self._batch = self._batch, []
        if batch:
            session = self._session
            self._when_durable(lambda: self._acknowledge(batch, session))

    def _acknowledge(self, batch: list[Pending], session: int) -> None:
        if session == self._session and self._wire is not None:
            recent = self._recent
            acks = self._acks
            for ack, digest, _ in batch:  # in the order received
                if digest is not None:
                    acks += ack
                    recent.append(digest)
            if not self._acks_scheduled:
                self._acks_scheduled = True
                self._call_soon(self._send_acks)
        else:
            self._unacknowledged(batch, persistent=True)
        self._released(batch)
        if self.paused and self.pending < self._max_messages // 2:
            self._resume()

    def _send_acks(self) -> None:
        """The PUBACKs of every batch made durable since the last call, in one write."""
        self._acks_scheduled = False
        acks, self._acks = self._acks, bytearray()
        if acks and self._wire is not None:
            self._wire.write(bytes(acks))

    def _released(self, batch: list[Pending]) -> None:
        self.pending -= len(batch)
        self.pending_bytes -= sum(item[2] for item in batch)
        if not self.pending:
            self._drained.set()

    async def drain(self) -> None:
        """Take no more messages (the socket is still read, for the farewell's PUBACKs; what
        arrives now is neither applied nor acknowledged, so the broker delivers it again to
        the next session), then wait until every message applied is durable and acknowledged:
        a clean stop leaves nothing for the broker to deliver twice."""
        self._closed = True
        self._flush()
        await self._drained.wait()
        self._send_acks()  # before the farewell and DISCONNECT are queued

    def _unacknowledged(self, batch: list[Pending], *, persistent: bool) -> None:
        if persistent:
            self._redelivery.update(digest for _, digest, _ in batch if digest is not None)

    # ------------------------------------------------------------------ flow control
    def _pause(self) -> None:
        if self.paused:
            return
        self.paused = True
        self.pauses += 1
        if self._wire is not None:
            self._wire.pause_reading()

    def _resume(self) -> None:
        self.paused = False
        if self._wire is not None:
            self._wire.resume_reading()

    def _call_soon(self, callback: Callable[[], None]) -> None:
        loop = self._loop or asyncio.get_running_loop()
        loop.call_soon(callback)
