"""A broker for one client connection, on a free loopback port, that records the bytes on the
wire: every block it reads from the client (`reads`), split into MQTT packets by its own small
parser (not edgemon's codec). It answers CONNECT, SUBSCRIBE, PUBLISH (QoS 1) and PINGREQ as
MQTT 3.1.1 (or 5, as the client's CONNECT asks) says, and sends the client what a test asks
(`publish`, `flood`, `disconnect`).

It exists for what a real broker cannot show: whether a PUBACK left before the message was
durable, how many reads the PUBACKs of a batch took, whether the client stopped reading (the
broker's sends block: TCP backpressure); and for faults: packets it leaves unanswered
(`ignore`), a CONNACK or SUBACK of the test's choosing (`connack`, `grant`), any bytes at all
(`send`). Its sockets are plain blocking ones in threads, so the client's event loop and the
broker never share a scheduler. It serves one connection at a time, then the next.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass

CONNECT, PUBLISH, PUBACK, SUBSCRIBE, PINGREQ, DISCONNECT = 0x10, 0x30, 0x40, 0x80, 0xC0, 0xE0
PUBREC, PUBCOMP = 0x50, 0x70


@dataclass(frozen=True, slots=True)
class Packet:
    """One packet from the client: its first byte, its body, and the read that completed it."""

    first: int
    body: bytes
    read: int

    @property
    def kind(self) -> int:
        """The packet type (high nibble)."""
        return self.first & 0xF0

    @property
    def topic(self) -> str:
        """The topic name of a PUBLISH."""
        return self.body[2 : self._topic_end].decode()

    @property
    def mid(self) -> int:
        """The packet id of a PUBACK, SUBSCRIBE or QoS 1 PUBLISH."""
        start = self._topic_end if self.kind == PUBLISH else 0
        return int.from_bytes(self.body[start : start + 2], "big")

    @property
    def _topic_end(self) -> int:
        return 2 + int.from_bytes(self.body[:2], "big")


def _split(buf: bytes) -> tuple[bytes, bytes, bytes] | None:
    """(first byte and header, body, rest) of the packet at the start of `buf`, or None."""
    length, shift, i = 0, 0, 1
    while True:
        if i >= len(buf):
            return None
        byte = buf[i]
        length |= (byte & 0x7F) << shift
        i += 1
        if byte < 0x80:
            break
        shift += 7
    if len(buf) < i + length:
        return None
    return buf[:i], buf[i : i + length], buf[i + length :]


def packet_types(data: bytes) -> list[int]:
    """The type (high nibble) of each whole packet in `data`, in order."""
    types = []
    while (split := _split(data)) is not None:
        head, _, data = split
        types.append(head[0] & 0xF0)
    return types


def _remaining(length: int) -> bytes:
    out = bytearray()
    while True:
        byte, length = length & 0x7F, length >> 7
        out.append(byte | 0x80 if length else byte)
        if not length:
            return bytes(out)


def publish_packet(topic: str, payload: bytes, mid: int, *, qos: int = 1) -> bytes:
    """A PUBLISH at QoS 1 (or `qos`; at QoS 0 without the packet id) (MQTT 3.1.1)."""
    name = topic.encode()
    body = len(name).to_bytes(2, "big") + name + (mid.to_bytes(2, "big") if qos else b"") + payload
    return bytes((PUBLISH | qos << 1,)) + _remaining(len(body)) + body


def puback_packet(mid: int) -> bytes:
    """The PUBACK of packet id `mid` (success)."""
    return bytes((PUBACK, 2)) + mid.to_bytes(2, "big")


def packet(first: int, body: bytes) -> bytes:
    """Any packet: its first byte, the remaining length, `body`."""
    return bytes((first,)) + _remaining(len(body)) + body


class FakeBroker:
    """Accepts one connection on `port`; `close()` ends it."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()  # one writer at a time
        self.reads: list[bytes] = []
        #: The client's protocol level, from its CONNECT.
        self.version = 4
        self.packets: list[Packet] = []
        self.subscribed = threading.Event()
        #: Packet types (high nibble) left unanswered: all of them for a silent broker.
        self.ignore: set[int] = set()
        #: The CONNACK sent (None: accepted, no session present, no properties).
        self.connack: bytes | None = None
        #: The QoS granted to every filter (None: what was asked).
        self.grant: int | None = None
        #: Connections accepted so far; `ended` once one of them was closed by the client.
        self.connections = 0
        self.ended = threading.Event()
        #: A send to the client found its buffers full: the client is not reading.
        self.blocked = threading.Event()
        self.flooded = threading.Event()
        self._threads = [threading.Thread(target=self._serve, daemon=True)]
        self._threads[0].start()

    def pubacks(self) -> list[Packet]:
        """The PUBACKs the client sent so far."""
        return [p for p in list(self.packets) if p.kind == PUBACK]

    def disconnect(self, reason: int) -> None:
        """Send an MQTT 5 DISCONNECT with `reason` (142: session taken over)."""
        self._send(bytes((DISCONNECT, 2, reason, 0)))

    def drop(self) -> None:
        """Close the connection now (the client may connect again)."""
        with self._lock:
            if self._sock is not None:
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_RDWR)

    def send(self, data: bytes) -> None:
        """Send these bytes to the client as they are."""
        self._send(data)

    def publish(self, messages: list[tuple[str, bytes, int]]) -> None:
        """Send these QoS 1 PUBLISHes (topic, payload, packet id) in one write."""
        self._send(b"".join(publish_packet(*message) for message in messages))

    def flood(self, topic: str, payloads: list[bytes]) -> None:
        """Send one QoS 1 PUBLISH per payload (ids 1, 2, …) from another thread, never
        blocking: whenever the client's buffers are full, `blocked` is set and it tries again a
        moment later. `flooded` once all is sent."""
        data = b"".join(publish_packet(topic, p, n + 1) for n, p in enumerate(payloads))
        thread = threading.Thread(target=self._flood, args=(data,), daemon=True)
        self._threads.append(thread)
        thread.start()

    def _flood(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            with self._lock:
                sock = self._sock
                assert sock is not None
                try:
                    view = view[sock.send(view, socket.MSG_DONTWAIT) :]
                except BlockingIOError:
                    self.blocked.set()
                except OSError:
                    return
            if self.blocked.is_set():
                time.sleep(0.005)
        self.flooded.set()

    def _send(self, data: bytes) -> None:
        with self._lock:
            assert self._sock is not None
            self._sock.sendall(data)

    def _serve(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._sock = sock
                self.connections += 1
            buf = b""
            with contextlib.suppress(OSError):
                while data := sock.recv(65536):
                    self.reads.append(data)
                    buf += data
                    while (packet := _split(buf)) is not None:
                        head, body, buf = packet
                        self._answer(Packet(head[0], body, len(self.reads) - 1))
            self.ended.set()
            sock.close()

    def _answer(self, packet: Packet) -> None:
        self.packets.append(packet)
        if packet.kind in self.ignore:
            return
        if packet.kind == CONNECT:
            self.version = packet.body[6]  # the protocol level: 4 (3.1.1) or 5
            # CONNACK, no session present, accepted (on 5: and no properties)
            default = b"\x20\x03\x00\x00\x00" if self.version == 5 else b"\x20\x02\x00\x00"
            self._send(default if self.connack is None else self.connack)
        elif packet.kind == SUBSCRIBE:
            filters, i, granted = packet.body, 2 + (self.version == 5), bytearray()
            while i < len(filters):
                i += 2 + int.from_bytes(filters[i : i + 2], "big")
                granted.append(filters[i] if self.grant is None else self.grant)
                i += 1
            head = packet.body[:2] + (b"\x00" if self.version == 5 else b"")  # v5: no properties
            self._send(bytes((0x90, len(head) + len(granted))) + head + bytes(granted))
            self.subscribed.set()
        elif packet.kind == PUBLISH and packet.first & 0x06:
            self._send(puback_packet(packet.mid))
        elif packet.kind == PINGREQ:
            self._send(b"\xd0\x00")
        elif packet.kind == PUBREC:  # a QoS 2 message received: release it
            self._send(b"\x62\x02" + packet.body[:2])

    def close(self) -> None:
        """End the connection and the listener (a thread blocked in `accept` wakes up: closing
        alone would leave it there until its join timed out)."""
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
        for thread in self._threads:
            thread.join(timeout=5)
