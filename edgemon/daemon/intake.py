"""Messages in from the socket: applied as they are read, acknowledged once durable.

Flow control, not shedding (SPEC §7). paho decodes each PUBLISH inside the event loop's
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
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from typing import TYPE_CHECKING, Any

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

#: (mid, qos, topic, payload) of one received message awaiting its acknowledgement.
Pending = tuple[int, int, str, bytes]


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
        self._fd = sock.fileno() if (sock := client.socket()) is not None else -1
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
            for _ in range(READ_BUDGET):
                before = self._received
                if client.loop_read() or self.paused or self._received == before:
                    break
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
        if not self._flush_scheduled:
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
            ack = client.ack
            recent = self._recent
            for mid, qos, topic, payload in batch:
                ack(mid, qos)
                recent.append((topic, payload))
        else:
            self._unacknowledged(batch, persistent=True)
        self._released(batch)
        if self.paused and self.pending < self._max_messages // 2:
            self._resume()

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
