"""The MQTT packets of the daemon's link, MQTT 3.1.1 and 5 (OASIS standards), and no others.

Out: CONNECT (with a will, user name and password; on 5 a session expiry, a Receive Maximum,
a Maximum Packet Size and a Topic Alias Maximum of 0), SUBSCRIBE, UNSUBSCRIBE, PUBLISH at QoS
0 or 1, PUBACK, PUBREC and PUBCOMP (a QoS 2 message received), PINGREQ, DISCONNECT. In:
CONNACK, SUBACK, UNSUBACK, PUBLISH at QoS 0, 1 or 2, PUBACK, PUBREL, PINGRESP, and on 5 the
server's DISCONNECT. Properties that arrive are skipped, except the ones the link reads
(CONNACK's Server Keep Alive, Receive Maximum, Maximum QoS, Retain Available, Maximum Packet
Size; a Reason String). A topic alias is refused: edgemon declares a Topic Alias Maximum of 0.
Anything malformed (reserved flags included) is a `ProtocolError`, which ends the connection.

Pure functions over bytes: no socket, no event loop (`mqtt_session` drives them).
"""

from __future__ import annotations

from dataclasses import dataclass

from edgemon.errors import ProtocolError

CONNECT = 0x10
CONNACK = 0x20
PUBLISH = 0x30
PUBACK = 0x40
PUBREC = 0x50
PUBREL = 0x62  # the reserved flags 0b0010
PUBCOMP = 0x70
SUBSCRIBE = 0x82  # the reserved flags 0b0010
SUBACK = 0x90
UNSUBSCRIBE = 0xA2  # the reserved flags 0b0010
UNSUBACK = 0xB0
PINGRESP = 0xD0
DISCONNECT = 0xE0
#: The first byte of every packet a broker may send edgemon but PUBLISH: its type and the
#: reserved flags the standards fix for it (MQTT 3.1.1 §2.2.2, MQTT 5 §2.1.3).
FROM_BROKER = frozenset((CONNACK, PUBACK, PUBREL, SUBACK, UNSUBACK, PINGRESP, DISCONNECT))

PINGREQ_PACKET = b"\xc0\x00"
#: Normal disconnection, on 3.1.1 and on 5 (reason code 0 and no properties may be omitted).
DISCONNECT_PACKET = b"\xe0\x00"

V311 = 4
V5 = 5

#: The largest remaining length a packet can say (four bytes of variable byte integer).
MAX_REMAINING_LENGTH = 268_435_455

#: MQTT 5 property identifiers the link writes or reads.
SESSION_EXPIRY_INTERVAL = 0x11
SERVER_KEEP_ALIVE = 0x13
REASON_STRING = 0x1F
RECEIVE_MAXIMUM = 0x21
TOPIC_ALIAS_MAXIMUM = 0x22
TOPIC_ALIAS = 0x23
MAXIMUM_QOS = 0x24
RETAIN_AVAILABLE = 0x25
MAXIMUM_PACKET_SIZE = 0x27

#: The size of each MQTT 5 property's value, by identifier: a fixed number of bytes, or
#: "v" (variable byte integer), "s" (length-prefixed string or binary), "p" (a string pair).
_PROPERTY_KINDS: dict[int, int | str] = {
    0x01: 1, 0x02: 4, 0x03: "s", 0x08: "s", 0x09: "s", 0x0B: "v", 0x11: 4, 0x12: "s",
    0x13: 2, 0x15: "s", 0x16: "s", 0x17: 1, 0x18: 4, 0x19: 1, 0x1A: "s", 0x1C: "s",
    0x1F: "s", 0x21: 2, 0x22: 2, 0x23: 2, 0x24: 1, 0x25: 1, 0x26: "p", 0x27: 4, 0x28: 1,
    0x29: 1, 0x2A: 1,
}  # fmt: skip

#: CONNACK return codes of MQTT 3.1.1 (on 5, reason codes ≥ 0x80 are refusals).
_V311_REFUSALS = {
    1: "unacceptable protocol version",
    2: "client identifier rejected",
    3: "server unavailable",
    4: "bad user name or password",
    5: "not authorised",
}
_V5_REASONS = {
    0x80: "unspecified error",
    0x81: "malformed packet",
    0x82: "protocol error",
    0x83: "implementation specific error",
    0x84: "unsupported protocol version",
    0x85: "client identifier not valid",
    0x86: "bad user name or password",
    0x87: "not authorized",
    0x88: "server unavailable",
    0x89: "server busy",
    0x8A: "banned",
    0x8B: "server shutting down",
    0x8C: "bad authentication method",
    0x8D: "keep alive timeout",
    0x8E: "session taken over",
    0x8F: "topic filter invalid",
    0x90: "topic name invalid",
    0x93: "receive maximum exceeded",
    0x94: "topic alias invalid",
    0x95: "packet too large",
    0x96: "message rate too high",
    0x97: "quota exceeded",
    0x99: "payload format invalid",
    0x9A: "retain not supported",
    0x9B: "QoS not supported",
    0x9C: "use another server",
    0x9D: "server moved",
    0x9F: "connection rate exceeded",
}


class PacketTooLargeError(ProtocolError):
    """A packet larger than the most edgemon reads (its Maximum Packet Size)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"the broker sent a packet of {size:,} bytes; edgemon reads {limit:,} at most "
            "([limits] max_payload_bytes and the topic; on MQTT 5 declared to the broker as "
            "its Maximum Packet Size)"
        )
        self.size = size
        self.limit = limit


def reason_text(code: int, *, version: int) -> str:
    """A CONNACK return code (3.1.1) or a reason code (5) in words."""
    words = _V311_REFUSALS.get(code) if version == V311 else _V5_REASONS.get(code)
    return f"{words or 'refused'} (code {code})"


# ---------------------------------------------------------------------- encoding
def varint(value: int) -> bytes:
    """A variable byte integer (remaining length, property lengths): four bytes at most."""
    if not 0 <= value <= MAX_REMAINING_LENGTH:
        raise ValueError(f"{value:,} does not fit a variable byte integer (four bytes)")
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | 0x80 if value else byte)
        if not value:
            return bytes(out)


def _string(data: bytes) -> bytes:
    if len(data) > 0xFFFF:
        raise ValueError("an MQTT string or binary field holds 65,535 bytes at most")
    return len(data).to_bytes(2, "big") + data


def _packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + varint(len(body)) + body


@dataclass(frozen=True, slots=True)
class Will:
    """The message the broker publishes for us if the connection ends without DISCONNECT."""

    topic: str
    payload: bytes
    qos: int
    retain: bool


@dataclass(frozen=True, slots=True)
class ConnectRequest:
    """What CONNECT says."""

    client_id: str
    keepalive_s: int
    #: 3.1.1 clean session, 5 clean start.
    clean: bool
    version: int = V311
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    #: MQTT 5 only.
    session_expiry_s: int = 0
    receive_maximum: int | None = None
    #: MQTT 5 only: the largest packet edgemon accepts (the broker sends none larger).
    maximum_packet_size: int | None = None


def connect(request: ConnectRequest) -> bytes:
    """The CONNECT packet."""
    v5 = request.version == V5
    flags = 0x02 if request.clean else 0
    will = request.will
    if will is not None:
        flags |= 0x04 | will.qos << 3 | (0x20 if will.retain else 0)
    if request.username is not None:
        flags |= 0x80
    if request.password is not None:
        flags |= 0x40
    body = bytearray(_string(b"MQTT"))
    body += bytes((request.version, flags)) + request.keepalive_s.to_bytes(2, "big")
    if v5:
        properties = _connect_properties(request)
        body += varint(len(properties)) + properties
    body += _string(request.client_id.encode())
    if will is not None:
        if v5:
            body += b"\x00"  # no will properties
        body += _string(will.topic.encode()) + _string(will.payload)
    if request.username is not None:
        body += _string(request.username.encode())
    if request.password is not None:
        body += _string(request.password)
    return _packet(CONNECT, bytes(body))


def _connect_properties(request: ConnectRequest) -> bytes:
    """CONNECT's MQTT 5 properties: session expiry, the limits on what the broker sends."""
    properties = bytes((SESSION_EXPIRY_INTERVAL,)) + request.session_expiry_s.to_bytes(4, "big")
    if request.receive_maximum is not None:
        properties += bytes((RECEIVE_MAXIMUM,)) + request.receive_maximum.to_bytes(2, "big")
    if request.maximum_packet_size is not None:
        size = request.maximum_packet_size.to_bytes(4, "big")
        properties += bytes((MAXIMUM_PACKET_SIZE,)) + size
    return properties + bytes((TOPIC_ALIAS_MAXIMUM,)) + b"\x00\x00"  # no alias, ever


def subscribe(mid: int, filters: list[tuple[str, int]], *, version: int) -> bytes:
    """SUBSCRIBE `filters` (topic filter, maximum QoS) under packet id `mid`."""
    body = bytearray(mid.to_bytes(2, "big"))
    if version == V5:
        body += b"\x00"  # no properties
    for topic, qos in filters:
        body += _string(topic.encode()) + bytes((qos,))
    return _packet(SUBSCRIBE, bytes(body))


def unsubscribe(mid: int, filters: list[str], *, version: int) -> bytes:
    """UNSUBSCRIBE `filters` under packet id `mid`."""
    body = bytearray(mid.to_bytes(2, "big"))
    if version == V5:
        body += b"\x00"  # no properties
    for topic in filters:
        body += _string(topic.encode())
    return _packet(UNSUBSCRIBE, bytes(body))


def publish(topic: str, payload: bytes, *, qos: int, retain: bool, mid: int, version: int) -> bytes:
    """PUBLISH at QoS 0 (`mid` unused) or 1."""
    head = _string(topic.encode())
    if qos:
        head += mid.to_bytes(2, "big")
    if version == V5:
        head += b"\x00"  # no properties
    return _packet(PUBLISH | qos << 1 | (1 if retain else 0), head + payload)


#: The first two bytes (type, remaining length 2) of what acknowledges a PUBLISH received, by
#: its QoS: 1 PUBACK, 2 PUBREC.
_ACK_HEAD = (b"", bytes((PUBACK, 2)), bytes((PUBREC, 2)))


def acknowledgement(qos: int, mid: int) -> bytes:
    """What acknowledges a PUBLISH received at QoS 1 (PUBACK) or 2 (PUBREC), success (3.1.1
    and 5: a reason code of 0 may be left out)."""
    return _ACK_HEAD[qos] + mid.to_bytes(2, "big")


def pubcomp(mid: int) -> bytes:
    """PUBCOMP, success: the last step of a QoS 2 message received."""
    return bytes((PUBCOMP, 2)) + mid.to_bytes(2, "big")


# ---------------------------------------------------------------------- decoding
def split(
    buf: bytes | bytearray, pos: int, limit: int = MAX_REMAINING_LENGTH
) -> tuple[int, int] | None:
    """The packet starting at `buf[pos]`: (where its body starts, where it ends), or None if
    `buf` does not hold all of it yet. `PacketTooLargeError` as soon as its header says it
    is larger than `limit` bytes (before its body is read)."""
    end = len(buf)
    i = pos + 1
    length = 0
    shift = 0
    while True:
        if i >= end:
            return None
        byte = buf[i]
        i += 1
        length |= (byte & 0x7F) << shift
        if byte < 0x80:
            break
        shift += 7
        if shift > 21:
            raise ProtocolError("remaining length longer than four bytes")
    if i - pos + length > limit:
        raise PacketTooLargeError(i - pos + length, limit)
    if i + length > end:
        return None
    return i, i + length


#: One PUBLISH received: topic, payload, QoS, DUP flag, packet id (0 at QoS 0). A plain tuple:
#: one is made per message, and a named one costs several times more.
Message = tuple[str, bytes, int, bool, int]


def decode_publish(first: int, body: bytes, *, version: int) -> Message:
    """A PUBLISH packet's fixed-header flags and body."""
    qos = (first >> 1) & 3
    if qos == 3:
        raise ProtocolError("PUBLISH with both QoS bits set (malformed)")
    if first & 0x08 and not qos:
        raise ProtocolError("PUBLISH at QoS 0 with the DUP flag set (malformed)")
    if len(body) < 2:
        raise ProtocolError("PUBLISH too short")
    start = 2 + int.from_bytes(body[:2], "big")
    try:
        topic = body[2:start].decode()
    except UnicodeDecodeError:
        raise ProtocolError("PUBLISH topic is not UTF-8") from None
    mid = 0
    if qos:
        mid = int.from_bytes(body[start : start + 2], "big")
        start += 2
        if not mid:
            raise ProtocolError(f"PUBLISH at QoS {qos} with packet identifier 0 (malformed)")
    if version == V5:
        properties = start
        length, start = _read_varint(body, start)
        if length and TOPIC_ALIAS in _properties(body, properties):
            raise ProtocolError("PUBLISH with a topic alias: edgemon's Topic Alias Maximum is 0")
        start += length
    if start > len(body):
        raise ProtocolError("PUBLISH too short")
    return topic, body[start:], qos, bool(first & 0x08), mid


def publish_head(buf: bytes | bytearray, pos: int) -> tuple[str, int, int] | None:
    """The topic, QoS and packet id of the PUBLISH starting at `buf[pos]`, read from the
    start of its body alone (its payload need not be there); None until that much is."""
    first = buf[pos]
    qos = (first >> 1) & 3
    i = pos + 1
    while i < len(buf) and buf[i] & 0x80:
        i += 1
    start = i + 1  # after the remaining length
    if start + 2 > len(buf):
        return None
    end = start + 2 + int.from_bytes(buf[start : start + 2], "big")
    if end + (2 if qos else 0) > len(buf):
        return None
    topic, _, qos, _, mid = decode_publish(first, bytes(buf[start : end + 2]), version=V311)
    return topic, qos, mid


@dataclass(frozen=True, slots=True)
class Connack:
    """CONNACK: whether the broker kept our session, and its answer."""

    session_present: bool
    #: 0 accepted; else a 3.1.1 return code or an MQTT 5 reason code.
    code: int
    properties: dict[int, int | bytes]

    @property
    def refused(self) -> bool:
        """The broker did not accept the connection."""
        return self.code != 0


def decode_connack(body: bytes, *, version: int) -> Connack:
    """A CONNACK body."""
    if len(body) < 2:
        raise ProtocolError("CONNACK too short")
    properties = _properties(body, 2) if version == V5 and len(body) > 2 else {}
    return Connack(bool(body[0] & 1), body[1], properties)


def decode_suback(body: bytes, *, version: int) -> tuple[int, bytes]:
    """A SUBACK body: (packet id, one granted QoS or failure code per filter); an UNSUBACK's
    too (MQTT 5: a reason code per filter; 3.1.1: none)."""
    if len(body) < 2:
        raise ProtocolError("SUBACK too short")
    start = 2
    if version == V5:
        length, start = _read_varint(body, start)
        start += length
    return int.from_bytes(body[:2], "big"), bytes(body[start:])


def decode_puback(body: bytes) -> tuple[int, int]:
    """A PUBACK body: (packet id, reason code: 0 unless MQTT 5 says otherwise)."""
    if len(body) < 2:
        raise ProtocolError("PUBACK too short")
    return int.from_bytes(body[:2], "big"), body[2] if len(body) > 2 else 0


def decode_disconnect(body: bytes) -> tuple[int, dict[int, int | bytes]]:
    """A server's DISCONNECT (MQTT 5): (reason code, properties)."""
    if not body:
        return 0, {}
    return body[0], _properties(body, 1) if len(body) > 1 else {}


def _read_varint(body: bytes, pos: int) -> tuple[int, int]:
    value = 0
    for shift in range(0, 28, 7):
        if pos >= len(body):
            raise ProtocolError("variable byte integer cut short")
        byte = body[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
    raise ProtocolError("variable byte integer longer than four bytes")


def _properties(body: bytes, pos: int) -> dict[int, int | bytes]:
    """MQTT 5 properties at `pos`: integers as int, strings and binaries as bytes (user
    properties, which may repeat, are skipped)."""
    length, pos = _read_varint(body, pos)
    end = pos + length
    if end > len(body):
        raise ProtocolError("properties cut short")
    found: dict[int, int | bytes] = {}
    while pos < end:
        ident = body[pos]
        kind = _PROPERTY_KINDS.get(ident)
        pos += 1
        if kind is None:
            raise ProtocolError(f"unknown property 0x{ident:02x}")
        if kind == "v":
            found[ident], pos = _read_varint(body, pos)
        elif isinstance(kind, int):
            found[ident] = int.from_bytes(body[pos : pos + kind], "big")
            pos += kind
        else:
            for _ in range(2 if kind == "p" else 1):
                size = int.from_bytes(body[pos : pos + 2], "big")
                if kind == "s":
                    found[ident] = bytes(body[pos + 2 : pos + 2 + size])
                pos += 2 + size
    if pos != end:
        raise ProtocolError("properties cut short")
    return found
