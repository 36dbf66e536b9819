"""One TCP connection to the broker, from connect to close: the asyncio `Protocol` that moves
bytes between the socket and the connection's `Session` (`mqtt_session`, the protocol state).

The MQTT session on the broker (the subscriptions and queue for edgemon's client id) outlives
it: `mqtt.MqttLink` opens one connection after another for the same client id.

- **Reading.** asyncio reads the socket (or the TLS layer) in blocks and hands them to
  `data_received`; the session keeps them and splits them into packets, and each message goes
  to the `Intake`, which applies it there and then. At most `READ_BUDGET` messages are
  handled per callback: if more are waiting, the transport stops reading and the rest is
  handled on the next loop iteration, after the timers due meanwhile (a throttle onset must
  not wait behind a backlog). While the intake is `paused` (too much waiting to be durable),
  nothing more is taken from the session and the transport is not read: the broker holds the
  rest (TCP backpressure).
- **Time.** One timer, at the session's `deadline`, calls its `tick` (pings, the deadlines of
  the broker's answers), whether the intake is paused or not; what the session raises there
  ends the connection.
- **Waiting.** The CONNACK (`connack`; `on_accepted` runs before any message is handled) and
  the answer to each request, by packet id; a QoS 1 PUBLISH also waits for room under the
  broker's Receive Maximum. The connection ends with `ended`: None after `close()`, else the
  error.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from typing import TYPE_CHECKING, Any

from edgemon.daemon import mqtt_codec as codec
from edgemon.daemon.mqtt_session import Answered, Connected, Session
from edgemon.errors import ConnectionLostError

if TYPE_CHECKING:
    from collections.abc import Callable

    from edgemon.daemon.intake import Intake
    from edgemon.daemon.mqtt_buffer import PacketBuffer
    from edgemon.daemon.mqtt_session import Event

#: PUBLISH packets handled per `data_received` (or continuation) at most.
READ_BUDGET = 16
#: How long a clean close waits for the broker to close its side.
CLOSE_TIMEOUT_S = 2.0


class Connection(asyncio.Protocol):
    """The protocol of one broker connection (`loop.create_connection(lambda: conn, …)`)."""

    def __init__(
        self,
        intake: Intake,
        request: codec.ConnectRequest,
        *,
        on_accepted: Callable[[Connection, codec.Connack], None],
        max_packet: int = codec.MAX_REMAINING_LENGTH,
        ack_timeout_s: float | None = None,
    ) -> None:
        """A connection whose session begins with `request`'s CONNECT, sent once connected."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._intake = intake
        #: The protocol state: what was received and not handled yet, what the broker allows.
        self.session = Session(
            request, now=loop.time(), max_packet=max_packet, ack_timeout_s=ack_timeout_s
        )
        self._on_accepted = on_accepted
        self._transport: asyncio.Transport | None = None
        #: The broker's CONNACK (an exception if the connection ends before it).
        self.connack: asyncio.Future[codec.Connack] = loop.create_future()
        #: Set when the connection is gone: None after `close()`, else why it ended.
        self.ended: asyncio.Future[BaseException | None] = loop.create_future()
        #: The answers awaited, by packet id (None: the connection was lost).
        self._waiting: dict[int, asyncio.Future[bytes | None]] = {}
        self._quota_waiters: deque[asyncio.Future[None]] = deque()
        #: Why the connection ended, for those waiters.
        self._lost: ConnectionLostError | None = None
        self._error: BaseException | None = None
        self._closing = False
        self._not_reading = False  # the transport's reading paused by us
        self._continue: asyncio.Handle | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due = float("inf")

    @property
    def buffer(self) -> PacketBuffer:
        """What was received and not handled yet."""
        return self.session.buffer

    @property
    def max_qos(self) -> int:
        """The broker's Maximum QoS (MQTT 5's CONNACK; 2 unless it said less)."""
        return self.session.max_qos

    # ------------------------------------------------------------------ asyncio's side
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Connected: no Nagle delay (a throttle object must not wait for the broker's
        delayed ACK of the PUBACK written just before it); CONNECT goes out."""
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in {socket.AF_INET, socket.AF_INET6}:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._flush()

    def data_received(self, data: bytes) -> None:
        """A block of what the broker sent: handled now, up to the budget."""
        self.session.receive_data(data, self._loop.time())
        if self._continue is None:
            self._handle()

    def eof_received(self) -> bool:
        """The broker closed its side: the connection is over."""
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        """The connection is gone: every waiter learns it."""
        self._transport = None
        if self._timer is not None:
            self._timer.cancel()
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
        waiters: list[asyncio.Future[Any]] = [*self._waiting.values(), *self._quota_waiters]
        for waiter in waiters:
            if not waiter.done():
                # None, not an exception: a waiter cancelled meanwhile never reads it.
                waiter.set_result(None)
        self._waiting.clear()
        self._quota_waiters.clear()
        if not self.ended.done():
            self.ended.set_result(error)

    # ------------------------------------------------------------------ reading
    def _handle(self) -> None:
        """Hand what the session received to the intake, up to READ_BUDGET messages."""
        self._continue = None
        intake = self._intake
        try:
            more = intake.read(
                self.session, self._loop.time(), budget=READ_BUDGET, control=self._control
            )
        except Exception as exc:  # noqa: BLE001 - a broken connection, whatever the form
            self.fail(exc)
            return
        self._flush()
        if more and not intake.paused:
            self._continue = self._loop.call_soon(self._handle)
        self._read(on=not more and not intake.paused)

    def _control(self, event: Event) -> None:
        """A CONNACK, or the answer to a request."""
        if isinstance(event, Answered):
            waiter = self._waiting.pop(event.mid, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(event.codes)
            self._wake_quota()
        elif isinstance(event, Connected):
            connack = event.connack
            if not connack.refused:
                self._on_accepted(self, connack)
                self._arm()
            self.connack.set_result(connack)

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

    # ------------------------------------------------------------------ writing
    def write(self, data: bytes) -> None:
        """Send `data` now (nothing if the connection is gone)."""
        self.session.send(data, self._loop.time())
        self._flush()

    def _flush(self) -> None:
        data = self.session.data_to_send()
        transport = self._transport
        if data and transport is not None and not transport.is_closing():
            transport.write(data)

    def _request(self, send: Callable[[float], int]) -> int:
        """Send a request now (`send(now)` gives the session's packet id, 0 for none)."""
        if self._transport is None:
            raise ConnectionLostError("not connected")
        mid = send(self._loop.time())
        self._flush()
        self._arm()
        return mid

    async def _answer(self, mid: int) -> bytes:
        """The broker's answer to request `mid`; ConnectionLostError if the connection ends
        first (the session ends it when the answer is overdue)."""
        waiter: asyncio.Future[bytes | None] = self._loop.create_future()
        self._waiting[mid] = waiter
        answer = await waiter
        if answer is None:
            why = self._lost
            raise ConnectionLostError(
                "connection lost" if why is None else str(why),
                reason=None if why is None else why.reason,
            )
        return answer

    async def publish(self, topic: str, payload: bytes, *, qos: int, retain: bool) -> int:
        """PUBLISH (at the broker's Maximum QoS if lower); at QoS 1 wait for room under its
        Receive Maximum, then for the PUBACK. The broker's reason code (0 at QoS 0)."""
        session = self.session
        if min(qos, session.max_qos):
            await self._take_quota()
        elif self._transport is None:
            return 0  # QoS 0: lost with the connection
        mid = self._request(
            lambda now: session.publish(topic, payload, qos=qos, retain=retain, now=now)
        )
        return (await self._answer(mid))[0] if mid else 0

    async def subscribe(self, filters: list[tuple[str, int]]) -> bytes:
        """SUBSCRIBE and wait for the SUBACK: a granted QoS or failure code per filter."""
        session = self.session
        return await self._answer(self._request(lambda now: session.subscribe(filters, now)))

    async def unsubscribe(self, filters: list[str]) -> bytes:
        """UNSUBSCRIBE and wait for the UNSUBACK (MQTT 5: a reason code per filter)."""
        session = self.session
        return await self._answer(self._request(lambda now: session.unsubscribe(filters, now)))

    async def _take_quota(self) -> None:
        """Wait until the broker's Receive Maximum allows one more QoS 1 PUBLISH out."""
        while not self.session.may_publish:
            if self._transport is None:
                raise ConnectionLostError("not connected")
            waiter: asyncio.Future[None] = self._loop.create_future()
            self._quota_waiters.append(waiter)
            await waiter

    def _wake_quota(self) -> None:
        """An answer came: a PUBLISH waiting for room may go, if there is room now."""
        waiters = self._quota_waiters
        while waiters and self.session.may_publish:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    # ------------------------------------------------------------------ time, ending
    def _arm(self) -> None:
        """Have the timer fire by the session's deadline (it fires early at worst, when the
        deadline moved on: `_tick` then does nothing and sets it again)."""
        due = self.session.deadline()
        if due is None or self._transport is None or due >= self._timer_due:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_due = due
        self._timer = self._loop.call_at(due, self._tick)

    def _tick(self) -> None:
        self._timer, self._timer_due = None, float("inf")
        try:
            self.session.tick(self._loop.time())
        except ConnectionLostError as lost:
            self.fail(lost)
            return
        self._flush()
        self._arm()

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
        self.session.disconnect(self._loop.time())
        self._flush()
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
