"""A strict, independent peer for the daemon's MQTT link: a TCP tap between the daemon and
a broker that keeps every packet of both directions, then has them read by MQTT codecs that
share no code with edgemon's, and checks the protocol's rules over the sequence.

- `MqttTap` relays bytes as they come and splits each direction into whole packets by the
  fixed header's Remaining Length (nothing more: the reading is the codecs'). A callback may
  look at each packet before it is passed on (`on_packet`).
- `mqtt5_problems`: MQTT 5 packets read by `mqtt5` (PyPI, a Rust codec that validates
  strictly: reserved flags, properties, lengths).
- `node_packets`: MQTT 3.1.1 or 5 packets read by `mqtt-packet` (Debian's `node-mqtt-packet`,
  the codec of the MQTT.js client) through `mqtt_packet_check.js`.
- `protocol_problems`: rules over the sequence of one connection (CONNECT first, packet
  identifiers, every QoS 1 PUBLISH acknowledged once and in order, SUBACK and PINGRESP
  answered, what a client may not send).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tools import require_tool, tools_required

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

#: The node script, and where Debian puts node modules (node from elsewhere does not look).
NODE_CHECK = str(Path(__file__).with_name("mqtt_packet_check.js"))
NODE_PATH = "/usr/share/nodejs"
#: Packet types by the fixed header's upper nibble.
KINDS = {
    1: "connect", 2: "connack", 3: "publish", 4: "puback", 5: "pubrec", 6: "pubrel",
    7: "pubcomp", 8: "subscribe", 9: "suback", 10: "unsubscribe", 11: "unsuback",
    12: "pingreq", 13: "pingresp", 14: "disconnect", 15: "auth",
}  # fmt: skip
#: What only a server sends, and what only a client sends.
SERVER_ONLY = frozenset({"connack", "suback", "unsuback", "pingresp"})
CLIENT_ONLY = frozenset({"connect", "subscribe", "unsubscribe", "pingreq"})


@dataclass(slots=True)
class Packet:
    """One whole packet as it crossed the tap: `out` from the daemon to the broker, `in` the
    other way; `order` across both directions of all connections; what `on_packet` kept."""

    order: int
    connection: int
    direction: str
    data: bytes
    kept: Any = None

    @property
    def kind(self) -> str:
        return KINDS.get(self.data[0] >> 4, "reserved")


@dataclass(slots=True)
class PacketSplitter:
    """Cuts a byte stream into packets by the Remaining Length (at most 4 bytes)."""

    buffer: bytearray = field(default_factory=bytearray)

    def feed(self, data: bytes) -> list[bytes]:
        self.buffer += data
        packets: list[bytes] = []
        while len(self.buffer) >= 2:
            length, multiplier, index = 0, 1, 1
            while True:
                if index >= len(self.buffer):
                    return packets
                byte = self.buffer[index]
                length += (byte & 0x7F) * multiplier
                multiplier *= 128
                index += 1
                if not byte & 0x80:
                    break
                if index > 4:
                    raise ValueError("a Remaining Length beyond 4 bytes")
            end = index + length
            if len(self.buffer) < end:
                return packets
            packets.append(bytes(self.buffer[:end]))
            del self.buffer[:end]
        return packets


class MqttTap:
    """A TCP relay on a free loopback port to 127.0.0.1:`target` that keeps every packet
    (`packets`, in the order the tap passed them on)."""

    def __init__(
        self, target: int, *, on_packet: Callable[[str, bytes], Any] | None = None
    ) -> None:
        self.target = target
        self.packets: list[Packet] = []
        #: Bytes that could not be cut into packets (a Remaining Length beyond 4 bytes).
        self.framing_errors: list[str] = []
        self._on_packet = on_packet
        self._lock = threading.Lock()
        self._connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._open: set[socket.socket] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="mqtt-tap", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closed = True
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(timeout=5)

    def of(self, connection: int) -> list[Packet]:
        """The packets of one connection (numbered from 0), in order."""
        with self._lock:
            return [p for p in self.packets if p.connection == connection]

    def kinds(self) -> set[tuple[str, str]]:
        """(direction, kind) of every packet so far."""
        with self._lock:
            return {(p.direction, p.kind) for p in self.packets}

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            upstream.settimeout(None)
            with self._lock:
                number = self._connections
                self._connections += 1
                self._open.update((client, upstream))
            for source, sink, direction in ((client, upstream, "out"), (upstream, client, "in")):
                threading.Thread(
                    target=self._relay, args=(source, sink, direction, number), daemon=True
                ).start()

    def _relay(
        self, source: socket.socket, sink: socket.socket, direction: str, number: int
    ) -> None:
        splitter = PacketSplitter()
        try:
            while data := source.recv(65536):
                try:
                    whole = splitter.feed(data)
                except ValueError as error:
                    self.framing_errors.append(f"{direction}: {error}")
                    whole = []
                for packet in whole:
                    kept = self._on_packet(direction, packet) if self._on_packet else None
                    with self._lock:  # recorded before it is passed on: causes come first
                        self.packets.append(
                            Packet(len(self.packets), number, direction, packet, kept)
                        )
                    sink.sendall(packet)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_RDWR)


# ------------------------------------------------------------------ the codecs
def require_peer() -> None:
    """node and mqtt-packet installed (Debian: nodejs, node-mqtt-packet); else skip the test,
    or fail it under `EDGEMON_REQUIRE_TOOLS=1`."""
    require_tool("node")
    if not (Path(NODE_PATH) / "mqtt-packet").is_dir():
        message = f"not installed: mqtt-packet in {NODE_PATH} (Debian: node-mqtt-packet)"
        if tools_required():
            pytest.fail(message)
        pytest.skip(message)


def mqtt5_problems(packets: Iterable[Packet]) -> list[str]:
    """Each packet read by `mqtt5` (MQTT 5 only): what it refused, or read short."""
    import mqtt5  # noqa: PLC0415 - a test dependency, only where MQTT 5 is checked

    problems = []
    for packet in packets:
        try:
            _, read = mqtt5.read(memoryview(packet.data))
        except (ValueError, IndexError) as error:
            problems.append(f"#{packet.order} {packet.direction} {packet.kind}: {error}")
            continue
        if read != len(packet.data):
            problems.append(
                f"#{packet.order} {packet.direction}: read {read} of {len(packet.data)}"
            )
    return problems


def node_packets(version: int, packets: list[Packet]) -> list[dict[str, Any]]:
    """Each packet read by mqtt-packet (`version` 4 for MQTT 3.1.1, 5): `{"packet": ...}` or
    `{"error": ...}`, in order."""
    request = {
        "version": version,
        "frames": [{"dir": p.direction, "hex": p.data.hex()} for p in packets],
    }
    env = {**os.environ, "NODE_PATH": NODE_PATH}
    done = subprocess.run(
        ["node", NODE_CHECK], input=json.dumps(request).encode(), capture_output=True,
        env=env, check=True, timeout=60,
    )  # fmt: skip
    results: list[dict[str, Any]] = json.loads(done.stdout)
    return results


# ------------------------------------------------------------------ the rules
def protocol_problems(packets: list[tuple[Packet, dict[str, Any]]]) -> list[str]:
    """The rules over one connection's packets, each with what mqtt-packet read from it:
    what breaks them."""
    problems: list[str] = []
    out_flight: set[int] = set()  # our QoS 1 PUBLISHes not yet acknowledged
    in_flight: list[int] = []  # the broker's QoS 1 PUBLISHes, in receipt order
    subscribing: set[int] = set()
    pings = 0
    for number, (packet, read) in enumerate(packets):
        kind, direction, at = read["cmd"], packet.direction, f"#{packet.order} {packet.direction}"
        if number == 0 and (direction, kind) != ("out", "connect"):
            problems.append(f"{at}: the first packet is {kind}, not CONNECT")
        if (direction == "out" and kind in SERVER_ONLY) or (
            direction == "in" and kind in CLIENT_ONLY
        ):
            problems.append(f"{at}: {kind} from the wrong side")
        ident: int = read.get("messageId") or 0
        if kind == "publish" and read["qos"] > 0:
            if not ident:
                problems.append(f"{at}: a QoS {read['qos']} PUBLISH without a packet id")
            elif direction == "out":
                if ident in out_flight and not read["dup"]:
                    problems.append(f"{at}: packet id {ident} reused while in flight")
                out_flight.add(ident)
            else:
                in_flight.append(ident)
        elif kind == "puback" and direction == "in":
            if ident not in out_flight:
                problems.append(f"{at}: PUBACK {ident} for nothing in flight")
            out_flight.discard(ident)
        elif kind == "puback":
            if not in_flight or in_flight[0] != ident:
                problems.append(f"{at}: PUBACK {ident}, the oldest unacknowledged is {in_flight}")
            with contextlib.suppress(ValueError):
                in_flight.remove(ident)
        elif kind == "subscribe":
            subscribing.add(ident)
        elif kind == "suback":
            if ident not in subscribing:
                problems.append(f"{at}: SUBACK {ident} for no SUBSCRIBE")
            subscribing.discard(ident)
        elif kind == "pingreq":
            pings += 1
        elif kind == "pingresp":
            pings -= 1
            if pings < 0:
                problems.append(f"{at}: PINGRESP without a PINGREQ")
    return problems
