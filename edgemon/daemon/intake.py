"""Messages in from the socket: applied as they are read, acknowledged once durable.

Flow control, not shedding (docs/reliability.md). paho decodes each PUBLISH inside the event loop's
reader callback for the broker's socket, and `Intake.on_publish` applies it right there: no
queue between the network and the engine, so nothing is read faster than it is applied, and
when edgemon falls behind the socket is simply read later (TCP backpressure: the broker holds
the rest). Messages read together (one loop iteration) form a batch; once the write-ahead log
says the batch is durable, its QoS 1 messages are acknowledged (PUBACK). While more than
`PENDING_MESSAGES` messages (or `PENDING_BYTES` payload bytes) wait for durability, the
socket is not read at all.

A message applied whose PUBACK could not be sent (the session ended first), or was sent so
shortly before the end that it may not have reached the broker (the last `RECENT_ACKS`), will
be delivered again by the broker, with the DUP flag, to the next session: it is acknowledged
then without being applied or counted twice. So are the messages of the write-ahead log
replayed after a crash (`expect_redelivery`): edgemon cannot know which of them it had
acknowledged. A redelivery is recognised by its DUP flag and its exact topic and payload.

Two costs paho would pay per message are paid per read and per batch instead: the socket is
read in blocks of `READ_CHUNK` bytes (`ReadBuffer`; paho asks for 1-byte headers and then
the rest, three `recv` calls per message), and a batch's PUBACKs leave in one write.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from typing import TYPE_CHECKING, Any

from paho.mqtt.client import PUBACK

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    import paho.mqtt.client as paho

#: Messages applied but not yet durable and acknowledged beyond which reading pauses.
PENDING_MESSAGES = 4096
PENDING_BYTES = 16 * 1024 * 1024
#: PUBLISH packets read per reader callback at most (then other callbacks and timers run).
READ_BUDGET = 16
#: PUBACKs sent last that may still have been in transit when a session ended.
RECENT_ACKS = 4096
#: How long after a session begins redeliveries of the previous one are still expected.
REDELIVERY_WINDOW_S = 60.0

#: Bytes asked of the socket at once (paho then takes its packets from them).
READ_CHUNK = 65_536

#: (mid, qos, topic, payload) of one received message awaiting its acknowledgement.
Pending = tuple[int, int, str, bytes]

_PUBACK_HEAD = bytes((PUBACK, 2))


class ReadBuffer:
    """paho's socket, read in blocks: `recv(n)` serves what the last block left before it
    reads the socket again, so a message costs one system call per block, not three.

    `pending()` counts what is buffered (and, for TLS, what the SSL object holds), which is
    how the reader callback knows to run again without the socket becoming readable. The
    rest is the socket's own.
    """

    __slots__ = ("_buf", "_pos", "_sock")

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._buf = b""
        self._pos = 0

    def recv(self, size: int) -> bytes:
        """Up to `size` bytes: from the buffer, else from one read of the socket (whose
        errors, such as BlockingIOError, are raised as they are; b"" at the end)."""
        buf, pos = self._buf, self._pos
        if pos >= len(buf):
            buf = self._sock.recv(max(size, READ_CHUNK))
            pos = 0
            self._buf = buf
        end = min(pos + size, len(buf))
        self._pos = end
        if pos == 0 and end == len(buf):
            return buf
        return buf[pos:end]

    def pending(self) -> int:
        """Bytes readable without the socket: buffered here, or decrypted in the SSL object."""
        inner = getattr(self._sock, "pending", None)
        return len(self._buf) - self._pos + (inner() if inner is not None else 0)

    def send(self, data: bytes | bytearray) -> int:
        """The socket's send."""
        sent: int = self._sock.send(data)
        return sent

    def close(self) -> None:
        """The socket's close."""
        self._sock.close()

    def fileno(self) -> int:
        """The socket's descriptor."""
        fileno: int = self._sock.fileno()
        return fileno

    def setblocking(self, flag: bool) -> None:
        """The socket's setblocking."""
        self._sock.setblocking(flag)


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
    ) -> None:
        self._apply = apply
        self._when_durable = when_durable
        self._max_messages, self._max_bytes = pending_limits
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: paho.Client | None = None
        self._fd = -1
        self._fail: Callable[[BaseException], None] = lambda _exc: None
        self._session = 0
        self._batch: list[Pending] = []
        self._flush_scheduled = False
        self._reading = False  # in `_readable`: it ends the batch itself
        self._reader: ReadBuffer | None = None
        #: PUBACKs of durable batches, written together once per loop iteration.
        self._acks = bytearray()
        self._acks_scheduled = False
        #: Applied, not acknowledged yet: count and payload bytes.
        self.pending = 0
        self.pending_bytes = 0
        self.paused = False
        #: Times reading was paused for durability (a flood, or a slow disk).
        self.pauses = 0
        self._received = 0
        self._redelivery: Counter[tuple[str, bytes]] = Counter()
        self._recent: deque[tuple[str, bytes]] = deque(maxlen=RECENT_ACKS)
        self._forget: asyncio.TimerHandle | None = None
        self._settled = asyncio.Event()
        self._settled.set()
        self._closed = False
        #: Redeliveries recognised and acknowledged without being applied again.
        self.redelivered = 0

    # ------------------------------------------------------------------ sessions
    def attach(self, client: paho.Client) -> None:
        """Before connecting: paho hands every PUBLISH of `client` to `on_publish` (a
        persistent session's queue comes right after CONNACK), acknowledged by us."""
        self._session += 1
        self._client = client
        client.on_message = self.on_publish
        client.manual_ack_set(on=True)

    def begin(self, fail: Callable[[BaseException], None], *, persistent: bool) -> None:
        """The session is up: read its socket with our reader from now on; `fail` reports a
        read error (the session is then over)."""
        client = self._client
        assert client is not None, "attach() first"
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._fail = fail
        sock = client.socket()
        if sock is not None and not isinstance(sock, ReadBuffer):
            client._sock = sock = ReadBuffer(sock)  # noqa: SLF001 - paho reads through it
        self._reader = sock if isinstance(sock, ReadBuffer) else None
        self._fd = sock.fileno() if sock is not None else -1
        self.paused = False
        if self._fd >= 0:
            loop.add_reader(self._fd, self._readable)
        if self._forget is not None:
            self._forget.cancel()
        self._forget = loop.call_later(REDELIVERY_WINDOW_S, self._redelivery.clear)
        if not persistent:
            self._redelivery.clear()

    def end(self, *, persistent: bool) -> None:
        """The session is over: what was applied but not acknowledged will come again (with a
        persistent session), to be recognised; reading resumes on the next session."""
        sock = None if self._client is None else self._client.socket()
        if sock is not None and sock.fileno() == self._fd >= 0 and self._loop is not None:
            self._loop.remove_reader(self._fd)  # still open: paho has not removed it itself
        self._fd = -1
        self._client = None
        self._reader = None
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
        self._redelivery.update(messages)

    # ------------------------------------------------------------------ reading
    def _readable(self) -> None:
        client = self._client
        if client is None:
            return
        try:
            reader = self._reader
            self._reading = True
            try:
                for _ in range(READ_BUDGET):
                    before = self._received
                    if client.loop_read() or self.paused or self._received == before:
                        break
                    if reader is not None and not reader.pending():
                        break  # all read is handled: the loop says when more comes
            finally:
                self._reading = False
            if self._batch and not self._flush_scheduled:
                self._flush()  # what was read together is one batch
            sock: Any = client.socket()
            if sock is not None and not self.paused and getattr(sock, "pending", int)() > 0:
                # Decrypted TLS data waits in the SSL object, not in the socket.
                self._call_soon(self._readable)
        except Exception as exc:  # noqa: BLE001 - a broken connection, whatever the form
            self._fail(exc)

    def on_publish(self, _client: object, _userdata: object, message: paho.MQTTMessage) -> None:
        """paho's on_message: apply the message (unless it is a known redelivery)."""
        self._received += 1
        if self._closed:
            return
        topic = message.topic
        payload = bytes(message.payload)  # already bytes from paho: no copy
        qos = message.qos
        if qos and message.dup and self._redelivery:
            key = (topic, payload)
            if self._redelivery[key] > 0:
                self._redelivery[key] -= 1
                self.redelivered += 1
                self._queue_ack(message.mid, qos, topic, payload)
                return
        self._apply(topic, payload)
        if qos:
            self._queue_ack(message.mid, qos, topic, payload)

    def _queue_ack(self, mid: int, qos: int, topic: str, payload: bytes) -> None:
        self._batch.append((mid, qos, topic, payload))
        self._settled.clear()
        self.pending += 1
        self.pending_bytes += len(payload)
        if not self._flush_scheduled and not self._reading:
            self._flush_scheduled = True
            self._call_soon(self._flush)
        if self.pending >= self._max_messages or self.pending_bytes >= self._max_bytes:
            self._pause()

    def _flush(self) -> None:
        """End of a batch: acknowledge it once the log says it is durable."""
        self._flush_scheduled = False
        batch, self._batch = self._batch, []
        if batch:
            session = self._session
            self._when_durable(lambda: self._acknowledge(batch, session))

    def _acknowledge(self, batch: list[Pending], session: int) -> None:
        client = self._client
        if session == self._session and client is not None:
            recent = self._recent
            acks = self._acks
            for mid, qos, topic, payload in batch:
                if qos == 1:  # PUBACK, success (MQTT 3.1.1 and 5): 0x40, length 2, mid
                    acks += _PUBACK_HEAD + mid.to_bytes(2, "big")
                else:
                    client.ack(mid, qos)
                recent.append((topic, payload))
            if acks and not self._acks_scheduled:
                self._acks_scheduled = True
                self._call_soon(self._send_acks)
        else:
            self._unacknowledged(batch, persistent=True)
        self._released(batch)
        if self.paused and self.pending < self._max_messages // 2:
            self._resume()

    def _send_acks(self) -> None:
        """The PUBACKs of every batch made durable since the last call, as one packet to
        paho: one write for all of them (paho writes each packet it is given on its own)."""
        self._acks_scheduled = False
        acks, self._acks = self._acks, bytearray()
        if acks and self._client is not None:
            self._client._packet_queue(PUBACK, bytes(acks), 0, 0)  # noqa: SLF001

    def _released(self, batch: list[Pending]) -> None:
        self.pending -= len(batch)
        self.pending_bytes -= sum(len(item[3]) for item in batch)
        if not self.pending:
            self._settled.set()

    async def settle(self) -> None:
        """Take no more messages (the socket is still read, for the farewell's PUBACKs; what
        arrives now is neither applied nor acknowledged, so the broker delivers it again to
        the next session), then wait until every message applied is durable and acknowledged:
        a clean stop leaves nothing for the broker to deliver twice."""
        self._closed = True
        self._flush()
        await self._settled.wait()
        self._send_acks()  # before the farewell and DISCONNECT are queued

    def _unacknowledged(self, batch: list[Pending], *, persistent: bool) -> None:
        if persistent:
            self._redelivery.update((topic, payload) for _, _, topic, payload in batch)

    # ------------------------------------------------------------------ flow control
    def _pause(self) -> None:
        if self.paused:
            return
        self.paused = True
        self.pauses += 1
        if self._fd >= 0 and self._loop is not None and self._open():
            self._loop.remove_reader(self._fd)

    def _resume(self) -> None:
        self.paused = False
        if self._fd >= 0 and self._loop is not None and self._open():
            self._loop.add_reader(self._fd, self._readable)
            self._call_soon(self._readable)  # what paho or TLS had buffered already

    def _open(self) -> bool:
        sock = None if self._client is None else self._client.socket()
        return sock is not None and sock.fileno() == self._fd

    def _call_soon(self, callback: Callable[[], None]) -> None:
        loop = self._loop or asyncio.get_running_loop()
        loop.call_soon(callback)
