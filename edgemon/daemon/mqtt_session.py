"""One connection to the broker, from TCP connect to close: an asyncio `Protocol`.

asyncio reads the socket (or the TLS layer) in blocks and hands them to `data_received`; the
session splits them into packets (`mqtt_codec`) and gives each PUBLISH to the `Intake`, which
applies it there and then. At most `READ_BUDGET` messages are handled per callback: if more
are waiting, the transport stops reading and the rest is handled on the next loop iteration,
after the timers due meanwhile (a throttle onset must not wait behind a backlog). While the
intake is `paused` (too much waiting to be durable), nothing more is handled and the transport
is not read: the broker holds the rest (TCP backpressure).

The rest of the session: CONNACK (then `on_accepted`, before any message of the session is
handled), SUBACK, UNSUBACK and PUBACK answered to whoever waits for them, keep-alive pings,
and on MQTT 5 the broker's DISCONNECT. The session ends with `ended`: None after `close()`,
else the error.
"""

from __future__ import annotations

import asyncio
import socket
from typing import TYPE_CHECKING

from edgemon.daemon import mqtt_codec as codec

if TYPE_CHECKING:
    from collections.abc import Callable

    from edgemon.daemon.intake import Intake

#: PUBLISH packets handled per `data_received` (or continuation) at most.
READ_BUDGET = 16
#: How long a clean close waits for the broker to close its side.
CLOSE_TIMEOUT_S = 2.0


class SessionLostError(Exception):
    """The session ended (or never came up); `reason` is the broker's MQTT 5 reason code,
    when it gave one (142: the session was taken over)."""

    def __init__(self, message: str, *, reason: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class Session(asyncio.Protocol):
    """The protocol of one broker connection (`loop.create_connection(lambda: session, …)`)."""

    def __init__(
        self,
        intake: Intake,
        *,
        version: int,
        keepalive_s: int,
        on_accepted: Callable[[Session, codec.Connack], None],
    ) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._intake = intake
        self._version = version
        self._keepalive_s = keepalive_s
        self._on_accepted = on_accepted
        self._transport: asyncio.Transport | None = None
        self._buf = b""
        self._pos = 0
        #: The broker's CONNACK (an exception if the connection ends before it).
        self.connack: asyncio.Future[codec.Connack] = loop.create_future()
        #: Set when the connection is gone: None after `close()`, else why it ended.
        self.ended: asyncio.Future[BaseException | None] = loop.create_future()
        self._accepted = False
        #: SUBACK, UNSUBACK and PUBACK answers awaited, by packet id (None: connection lost).
        self._waiting: dict[int, asyncio.Future[bytes | None]] = {}
        #: Why the connection ended, for those waiters.
        self._lost: SessionLostError | None = None
        self._mid = 0
        self._error: BaseException | None = None
        self._closing = False
        self._not_reading = False  # the transport's reading paused by us
        self._continue: asyncio.Handle | None = None
        self._last_write = self._last_read = loop.time()
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
        self._schedule_keepalive()

    def data_received(self, data: bytes) -> None:
        """A block of what the broker sent: handled now, up to the budget."""
        self._last_read = self._loop.time()
        buf, pos = self._buf, self._pos
        self._buf = data if pos >= len(buf) else buf[pos:] + data
        self._pos = 0
        if self._continue is None:
            self._handle()

    def eof_received(self) -> bool:
        """The broker closed its side: the session is over."""
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
            error = SessionLostError("the broker closed the connection")
        lost = error if isinstance(error, SessionLostError) else SessionLostError(_describe(error))
        self._lost = lost
        if not self.connack.done():
            self.connack.set_exception(lost)
        for waiter in self._waiting.values():
            if not waiter.done():
                # None, not an exception: a waiter cancelled meanwhile never reads it.
                waiter.set_result(None)
        self._waiting.clear()
        if not self.ended.done():
            self.ended.set_result(error)

    # ------------------------------------------------------------------ reading
    def _handle(self) -> None:
        """Handle the complete packets received, up to READ_BUDGET messages."""
        self._continue = None
        intake = self._intake
        buf, pos = self._buf, self._pos
        version = self._version
        budget = READ_BUDGET
        more = False
        try:
            while not intake.paused:
                where = codec.split(buf, pos) if len(buf) - pos >= 2 else None
                if where is None:
                    break
                if not budget:
                    more = True
                    break
                start, end = where
                first = buf[pos]
                if first & 0xF0 == codec.PUBLISH and self._accepted:
                    topic, payload, qos, dup, mid = codec.decode_publish(
                        first, buf[start:end], version=version
                    )
                    intake.on_message(topic, payload, qos, dup, mid)
                    budget -= 1
                else:
                    self._control(first, buf[start:end])
                pos = end
        except Exception as exc:  # noqa: BLE001 - a broken session, whatever the form
            self._pos = pos
            self.fail(exc)
            return
        finally:
            intake.end_batch()
        self._pos = pos
        if more and not intake.paused:
            self._continue = self._loop.call_soon(self._handle)
        self._read(on=not more and not intake.paused)

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
        kind = first & 0xF0
        if kind == codec.CONNACK and not self.connack.done():
            connack = codec.decode_connack(body, version=self._version)
            keepalive = connack.properties.get(codec.SERVER_KEEP_ALIVE)
            if isinstance(keepalive, int):
                self._keepalive_s = keepalive
            if not connack.refused:
                self._accepted = True
                self._on_accepted(self, connack)
            self.connack.set_result(connack)
        elif kind in {codec.PUBACK, codec.SUBACK, codec.UNSUBACK} and self._accepted:
            if kind == codec.PUBACK:
                mid, code = codec.decode_puback(body)
                answer = bytes((code,))
            else:
                mid, answer = codec.decode_suback(body, version=self._version)
            waiter = self._waiting.pop(mid, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(answer)
        elif kind == codec.PINGRESP:
            self._ping_sent = None
        elif kind == codec.DISCONNECT and self._version == codec.V5:
            reason, properties = codec.decode_disconnect(body)
            text = properties.get(codec.REASON_STRING)
            said = f": {text.decode(errors='replace')}" if isinstance(text, bytes) else ""
            raise SessionLostError(
                f"the broker disconnected: {codec.reason_text(reason, version=codec.V5)}{said}",
                reason=reason,
            )
        else:
            raise codec.ProtocolError(f"unexpected packet 0x{first:02x} from the broker")

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
        raise SessionLostError("65,535 packets waiting for the broker")

    async def _request(self, packet: Callable[[int], bytes]) -> bytes:
        if self._transport is None:
            raise SessionLostError("not connected")
        mid = self._next_mid()
        waiter: asyncio.Future[bytes | None] = self._loop.create_future()
        self._waiting[mid] = waiter
        try:
            self.write(packet(mid))
            answer = await waiter
            if answer is None:
                lost = self._lost
                raise SessionLostError(
                    "connection lost" if lost is None else str(lost),
                    reason=None if lost is None else lost.reason,
                )
            return answer
        finally:
            if self._waiting.get(mid) is waiter:
                del self._waiting[mid]

    async def publish(self, topic: str, payload: bytes, *, qos: int, retain: bool) -> int:
        """PUBLISH; at QoS 1 wait for the PUBACK. The broker's reason code (0 at QoS 0)."""
        version = self._version

        def packet(mid: int) -> bytes:
            return codec.publish(topic, payload, qos=qos, retain=retain, mid=mid, version=version)

        if not qos:
            self.write(packet(0))
            return 0
        return (await self._request(packet))[0]

    async def subscribe(self, filters: list[tuple[str, int]]) -> bytes:
        """SUBSCRIBE and wait for the SUBACK: a granted QoS or failure code per filter."""
        version = self._version
        return await self._request(lambda mid: codec.subscribe(mid, filters, version=version))

    async def unsubscribe(self, filters: list[str]) -> bytes:
        """UNSUBSCRIBE and wait for the UNSUBACK (MQTT 5: a reason code per filter)."""
        version = self._version
        return await self._request(lambda mid: codec.unsubscribe(mid, filters, version=version))

    # ------------------------------------------------------------------ keep-alive, ending
    def _schedule_keepalive(self) -> None:
        if self._keepalive_s:
            self._keepalive = self._loop.call_later(self._keepalive_s / 2, self._tick)

    def _tick(self) -> None:
        """Ping when nothing was sent for half the keep-alive; give up when a ping stays
        unanswered and nothing at all came for a whole keep-alive (while reading)."""
        now = self._loop.time()
        sent = self._ping_sent
        if (
            sent is not None
            and not self._not_reading
            and now - max(sent, self._last_read) >= (self._keepalive_s)
        ):
            self.fail(SessionLostError("the broker stopped answering (keep-alive)"))
            return
        if now - self._last_write >= self._keepalive_s / 2 and self.connack.done():
            self.write(codec.PINGREQ_PACKET)
            if sent is None:
                self._ping_sent = now
        self._schedule_keepalive()

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
        return "the session was closed"
    text = str(error)
    return f"connection lost ({type(error).__name__}{': ' + text if text else ''})"
