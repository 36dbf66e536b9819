"""One broker connection's MQTT protocol state, without I/O (as h11 and wsproto): bytes and
`now` in, events and bytes out.

The session holds no socket, no event loop and no clock: whatever depends on time takes `now`
(seconds, any monotonic origin). Its driver (`mqtt_connection.Connection`, or a test with a
fake clock) hands it what the socket read (`receive_data`), takes the events (`next_event`),
writes what it says (`data_to_send`) and calls `tick` when `deadline` comes.

- **Framing.** What arrives is kept in a `PacketBuffer` and split into packets
  (`mqtt_codec`), each refused as soon as its fixed header says it is larger than
  `max_packet`: on MQTT 3.1.1 a PUBLISH (which the broker cannot be told to hold back) is
  dropped as it arrives, never buffered, and reported (`TooLarge`) so that it is acknowledged
  in its turn; anything else is a `ProtocolError`. Nothing is read until the driver asks for
  the next event: a driver that stops asking (its intake is full) leaves the rest here, and
  the broker, once the socket is not read, holds what follows.
- **The broker's answers.** CONNACK (`Connected`, with the limits it sets on what edgemon
  sends: Server Keep Alive, Receive Maximum, Maximum Packet Size, Maximum QoS); the answers
  to PUBLISH, SUBSCRIBE and UNSUBSCRIBE (`Answered`); PUBREL answered with PUBCOMP (a QoS 2
  message); on MQTT 5 the broker's DISCONNECT, a `ConnectionLostError` with its reason.
- **Requests.** A QoS 1 PUBLISH, a SUBSCRIBE or an UNSUBSCRIBE takes a packet id that stays
  taken until the answer comes, whoever still waits for it; a QoS 1 PUBLISH counts against the
  broker's Receive Maximum until then (`may_publish`).
- **Liveness**, whatever edgemon writes: when nothing was received (or sent) for a keep-alive,
  a PINGREQ goes out; when nothing at all comes within half a keep-alive after it, the session
  is over. A request not answered within `ack_timeout_s` of the later of its sending and the
  last message the broker delivered ends it too: an answer queued behind a backlog the broker
  is still delivering is late, not lost.

A call that finds the session broken raises (`ProtocolError`, `ConnectionLostError`), and the
session is over: the driver closes the connection.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgemon.daemon import mqtt_codec as codec
from edgemon.daemon.mqtt_buffer import PacketBuffer
from edgemon.errors import ConnectionLostError, NotSendableError, ProtocolError

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Answered", "Connected", "Event", "Session", "TooLarge"]

#: MQTT 5's defaults for what a CONNACK leaves out (unlimited but for the field's size).
UNLIMITED_QUOTA = 65_535


@dataclass(frozen=True, slots=True)
class Connected:
    """The broker's CONNACK (`connack.refused` when it did not accept the connection)."""

    connack: codec.Connack


@dataclass(frozen=True, slots=True)
class Answered:
    """The answer to a request: a PUBACK's reason code, or a SUBACK's (UNSUBACK's) code per
    filter."""

    mid: int
    codes: bytes


@dataclass(frozen=True, slots=True)
class TooLarge:
    """A PUBLISH larger than the session reads (MQTT 3.1.1), dropped as it arrives."""

    topic: str
    size: int
    qos: int
    mid: int


#: What `next_event` returns: a message, or news of the connection.
Event = codec.Message | Connected | Answered | TooLarge

#: A request awaiting its answer: when it was sent, and what it was (for the error).
_Request = tuple[float, str]


class Session:
    """The protocol state of one connection, from CONNECT to the end (see the module doc)."""

    __slots__ = (
        "_connack_seen",
        "_in_flight",
        "_last_delivery",
        "_last_read",
        "_last_write",
        "_mid",
        "_order",
        "_out",
        "_ping_sent",
        "_requests",
        "_skip",
        "accepted",
        "ack_timeout_s",
        "buffer",
        "keepalive_s",
        "max_packet",
        "max_qos",
        "max_send_packet",
        "send_quota",
        "version",
    )

    def __init__(
        self,
        request: codec.ConnectRequest,
        *,
        now: float,
        max_packet: int = codec.MAX_REMAINING_LENGTH,
        ack_timeout_s: float | None = None,
    ) -> None:
        """A session that begins with `request`'s CONNECT (the first bytes to send)."""
        self.version = request.version
        self.keepalive_s = request.keepalive_s
        #: How long the broker may take to answer a request before the session ends.
        self.ack_timeout_s = ack_timeout_s or float(request.keepalive_s)
        #: The largest packet read from the broker (declared to it on MQTT 5).
        self.max_packet = max_packet
        #: What was received and not handled yet.
        self.buffer = PacketBuffer()
        #: The CONNACK came and accepted the connection.
        self.accepted = False
        self._connack_seen = False
        #: Bytes of a PUBLISH too large to read that are still to come, to be dropped.
        self._skip = 0
        self._out: list[bytes] = []
        #: Requests awaiting their answer by packet id, and the same in the order sent (with
        #: entries of requests answered since, skipped when met).
        self._requests: dict[int, _Request] = {}
        self._order: deque[tuple[int, _Request]] = deque()
        #: QoS 1 PUBLISHes sent and not acknowledged (the broker's Receive Maximum bounds them).
        self._in_flight: set[int] = set()
        #: What the broker's CONNACK allows (MQTT 5; 3.1.1 has no such limits).
        self.send_quota = UNLIMITED_QUOTA
        self.max_send_packet = codec.MAX_REMAINING_LENGTH
        self.max_qos = 2
        self._mid = 0
        self._last_read = self._last_write = now
        #: When a PUBLISH from the broker was last handed out: the broker is delivering.
        self._last_delivery = float("-inf")
        self._ping_sent: float | None = None
        self.send(codec.connect(request), now)

    # ------------------------------------------------------------------ bytes
    def receive_data(self, data: bytes, now: float) -> None:
        """A block of what the broker sent (any size, any boundaries)."""
        self._last_read = now
        if self._skip:
            dropped = min(self._skip, len(data))
            self._skip -= dropped
            if dropped == len(data):
                return
            data = data[dropped:]
        self.buffer.feed(data)

    def data_to_send(self) -> bytes:
        """What to write to the broker now (and forget)."""
        out = self._out
        if not out:
            return b""
        self._out = []
        return out[0] if len(out) == 1 else b"".join(out)

    def send(self, data: bytes, now: float) -> None:
        """Packets to send now (the intake's acknowledgements are encoded there)."""
        self._out.append(data)
        self._last_write = now

    # ------------------------------------------------------------------ events
    def next_event(self, now: float) -> Event | None:
        """The next event of what was received, or None until more is. A `Message` is a
        PUBLISH, read once the connection is accepted."""
        buffer = self.buffer
        while True:
            buf, pos = buffer.data, buffer.pos
            if len(buf) - pos < 2:
                return None
            try:
                where = codec.split(buf, pos, self.max_packet)
            except codec.PacketTooLargeError as error:
                return self._too_large(buf, pos, error)
            if where is None:
                return None
            start, end = where
            first = buf[pos]
            # bytes(<bytes>) is the same object: one copy either way.
            body = (
                bytes(buf[start:end]) if type(buf) is bytes else bytes(memoryview(buf)[start:end])
            )
            buffer.pos = end
            if first & 0xF0 == codec.PUBLISH and self.accepted:
                self._last_delivery = now
                return codec.decode_publish(first, body, version=self.version)
            event = self._control(first, body, now)
            if event is not None:
                return event

    def _too_large(
        self, buf: bytes | bytearray, pos: int, error: codec.PacketTooLargeError
    ) -> TooLarge | None:
        """A packet larger than the session reads, at `pos`: on MQTT 3.1.1 a PUBLISH is
        skipped (None until its topic and packet id are in); else `error`."""
        if self.version != codec.V311 or buf[pos] & 0xF0 != codec.PUBLISH or not self.accepted:
            raise error
        head = codec.publish_head(buf, pos)
        if head is None:
            return None
        topic, qos, mid = head
        end = pos + error.size
        if end > len(buf):
            self._skip = end - len(buf)
            end = len(buf)
        self.buffer.pos = end
        return TooLarge(topic, error.size, qos, mid)

    def _control(self, first: int, body: bytes, now: float) -> Event | None:
        """A packet other than a PUBLISH: its event, or None when it needs none."""
        if first not in codec.FROM_BROKER:
            raise ProtocolError(f"unexpected packet 0x{first:02x} from the broker")
        if first == codec.CONNACK and not self._connack_seen:
            return self._connack(codec.decode_connack(body, version=self.version))
        if first in {codec.PUBACK, codec.SUBACK, codec.UNSUBACK} and self.accepted:
            if first == codec.PUBACK:
                mid, code = codec.decode_puback(body)
                codes = bytes((code,))
                self._in_flight.discard(mid)
            else:
                mid, codes = codec.decode_suback(body, version=self.version)
            return None if self._requests.pop(mid, None) is None else Answered(mid, codes)
        if first == codec.PUBREL and self.accepted:
            # A QoS 2 message received: it was applied and PUBREC'd once durable (`intake`);
            # the broker now forgets it, and so do we.
            self.send(codec.pubcomp(codec.decode_puback(body)[0]), now)
            return None
        if first == codec.PINGRESP:
            self._ping_sent = None
            return None
        if first == codec.DISCONNECT and self.version == codec.V5:
            reason, properties = codec.decode_disconnect(body)
            text = properties.get(codec.REASON_STRING)
            said = f": {text.decode(errors='replace')}" if isinstance(text, bytes) else ""
            raise ConnectionLostError(
                f"the broker disconnected: {codec.reason_text(reason, version=codec.V5)}{said}",
                reason=reason,
            )
        raise ProtocolError(f"unexpected packet 0x{first:02x} from the broker")

    def _connack(self, connack: codec.Connack) -> Connected:
        self._connack_seen = True
        properties = connack.properties
        keepalive = properties.get(codec.SERVER_KEEP_ALIVE)
        if isinstance(keepalive, int):
            self.keepalive_s = keepalive
        quota = properties.get(codec.RECEIVE_MAXIMUM)
        if isinstance(quota, int) and quota > 0:
            self.send_quota = quota
        size = properties.get(codec.MAXIMUM_PACKET_SIZE)
        if isinstance(size, int) and size > 0:
            self.max_send_packet = size
        max_qos = properties.get(codec.MAXIMUM_QOS)
        if isinstance(max_qos, int):
            self.max_qos = max_qos
        self.accepted = not connack.refused
        return Connected(connack)

    # ------------------------------------------------------------------ requests
    @property
    def may_publish(self) -> bool:
        """Whether the broker's Receive Maximum allows one more QoS 1 PUBLISH out now."""
        return len(self._in_flight) < self.send_quota

    def publish(self, topic: str, payload: bytes, *, qos: int, retain: bool, now: float) -> int:
        """PUBLISH (at the broker's Maximum QoS if lower): its packet id, whose `Answered`
        the caller awaits; 0 at QoS 0 (nothing to await). At QoS 1 only when `may_publish`.
        NotSendableError if the broker said it takes no packet that large."""
        version = self.version
        qos = min(qos, self.max_qos)
        if not qos:
            packet = codec.publish(topic, payload, qos=0, retain=retain, mid=0, version=version)
            self.send(self._sendable(packet, "PUBLISH"), now)
            return 0
        if not self.may_publish:
            raise RuntimeError("a QoS 1 PUBLISH beyond the broker's Receive Maximum")

        def packet_for(mid: int) -> bytes:
            return codec.publish(topic, payload, qos=qos, retain=retain, mid=mid, version=version)

        mid = self._request(packet_for, "PUBLISH", now)
        self._in_flight.add(mid)
        return mid

    def subscribe(self, filters: list[tuple[str, int]], now: float) -> int:
        """SUBSCRIBE (topic filter, maximum QoS): the packet id its SUBACK answers."""
        version = self.version
        return self._request(lambda mid: codec.subscribe(mid, filters, version=version),
                             "SUBSCRIBE", now)  # fmt: skip

    def unsubscribe(self, filters: list[str], now: float) -> int:
        """UNSUBSCRIBE: the packet id its UNSUBACK answers."""
        version = self.version
        return self._request(lambda mid: codec.unsubscribe(mid, filters, version=version),
                             "UNSUBSCRIBE", now)  # fmt: skip

    def disconnect(self, now: float) -> None:
        """DISCONNECT: the session's normal end."""
        self.send(codec.DISCONNECT_PACKET, now)

    def _request(self, packet: Callable[[int], bytes], what: str, now: float) -> int:
        mid = self._next_mid()
        data = self._sendable(packet(mid), what)
        request = (now, what)
        self._requests[mid] = request
        self._order.append((mid, request))
        self.send(data, now)
        return mid

    def _next_mid(self) -> int:
        for _ in range(0xFFFF):
            self._mid = self._mid % 0xFFFF + 1
            if self._mid not in self._requests:
                return self._mid
        raise ConnectionLostError("65,535 packets waiting for the broker")

    def _sendable(self, data: bytes, what: str) -> bytes:
        """`data`, unless it is larger than the broker's Maximum Packet Size."""
        if len(data) > self.max_send_packet:
            raise NotSendableError(
                f"{what} of {len(data):,} bytes: the broker takes {self.max_send_packet:,} at most"
            )
        return data

    # ------------------------------------------------------------------ time
    def _answer_due(self) -> tuple[float, str] | None:
        """The request awaiting its answer longest, and when that answer is overdue: a
        deadline counted from the later of its sending and the last message delivered."""
        order, requests = self._order, self._requests
        while order:
            mid, request = order[0]
            if requests.get(mid) is request:
                return max(request[0], self._last_delivery) + self.ack_timeout_s, request[1]
            order.popleft()
        return None

    def _liveness_due(self) -> float | None:
        """When the next PINGREQ is due, or with one unanswered, when the broker has been
        silent too long (None: no keep-alive, or not accepted yet)."""
        keepalive = self.keepalive_s
        if not (self.accepted and keepalive):
            return None
        sent = self._ping_sent
        if sent is None:
            return min(self._last_read, self._last_write) + keepalive
        return max(sent, self._last_read) + keepalive / 2

    def deadline(self) -> float | None:
        """When `tick` has something to do next (None: nothing until more happens)."""
        answer = self._answer_due()
        liveness = self._liveness_due()
        if answer is None:
            return liveness
        return answer[0] if liveness is None else min(answer[0], liveness)

    def tick(self, now: float) -> None:
        """What is due at `now`: a PINGREQ when nothing was received (or sent) for a
        keep-alive; ConnectionLostError when nothing came for half a keep-alive after it, or
        a request went unanswered for `ack_timeout_s` of the later of its sending and the
        last message delivered."""
        answer = self._answer_due()
        if answer is not None and now >= answer[0]:
            raise ConnectionLostError(
                f"the broker did not answer a {answer[1]} within {self.ack_timeout_s:g} s"
            )
        due = self._liveness_due()
        if due is None or now < due:
            return
        if self._ping_sent is None:
            self.send(codec.PINGREQ_PACKET, now)
            self._ping_sent = now
            return
        raise ConnectionLostError(
            f"the broker stopped answering: nothing received for "
            f"{now - self._last_read:.1f} s, a PINGREQ unanswered (keep-alive {self.keepalive_s} s)"
        )
