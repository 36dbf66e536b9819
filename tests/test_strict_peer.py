"""The daemon's MQTT link read by a strict, independent peer (docs/reliability.md,
"Conformance"): a session between the daemon and a broker (Mosquitto; amqtt, MQTT 3.1.1
only) through a tap (`strict_peer`),
every packet of both directions read by codecs that share no code with edgemon's (mqtt-packet,
and for MQTT 5 the `mqtt5` codec too), and the protocol's rules checked over the sequence.

The session exercises what the link does: CONNECT with a will, SUBSCRIBE, QoS 1 PUBLISHes in
(events, a retained engine object) and out (retained throttle objects and status), PUBACKs
both ways, PINGREQ (keep-alive 2 s, nothing else written meanwhile) and DISCONNECT at a clean
stop. Each PUBACK of the daemon is also checked to come after the message it acknowledges is
in the write-ahead log (as the tap sees the log when it passes the PUBACK on).
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import pytest

from edgemon.daemon import Daemon
from edgemon.settings import HttpSettings, MqttSettings, Settings, StateSettings

from clients import WAIT_S, P, device, throttle_on_then_off, watching
from daemons import running
from strict_peer import (
    MqttTap,
    Packet,
    mqtt5_problems,
    node_packets,
    protocol_problems,
    require_peer,
)

if TYPE_CHECKING:
    from pathlib import Path

    from brokers import Broker

pytestmark = pytest.mark.integration

#: What the session must have shown the peer: (direction, packet type).
EXERCISED = {
    ("out", "connect"), ("in", "connack"), ("out", "subscribe"), ("in", "suback"),
    ("in", "publish"), ("out", "puback"), ("out", "publish"), ("in", "puback"),
    ("out", "pingreq"), ("in", "pingresp"), ("out", "disconnect"),
}  # fmt: skip


def logged_payloads(state: Path) -> set[str]:
    """The payloads the write-ahead log holds now."""
    found = set()
    for path in sorted(state.glob("wal.*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                found.add(json.loads(line)["payload"])
            except (ValueError, KeyError, TypeError):
                continue  # a line being written
    return found


def acknowledged_before_logged(packets: list[Packet], read: list[dict[str, Any]]) -> list[str]:
    """The daemon's PUBACKs whose message was not in the log when the tap passed them on."""
    problems = []
    latest: dict[int, str] = {}  # packet id -> payload of the broker's last PUBLISH with it
    for packet, parsed in zip(packets, read, strict=True):
        if packet.direction == "in" and parsed["cmd"] == "publish" and parsed["qos"] == 1:
            latest[parsed["messageId"]] = bytes.fromhex(parsed["payload"]).decode()
        elif (
            packet.direction == "out"
            and parsed["cmd"] == "puback"
            and latest.get(parsed["messageId"]) not in packet.kept
        ):
            problems.append(f"#{packet.order}: PUBACK {parsed['messageId']} before the log")
    return problems


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("any_broker", "protocol"),
    [("mosquitto", "3.1.1"), ("mosquitto", "5"), ("amqtt", "3.1.1")],  # amqtt: 3.1.1 only
    indirect=["any_broker"],
)
async def test_a_session_reads_clean_to_independent_codecs(
    any_broker: Broker, tmp_path: Path, protocol: str
) -> None:
    """Every packet the link writes and reads in a whole session is read by mqtt-packet (and,
    for MQTT 5, by `mqtt5`) without an error: no malformed packet, no reserved flag set, no
    property out of place; the sequence keeps the rules (CONNECT first, packet ids, each QoS 1
    PUBLISH acknowledged once and in receipt order, SUBACK and PINGRESP answered); and every
    PUBACK of the daemon left after the message it acknowledges was in the log."""
    require_peer()
    broker = any_broker
    state = tmp_path / "state"

    def keep(direction: str, data: bytes) -> set[str] | None:
        """At the daemon's PUBACK: what the log holds as the tap passes it on."""
        return logged_payloads(state) if direction == "out" and data[0] >> 4 == 4 else None

    tap = MqttTap(broker.port, on_packet=keep)
    settings = Settings(
        mqtt=MqttSettings(
            url=f"mqtt://127.0.0.1:{tap.port}", client_id="edgemon-strict", protocol=protocol,
            keepalive_s=2, heartbeat_s=3600,
        ),
        http=HttpSettings(listen="127.0.0.1:0"),
        state=StateSettings(dir=state, snapshot_interval_s=3600),
    )  # fmt: skip
    try:
        async with (
            watching(broker) as watcher,
            running(Daemon(settings, environ={}, install_signal_handlers=False)),
        ):
            async with device(broker) as client:
                await client.publish(f"{P}/d1/engine", b'{"margin_ms":80}', qos=1, retain=True)
            await throttle_on_then_off(broker, watcher, "d1")
            async with asyncio.timeout(WAIT_S):
                while not {("out", "pingreq"), ("in", "pingresp")} <= tap.kinds():  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
    finally:
        await asyncio.to_thread(tap.close)
    packets = tap.of(0)
    assert tap.framing_errors == []
    assert {(p.direction, p.kind) for p in packets} >= EXERCISED
    read = node_packets(5 if protocol == "5" else 4, packets)
    assert [
        (p.order, p.direction, r) for p, r in zip(packets, read, strict=True) if "error" in r
    ] == []
    if protocol == "5":
        assert mqtt5_problems(packets) == []
    parsed = [r["packet"] for r in read]
    assert protocol_problems(list(zip(packets, parsed, strict=True))) == []
    assert acknowledged_before_logged(packets, parsed) == []
    retained_out = {
        r["topic"].rsplit("/", 1)[-1]
        for p, r in zip(packets, parsed, strict=True)
        if p.direction == "out" and r["cmd"] == "publish" and r["retain"] and r["qos"] == 1
    }
    assert retained_out == {"throttle", "status"}
    assert parsed[-1]["cmd"] == "disconnect"


def test_the_peer_refuses_what_mqtt_forbids() -> None:
    """The peer is not lenient: mqtt-packet refuses a PUBACK with a reserved flag set and a
    SUBSCRIBE without its mandatory flags (MQTT 3.1.1), `mqtt5` refuses the PUBACK too, and
    the rules catch a QoS 1 PUBLISH without a packet id, a PUBACK out of receipt order and a
    first packet that is not CONNECT."""
    require_peer()
    bad = [
        Packet(0, 0, "in", bytes([0x42, 0x02, 0x00, 0x01])),  # PUBACK, flags 0b0010
        Packet(1, 0, "out", bytes([0x80, 0x06, 0x00, 0x01, 0x00, 0x01, 0x61, 0x01])),
    ]
    read = node_packets(4, bad)
    assert ["error" in r for r in read] == [True, True]
    assert len(mqtt5_problems(bad[:1])) == 1
    publish = {"cmd": "publish", "qos": 1, "dup": False, "retain": False}
    sequence = [
        (Packet(0, 0, "in", b""), publish | {"messageId": 1}),
        (Packet(1, 0, "in", b""), publish | {"messageId": 2}),
        (Packet(2, 0, "out", b""), publish | {"messageId": 0}),
        (Packet(3, 0, "out", b""), {"cmd": "puback", "messageId": 2}),
    ]
    problems = protocol_problems(sequence)
    assert len(problems) == 3, problems
