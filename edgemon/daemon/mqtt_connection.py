"""One TCP connection to the broker, from connect to close: an asyncio `Protocol`.

The MQTT session (the broker's subscriptions and queue for edgemon's client id) outlives it:
`mqtt.MqttLink` opens one connection after another for the same session.

asyncio reads the socket (or the TLS layer) in blocks and hands them to `data_received`; the
connection keeps what it has not handled in a `PacketBuffer`, splits it into packets
(`mqtt_codec`, refusing any larger than `max_packet` as soon as its header says so) and gives
each PUBLISH to the `Intake`, which applies it there and then. At most `READ_BUDGET` messages
are handled per callback: if more are waiting, the transport stops reading and the rest is
handled on the next loop iteration, after the timers due meanwhile (a throttle onset must not
wait behind a backlog). While the intake is `paused` (too much waiting to be durable), nothing
more is handled and the transport is not read: the broker holds the rest (TCP backpressure).

Liveness, whatever edgemon writes: when nothing was received (or sent) for a keep-alive, a
PINGREQ goes out; when nothing answers it within half a keep-alive, the connection ends. So a
broker gone silent (a half-open link, a hung broker whose kernel still ACKs) is noticed within
1.5 keep-alives of the last thing it said, paused intake or not (a pause that long ends the
connection too: nothing is lost, what was not acknowledged comes again). A SUBSCRIBE,
UNSUBSCRIBE or PUBLISH not answered within `ack_timeout_s` ends it as well, counted from the
later of its sending and the last message the broker delivered: an answer queued behind a
backlog the broker is still delivering (a flood read at the speed edgemon applies it) is late,
not lost, and ending the connection for it would drop the QoS 0 part of that backlog.

The rest: CONNACK (then `on_accepted`, before any message is handled), SUBACK, UNSUBACK and
PUBACK to whoever waits for them, PUBREL answered with PUBCOMP (a QoS 2 message), and on MQTT 5
the broker's DISCONNECT and its limits on what edgemon sends (Receive Maximum, Maximum Packet
Size, Maximum QoS). The connection ends with `ended`: None after `close()`, else the error.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import deque
from typing import TYPE_CHECKING

from edgemon.daemon import mqtt_codec as codec
from edgemon.daemon.mqtt_buffer import PacketBuffer

if TYPE_CHECKING:
    from collections.abc import Callable

    from edgemon.daemon.intake import Intake

#: PUBLISH packets handled per `data_received` (or continuation) at most.
READ_BUDGET = 16
#: How long a clean close waits for the broker to close its side.
CLOSE_TIMEOUT_S = 2.0
#: MQTT 5's defaults for what a CONNACK leaves out (unlimited but for the field's size).
_UNLIMITED_QUOTA = 65_535


class ConnectionLostError(Exception):
    """The connection ended (or never came up); `reason` is the broker's MQTT 5 reason code,
    when it gave one (142: the session was taken over)."""

    def __init__(self, message: str, *, reason: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class NotSendableError(Exception):
    """A packet the broker said it would not take (larger than its Maximum Packet Size)."""


class Connection(asyncio.Protocol):
    """The protocol of one broker connection (`loop.create_connection(lambda: conn, …)`)."""

    def __init__(
        self,
        intake: Intake,
        *,
        version: int,
        keepalive_s: int,
        on_accepted: Callable[[Connection, codec.Connack], None],
        max_packet: int = codec.MAX_REMAINING_LENGTH,
        ack_timeout_s: float | None = None,
    ) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._intake = intake
        self._version = version
        self._keepalive_s = keepalive_s
        #: How long the broker may take to answer a request before the connection is ended.
        self._ack_timeout_s = ack_timeout_s or float(keepalive_s)
        self._on_accepted = on_accepted
        self._max_packet = max_packet
        self._transport: asyncio.Transport | None = None
        #: What was received and not handled yet.
        self.buffer = PacketBuffer()
        #: The broker's CONNACK (an exception if the connection ends before it).
        self.connack: asyncio.Future[codec.Connack] = loop.create_future()
        #: Set when the connection is gone: None after `close()`, else why it ended.
        self.ended: asyncio.Future[BaseException | None] = loop.create_future()
        self._accepted = False
        #: SUBACK, UNSUBACK and PUBACK answers awaited, by packet id (None: connection lost).
        #: An id stays here until its answer comes, even if its caller gave up meanwhile.
        self._waiting: dict[int, asyncio.Future[bytes | None]] = {}
        #: QoS 1 PUBLISHes sent and not acknowledged (the broker's Receive Maximum bounds them).
        self._in_flight: set[int] = set()
        self._quota_waiters: deque[asyncio.Future[None]] = deque()
        #: What the broker's CONNACK allows (MQTT 5; 3.1.1 has no such limits).
        self.send_quota = _UNLIMITED_QUOTA
        self.max_send_packet = codec.MAX_REMAINING_LENGTH
        self.max_qos = 2
        #: Why the connection ended, for those waiters.
        self._lost: ConnectionLostError | None = None
        self._mid = 0
        self._error: BaseException | None = None
        self._closing = False
        self._not_reading = False  # the transport's reading paused by us
        self._continue: asyncio.Handle | None = None
        #: Bytes of a PUBLISH too large to read that are still to come, to be dropped.
        self._skip = 0
        self._last_write = self._last_read = loop.time()
        #: When a PUBLISH from the broker was last handled: the broker is delivering.
        self._last_delivery = float("-inf")
        self._ping_sent: float | None = None
        self._keepalive: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ asyncio's side
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Connected: no Nagle delay (a throttle object must not wait for the broker's
        delayed ACK of the PUBACK written just before it)."""
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in {socket.AF_INET, socket.AF_INET6}:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        """A block of what the broker sent: handled now, up to the budget."""
        self._last_read = self._loop.time()
        if self._skip:
            dropped = min(self._skip, len(data))
            self._skip -= dropped
            if dropped == len(data):
                return
            data = data[dropped:]
        self.buffer.feed(data)
        if self._continue is None:
            self._handle()

    def eof_received(self) -> bool:
        """The broker closed its side: the connection is over."""
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        """The connection is gone: every waiter learns it."""
        self._transport = None
        if self._keepalive is not None:
            self._keepalive.cancel()
        if self._continue is not None:
            self._continue.cancel()
            self._continue = None
        error = self._error or exc
        if error is None and not self._closing:
            error = ConnectionLostError("the broker closed the connection")
        lost = error if isinstance(error, ConnectionLostError) else None
        lost = lost or ConnectionLostError(_describe(error))
        self._lost = lost
        if not self.connack.done():
            self.connack.set_exception(lost)
        for waiter in self._waiting.values():
            if not waiter.done():
                # None, not an exception: a waiter cancelled meanwhile never reads it.
                waiter.set_result(None)
        for quota in self._quota_waiters:
            if not quota.done():
                quota.set_result(None)
        self._waiting.clear()
        self._quota_waiters.clear()
        if not self.ended.done():
            self.ended.set_result(error)

    # ------------------------------------------------------------------ reading
    def _handle(self) -> None:
        """Handle the complete packets received, up to READ_BUDGET messages."""
        self._continue = None
        intake = self._intake
        buffer = self.buffer
        buf, pos = buffer.data, buffer.pos
        whole = type(buf) is bytes  # a block read in place: slices are bytes already
        version = self._version
        limit = self._max_packet
        budget = READ_BUDGET
        more = False
        try:
            while not intake.paused:
                try:
                    where = codec.split(buf, pos, limit) if len(buf) - pos >= 2 else None
                except codec.PacketTooLargeError as error:
                    after = self._too_large(buf, pos, error)
                    if after is None:
                        break
                    pos = after
                    continue
                if where is None:
                    break
                if not budget:
                    more = True
                    break
                start, end = where
                first = buf[pos]
                # bytes(<bytes>) is the same object: one copy either way.
                body = bytes(buf[start:end]) if whole else bytes(memoryview(buf)[start:end])
                if first & 0xF0 == codec.PUBLISH and self._accepted:
                    topic, payload, qos, dup, mid = codec.decode_publish(
                        first, body, version=version
                    )
                    intake.on_message(topic, payload, qos, dup, mid)
                    budget -= 1
                else:
                    self._control(first, body)
                pos = end
        except Exception as exc:  # noqa: BLE001 - a broken connection, whatever the form
            buffer.pos = pos
            self.fail(exc)
            return
        finally:
            intake.end_batch()
        if budget < READ_BUDGET:
            self._last_delivery = self._loop.time()
        buffer.pos = pos
        if more and not intake.paused:
            self._continue = self._loop.call_soon(self._handle)
        self._read(on=not more and not intake.paused)

    def _too_large(
        self, buf: bytes | bytearray, pos: int, error: codec.PacketTooLargeError
    ) -> int | None:
        """A packet larger than edgemon reads, at `pos`. On MQTT 3.1.1 a PUBLISH (which the
        broker cannot be told to hold back) is dropped as it arrives, never buffered, and
        acknowledged in its turn, so the broker does not deliver it again: where reading goes
        on (None until its topic and packet id are in). Anything else: `error` (on MQTT 5
        the broker was told the limit, and the standard makes it a protocol error)."""
        first = buf[pos]
        if self._version != codec.V311 or first & 0xF0 != codec.PUBLISH or not self._accepted:
            raise error
        head = codec.publish_head(buf, pos)
        if head is None:
            return None
        topic, qos, mid = head
        self._intake.on_too_large(topic, error.size, qos, mid)
        end = pos + error.size
        if end <= len(buf):
            return end
        self._skip = end - len(buf)
        return len(buf)

    def _read(self, *, on: bool) -> None:
        transport = self._transport
        if transport is None or on != self._not_reading:
            return
        self._not_reading = not on
        if on:
            transport.resume_reading()
        else:
            transport.pause_reading()

    def pause_reading(self) -> None:
        """The intake is full: read no more until `resume_reading`."""
        self._read(on=False)

    def resume_reading(self) -> None:
        """The intake has room again: what was received is handled, then reading resumes."""
        if self._continue is None and self._transport is not None:
            self._continue = self._loop.call_soon(self._handle)

    def _control(self, first: int, body: bytes) -> None:
        if first not in codec.FROM_BROKER:
            raise codec.ProtocolError(f"unexpected packet 0x{first:02x} from the broker")
        if first == codec.CONNACK and not self.connack.done():
            self._connack(codec.decode_connack(body, version=self._version))
        elif first in {codec.PUBACK, codec.SUBACK, codec.UNSUBACK} and self._accepted:
            if first == codec.PUBACK:
                mid, code = codec.decode_puback(body)
                answer = bytes((code,))
                self._acknowledged(mid)
            else:
                mid, answer = codec.decode_suback(body, version=self._version)
            waiter = self._waiting.pop(mid, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(answer)
        elif first == codec.PUBREL and self._accepted:
            # A QoS 2 message received: it was applied and PUBREC'd once durable (`intake`);
            # the broker now forgets it, and so do we.
            self.write(codec.pubcomp(codec.decode_puback(body)[0]))
        elif first == codec.PINGRESP:
            self._ping_sent = None
        elif first == codec.DISCONNECT and self._version == codec.V5:
            reason, properties = codec.decode_disconnect(body)
            text = properties.get(codec.REASON_STRING)
            said = f": {text.decode(errors='replace')}" if isinstance(text, bytes) else ""
            raise ConnectionLostError(
                f"the broker disconnected: {codec.reason_text(reason, version=codec.V5)}{said}",
                reason=reason,
            )
        else:
            raise codec.ProtocolError(f"unexpected packet 0x{first:02x} from the broker")

    def _connack(self, connack: codec.Connack) -> None:
        properties = connack.properties
        keepalive = properties.get(codec.SERVER_KEEP_ALIVE)
        if isinstance(keepalive, int):
            self._keepalive_s = keepalive
        quota = properties.get(codec.RECEIVE_MAXIMUM)
        if isinstance(quota, int) and quota > 0:
            self.send_quota = quota
        size = properties.get(codec.MAXIMUM_PACKET_SIZE)
        if isinstance(size, int) and size > 0:
            self.max_send_packet = size
        max_qos = properties.get(codec.MAXIMUM_QOS)
        if isinstance(max_qos, int):
            self.max_qos = max_qos
        if not connack.refused:
            self._accepted = True
            self._on_accepted(self, connack)
            self._arm_keepalive()
        self.connack.set_result(connack)

    # ------------------------------------------------------------------ writing
    def write(self, data: bytes) -> None:
        """Send `data` now (nothing if the connection is gone)."""
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(data)
            self._last_write = self._loop.time()

    def _next_mid(self) -> int:
        for _ in range(0xFFFF):
            self._mid = self._mid % 0xFFFF + 1
            if self._mid not in self._waiting:
                return self._mid
        raise ConnectionLostError("65,535 packets waiting for the broker")

    async def _request(
        self, packet: Callable[[int], bytes], what: str, *, publish: bool = False
    ) -> bytes:
        """Send `packet(mid)` and wait for its answer. No answer within `ack_timeout_s` of
        the later of the sending and the last message delivered ends the connection. The id
        stays taken until the answer comes, even if the caller gives up meanwhile (a
        PUBLISH's counts against the broker's Receive Maximum until then)."""
        if self._transport is None:
            raise ConnectionLostError("not connected")
        mid = self._next_mid()
        data = self._sendable(packet(mid), what)
        waiter: asyncio.Future[bytes | None] = self._loop.create_future()
        self._waiting[mid] = waiter
        if publish:
            self._in_flight.add(mid)
        self.write(data)
        answer = await self._answer(waiter, what, sent=self._loop.time())
        if answer is None:
            why = self._lost
            raise ConnectionLostError(
                "connection lost" if why is None else str(why),
                reason=None if why is None else why.reason,
            )
        return answer

    async def _answer(
        self, waiter: asyncio.Future[bytes | None], what: str, *, sent: float
    ) -> bytes | None:
        """`waiter`'s result, once the broker answered; the connection ends when no answer
        came within `ack_timeout_s` of the later of `sent` and the last message delivered."""
        timeout = self._ack_timeout_s
        while True:
            due = max(sent, self._last_delivery) + timeout
            if self._loop.time() >= due:
                said = f"the broker did not answer a {what} within {timeout:g} s"
                lost = ConnectionLostError(said)
                self.fail(lost)
                raise lost
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(due):
                    # Shielded: a deadline moved on must not cancel the id's waiter.
                    return await asyncio.shield(waiter)

    async def publish(self, topic: str, payload: bytes, *, qos: int, retain: bool) -> int:
        """PUBLISH (at the broker's Maximum QoS if lower); at QoS 1 wait for the PUBACK. The
        broker's reason code (0 at QoS 0)."""
        version = self._version
        qos = min(qos, self.max_qos)

        def packet(mid: int) -> bytes:
            return codec.publish(topic, payload, qos=qos, retain=retain, mid=mid, version=version)

        if not qos:
            self.write(self._sendable(packet(0), "PUBLISH"))
            return 0
        await self._take_quota()
        return (await self._request(packet, "PUBLISH", publish=True))[0]

    def _sendable(self, data: bytes, what: str) -> bytes:
        """`data`, unless it is larger than the broker's Maximum Packet Size."""
        if len(data) > self.max_send_packet:
            raise NotSendableError(
                f"{what} of {len(data):,} bytes: the broker takes {self.max_send_packet:,} at most"
            )
        return data

    async def _take_quota(self) -> None:
        """Wait until the broker's Receive Maximum allows one more QoS 1 PUBLISH out."""
        while len(self._in_flight) >= self.send_quota:
            if self._transport is None:
                raise ConnectionLostError("not connected")
            waiter: asyncio.Future[None] = self._loop.create_future()
            self._quota_waiters.append(waiter)
            await waiter

    def _acknowledged(self, mid: int) -> None:
        if mid in self._in_flight:
            self._in_flight.discard(mid)
            while self._quota_waiters:
                waiter = self._quota_waiters.popleft()
                if not waiter.done():
                    waiter.set_result(None)
                    return

    async def subscribe(self, filters: list[tuple[str, int]]) -> bytes:
        """SUBSCRIBE and wait for the SUBACK: a granted QoS or failure code per filter."""
        version = self._version

        def packet(mid: int) -> bytes:
            return codec.subscribe(mid, filters, version=version)

        return await self._request(packet, "SUBSCRIBE")

    async def unsubscribe(self, filters: list[str]) -> bytes:
        """UNSUBSCRIBE and wait for the UNSUBACK (MQTT 5: a reason code per filter)."""
        version = self._version

        def packet(mid: int) -> bytes:
            return codec.unsubscribe(mid, filters, version=version)

        return await self._request(packet, "UNSUBSCRIBE")

    # ------------------------------------------------------------------ keep-alive, ending
    def _arm_keepalive(self) -> None:
        """Check liveness when it is next due (none with a keep-alive of 0)."""
        keepalive = self._keepalive_s
        if not keepalive or self._transport is None:
            return
        sent = self._ping_sent
        if sent is None:
            due = min(self._last_read, self._last_write) + keepalive
        else:
            due = max(sent, self._last_read) + keepalive / 2
        self._keepalive = self._loop.call_at(due, self._tick)

    def _tick(self) -> None:
        """Ping when nothing was received (or sent) for a keep-alive; end the connection when
        nothing at all came for half a keep-alive after a ping."""
        now = self._loop.time()
        keepalive = self._keepalive_s
        sent = self._ping_sent
        if sent is not None:
            if now - max(sent, self._last_read) >= keepalive / 2:
                self.fail(
                    ConnectionLostError(
                        f"the broker stopped answering: nothing received for "
                        f"{now - self._last_read:.1f} s, a PINGREQ unanswered "
                        f"(keep-alive {keepalive} s)"
                    )
                )
                return
        elif now - min(self._last_read, self._last_write) >= keepalive:
            self.write(codec.PINGREQ_PACKET)
            self._ping_sent = now
        self._arm_keepalive()

    def fail(self, error: BaseException) -> None:
        """End the connection at once because of `error`."""
        if self._error is None:
            self._error = error
        if self._transport is not None:
            self._transport.abort()

    async def close(self) -> None:
        """DISCONNECT, then close; aborted if the broker does not close its side in time."""
        transport = self._transport
        if transport is None:
            return
        self._closing = True
        self.write(codec.DISCONNECT_PACKET)
        transport.close()
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await asyncio.shield(self.ended)
        except TimeoutError:
            transport.abort()
            await self.ended


def _describe(error: BaseException | None) -> str:
    if error is None:
        return "the connection was closed"
    text = str(error)
    return f"connection lost ({type(error).__name__}{': ' + text if text else ''})"
