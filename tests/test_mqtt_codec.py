"""The MQTT codec of the daemon's link, against byte strings written out from the standards
(MQTT 3.1.1 and 5), and a broker's reason code for ending the session, on the wire."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest

from edgemon.daemon import mqtt_codec as codec
from edgemon.errors import ProtocolError

from daemons import logged
from links import running_link

if TYPE_CHECKING:
    from collections.abc import MutableMapping


def test_connect_3_1_1_with_will_and_credentials() -> None:
    """CONNECT, 3.1.1: protocol name and level 4, flags (user name, password, will retain,
    will QoS 1, will, clean session off), keep-alive, then the payload fields in order."""
    request = codec.ConnectRequest(
        client_id="id", keepalive_s=30, clean=False, username="u", password=b"p",
        will=codec.Will("w", b"off", qos=1, retain=True),
    )  # fmt: skip
    body = (
        b"\x00\x04MQTT\x04" + bytes((0x80 | 0x40 | 0x20 | 0x08 | 0x04,)) + b"\x00\x1e"
        + b"\x00\x02id" + b"\x00\x01w" + b"\x00\x03off" + b"\x00\x01u" + b"\x00\x01p"
    )  # fmt: skip
    assert codec.connect(request) == bytes((0x10, len(body))) + body


def test_subscribe_publish_puback_bytes() -> None:
    """SUBSCRIBE carries flags 0b0010 and each filter's QoS; PUBLISH QoS 1 retained carries
    its packet id; v5 adds an empty property length; PUBACK is 0x40 0x02 and the id (PUBREC,
    for QoS 2, 0x50 0x02)."""
    assert (
        codec.subscribe(7, [("a/+", 1)], version=codec.V311) == b"\x82\x08\x00\x07\x00\x03a/+\x01"
    )
    assert codec.subscribe(7, [("a", 0)], version=codec.V5) == b"\x82\x07\x00\x07\x00\x00\x01a\x00"
    assert (
        codec.publish("t", b"xy", qos=1, retain=True, mid=258, version=codec.V311)
        == b"\x33\x07\x00\x01t\x01\x02xy"
    )
    assert (
        codec.publish("t", b"", qos=0, retain=False, mid=0, version=codec.V5)
        == b"\x30\x04\x00\x01t\x00"
    )
    assert codec.acknowledgement(1, 0x1234) == b"\x40\x02\x12\x34"
    assert codec.acknowledgement(2, 0x1234) == b"\x50\x02\x12\x34"


def test_split_waits_for_the_whole_packet() -> None:
    """A packet is split only once all of it is there; a remaining length over several bytes
    (321 = 0xC1 0x02) is read; five length bytes are a protocol error."""
    packet = codec.publish("t", b"x" * 318, qos=0, retain=False, mid=0, version=codec.V311)
    assert packet[1:3] == b"\xc1\x02"
    for cut in range(len(packet)):
        assert codec.split(packet[:cut], 0) is None
    assert codec.split(b"??" + packet, 2) == (5, 5 + 321)
    with pytest.raises(ProtocolError):
        codec.split(b"\x30\xff\xff\xff\xff\x01", 0)


def test_decode_publish_and_acks() -> None:
    """PUBLISH: QoS, DUP, id and payload; v5 properties are skipped. CONNACK
    v5 properties are read (Server Keep Alive); a SUBACK's codes; a v5 DISCONNECT's reason."""
    body = b"\x00\x03a/b\x00\x09" + b"\x02\x01\x01" + b"pay"  # v5: Payload Format Indicator 1
    assert codec.decode_publish(0x3A, body, version=codec.V5) == ("a/b", b"pay", 1, True, 9)
    assert codec.decode_publish(0x30, b"\x00\x01tp", version=codec.V311) == ("t", b"p", 0, False, 0)
    connack = codec.decode_connack(b"\x01\x00\x03\x13\x00\x05", version=codec.V5)
    assert (connack.session_present, connack.refused) == (True, False)
    assert connack.properties == {codec.SERVER_KEEP_ALIVE: 5}
    assert codec.decode_connack(b"\x00\x05", version=codec.V311).refused
    assert codec.decode_suback(b"\x00\x02\x01\x80", version=codec.V311) == (2, b"\x01\x80")
    assert codec.decode_puback(b"\x00\x02") == (2, 0)
    assert codec.decode_disconnect(b"\x8e\x00") == (142, {})
    assert "session taken over" in codec.reason_text(142, version=codec.V5)
    assert "not authorised" in codec.reason_text(5, version=codec.V311)


@pytest.mark.asyncio
async def test_a_v5_takeover_is_reported_from_the_brokers_reason_code(
    captured_logs: list[MutableMapping[str, Any]],
) -> None:
    """On MQTT 5 a broker may say why it ends a session (DISCONNECT, reason 142 "session
    taken over"): the link reports the takeover at once, naming that cause, without waiting
    for a streak of short sessions. (Mosquitto 2.0.11 closes without saying it, so a broker
    that records the wire says it here.)"""
    async with running_link("v5-twin", "edgemon", protocol="5") as (link, broker):
        async with asyncio.timeout(30):
            while not link.connection.subscribed:  # noqa: ASYNC110 - state set by the link
                await asyncio.sleep(0.01)
            broker.disconnect(142)
            while not logged(captured_logs, "mqtt_session_taken_over"):  # noqa: ASYNC110
                await asyncio.sleep(0.01)
    report = logged(captured_logs, "mqtt_session_taken_over")[0]
    assert report["cause"] == "the broker reported the session taken over"
    assert report["sessions_lost"] == 1
    (lost,) = logged(captured_logs, "mqtt_disconnected")
    assert "session taken over (code 142)" in lost["error"]


def test_the_codec_refuses_what_the_standards_forbid() -> None:
    """A remaining length never takes more than four bytes (268,435,455 at most); a PUBLISH
    with both QoS bits set, with DUP at QoS 0, or with packet identifier 0 at QoS 1 or 2 is
    malformed; an MQTT 5 PUBLISH carrying a topic alias is refused (edgemon declares a Topic
    Alias Maximum of 0); QoS 2 is read (the connection answers it with PUBREC)."""
    assert codec.varint(codec.MAX_REMAINING_LENGTH) == b"\xff\xff\xff\x7f"
    with pytest.raises(ValueError, match="four bytes"):
        codec.varint(codec.MAX_REMAINING_LENGTH + 1)
    body = b"\x00\x01t\x00\x05p"
    for first, problem in ((0x36, "both QoS bits"), (0x38, "DUP")):
        with pytest.raises(ProtocolError, match=problem):
            codec.decode_publish(first, body, version=codec.V311)
    for first in (0x32, 0x34):
        with pytest.raises(ProtocolError, match="packet identifier 0"):
            codec.decode_publish(first, b"\x00\x01t\x00\x00p", version=codec.V311)
    aliased = b"\x00\x00\x00\x05" + b"\x03\x23\x00\x01" + b"p"  # empty topic, Topic Alias 1
    with pytest.raises(ProtocolError, match="topic alias"):
        codec.decode_publish(0x32, aliased, version=codec.V5)
    assert codec.decode_publish(0x34, body, version=codec.V311) == ("t", b"p", 2, False, 5)


def test_split_refuses_a_packet_over_the_limit_from_its_header() -> None:
    """`split` says a packet is too large as soon as its fixed header is in, before any of
    its body: a header announcing 50 MB is refused with 2 bytes of body received."""
    header = b"\x30" + codec.varint(50_000_000)
    with pytest.raises(codec.PacketTooLargeError, match="50,000,005 bytes"):
        codec.split(header + b"\x00\x01", 0, 1000)
    packet = codec.publish("t", b"x" * 990, qos=0, retain=False, mid=0, version=codec.V311)
    assert len(packet) == 996  # 1 + 2 (remaining length 993) + 2 + 1 + 990
    assert codec.split(packet, 0, 996) == (3, 996)
    with pytest.raises(codec.PacketTooLargeError):
        codec.split(packet, 0, 995)
