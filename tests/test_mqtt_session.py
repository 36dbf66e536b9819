"""The daemon's MQTT session on a fake clock (docs/reliability.md, "A silent broker",
"Overload"): liveness, the deadlines of the broker's answers and its Receive Maximum; with
the intake, backpressure and redelivery. No socket and no real time: each test runs in
milliseconds and asserts the instants the rules name."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest
from sessions import PINGRESP, Clock, SessionWire, Timeline, accepted, events, sent, unexpected

from edgemon.daemon.intake import REDELIVERY_WINDOW_S, Intake
from edgemon.daemon.mqtt_codec import V5
from edgemon.daemon.mqtt_session import Answered
from edgemon.errors import ConnectionLostError

from fake_broker import PINGREQ, PUBACK, puback_packet, publish_packet

if TYPE_CHECKING:
    from collections.abc import Callable

    from edgemon.daemon.mqtt_session import Event, Session

TOPIC = "edgemon/v1/d/events"
#: The defaults (`MqttSettings`): keep-alive 30 s, a heartbeat every 5 s.
KEEPALIVE_S, HEARTBEAT_S = 30, 5.0


def write_every(timeline: Timeline, every_s: float, *, qos: int) -> None:
    """Publish a retained message every `every_s` s of the timeline (a heartbeat, at `qos`)
    until the session ends: ConnectionLostError (returns after 1,000 if it does not)."""
    for step in range(1, 1001):
        timeline.to(step * every_s)
        timeline.session.publish("status", b"online", qos=qos, retain=True, now=timeline.now)


def test_an_idle_session_pings_and_lives_on_the_answers() -> None:
    """Keep-alive 1 s and nothing else to send: a PINGREQ goes out 1 s after the CONNACK
    (a broker drops a client silent for 1.5 keep-alives), the next a keep-alive after it,
    and so on; each answered, the session stays up."""
    session = accepted(keepalive_s=1)
    timeline = Timeline(session)
    timeline.to(0.999)
    assert sent(session) == []
    timeline.to(1.0)
    assert sent(session) == [PINGREQ]
    session.receive_data(PINGRESP, 1.01)
    assert events(session, 1.01) == []
    timeline.to(1.999)
    assert sent(session) == []
    timeline.to(2.0)
    assert sent(session) == [PINGREQ]
    for second in range(3, 60):  # answered every time: it never ends
        session.receive_data(PINGRESP, timeline.now + 0.01)
        assert events(session, timeline.now) == []
        timeline.to(second + 0.02)
    assert sent(session) == [PINGREQ] * 57


def test_it_pings_when_nothing_is_received_whatever_it_writes() -> None:
    """Keep-alive 1 s; edgemon writes a QoS 0 message every 50 ms (nothing to answer, so no
    deadline) and the broker is silent. Writing does not put the ping off: nothing was
    received for a keep-alive, so a PINGREQ goes out at 1 s; unanswered, the session ends
    half a keep-alive later, at 1.5 s, naming the keep-alive."""
    session = accepted(keepalive_s=1)
    timeline = Timeline(session)
    with pytest.raises(ConnectionLostError) as lost:
        write_every(timeline, 0.05, qos=0)
    assert timeline.now == pytest.approx(1.5)
    assert "stopped answering" in str(lost.value)
    assert "PINGREQ unanswered (keep-alive 1 s)" in str(lost.value)
    assert PINGREQ in sent(session)


@pytest.mark.parametrize(("heartbeat_qos", "ends_at"), [(1, 35.0), (0, 45.0)])
def test_a_black_holed_broker_is_noticed_within_1_5_keep_alives_at_the_defaults(
    heartbeat_qos: int, ends_at: float
) -> None:
    """At the defaults (keep-alive 30 s, a heartbeat every 5 s) the broker goes silent right
    after the CONNACK, while edgemon keeps writing its heartbeat into the hole (a link that
    pinged only when it had written nothing for a while would never notice). At QoS 1 (the
    daemon's) the first unanswered heartbeat, sent at 5 s, ends the session a keep-alive
    later, at 35 s; at QoS 0 the ping does, at 45 s: within 1.5 keep-alives either way."""
    session = accepted(keepalive_s=KEEPALIVE_S)
    timeline = Timeline(session)
    with pytest.raises(ConnectionLostError) as lost:
        write_every(timeline, HEARTBEAT_S, qos=heartbeat_qos)
    assert timeline.now == ends_at
    said = "did not answer a PUBLISH within 30 s" if heartbeat_qos else "stopped answering"
    assert said in str(lost.value)


@pytest.mark.parametrize("what", ["PUBLISH", "SUBSCRIBE", "UNSUBSCRIBE"])
def test_a_request_left_unanswered_ends_the_session_a_keep_alive_later(what: str) -> None:
    """A broker that answers pings but never this request (the `online` status at connect,
    a heartbeat, a throttle object; the subscription; the stale filters dropped): the session
    ends a keep-alive (the answer's deadline by default) after the request was sent, not
    before, and says which request was not answered."""
    session = accepted(keepalive_s=1)
    timeline = Timeline(session)
    timeline.to(0.3)
    send: dict[str, Callable[[Session], int]] = {
        "PUBLISH": lambda s: s.publish("t/q1", b"x", qos=1, retain=False, now=0.3),
        "SUBSCRIBE": lambda s: s.subscribe([("t/#", 1)], 0.3),
        "UNSUBSCRIBE": lambda s: s.unsubscribe(["t/#"], 0.3),
    }
    assert send[what](session) == 1
    timeline.to(1.2)  # a keep-alive after the CONNACK: a PINGREQ, answered
    assert PINGREQ in sent(session)
    session.receive_data(PINGRESP, 1.2)
    assert events(session, 1.2) == []
    timeline.to(1.299)
    with pytest.raises(ConnectionLostError, match=f"did not answer a {what} within 1 s"):
        timeline.to(5.0)
    assert timeline.now == pytest.approx(1.3)


def test_an_answer_behind_a_backlog_being_delivered_is_late_not_lost() -> None:
    """Keep-alive 1 s. The broker holds back its PUBACK of edgemon's PUBLISH for 2.5 s (two
    and a half of the answer's deadlines) while it delivers a message every 50 ms, as a broker
    does whose answer waits behind the backlog it delivers: the session stays up and takes
    the PUBACK when it comes. (Before, the link ended the connection after 1 s: under a flood
    on a slow machine that reconnection dropped the QoS 0 part of the backlog.) Once the
    deliveries stop, an answer still missing is overdue a keep-alive after the last one."""
    session = accepted(keepalive_s=1)
    timeline = Timeline(session)
    mid = session.publish("t/q1", b"x", qos=1, retain=False, now=0.0)
    delivered: list[Event] = []
    for n in range(1, 51):
        timeline.to(n * 0.05)
        session.receive_data(publish_packet(TOPIC, b"%d" % n, n), timeline.now)
        if PINGREQ in sent(session):  # the broker answers pings
            session.receive_data(PINGRESP, timeline.now)
        delivered += events(session, timeline.now)
    assert [event[1] for event in delivered if isinstance(event, tuple)] == [
        b"%d" % n for n in range(1, 51)
    ]
    session.receive_data(puback_packet(mid), 2.5)
    assert events(session, 2.5) == [Answered(mid, b"\x00")]
    late = session.publish("t/q1", b"y", qos=1, retain=False, now=2.5)
    with pytest.raises(ConnectionLostError, match="did not answer a PUBLISH"):
        timeline.to(10.0)
    assert timeline.now == pytest.approx(3.5)
    assert late != mid


def test_the_brokers_receive_maximum_bounds_the_publishes_in_flight() -> None:
    """An MQTT 5 broker with Receive Maximum 2: two QoS 1 PUBLISHes may be out unanswered, a
    third may not (QoS 0 ones do not count); each PUBACK makes room for one more, whoever
    still waits for it."""
    connack = b"\x20\x06\x00\x00\x03\x21\x00\x02"  # accepted, Receive Maximum 2
    session = accepted(version=V5, keepalive_s=30, connack=connack)
    first = session.publish("t/1", b"1", qos=1, retain=False, now=0.0)
    session.publish("t/2", b"2", qos=1, retain=False, now=0.0)
    session.publish("t/0", b"0", qos=0, retain=False, now=0.0)
    assert not session.may_publish
    with pytest.raises(RuntimeError, match="Receive Maximum"):
        session.publish("t/3", b"3", qos=1, retain=False, now=0.0)
    session.receive_data(puback_packet(first), 0.1)
    assert events(session, 0.1) == [Answered(first, b"\x00")]
    assert session.may_publish


def reading(
    clock: Clock, *, hold: bool = True, messages: int = 4096
) -> tuple[Intake, list[bytes], list[Callable[[], None]]]:
    """An intake on `clock` that pauses at `messages` not yet durable, whose log holds every
    batch until the test says it is durable (or, without `hold`, makes each durable at once):
    the intake, the payloads it applied, the batches held."""
    applied: list[bytes] = []
    held: list[Callable[[], None]] = []
    intake = Intake(
        lambda _topic, payload: applied.append(payload),
        when_durable=held.append if hold else lambda batch: batch(),
        pending_limits=(messages, 1 << 40),
        clock=clock,
    )
    return intake, applied, held


def durable(held: list[Callable[[], None]]) -> None:
    """Every batch held so far is durable now."""
    batches = list(held)
    held.clear()
    for batch in batches:
        batch()


@pytest.mark.asyncio
async def test_a_paused_intake_does_not_stop_the_liveness_check() -> None:
    """The intake pauses after 4 messages (the log holds every batch: nothing is durable),
    so the driver takes nothing more from the session and reads no more; then the broker goes
    silent. The check runs all the same: a PINGREQ a keep-alive after the CONNACK, the end
    half a keep-alive later (within 1.5 keep-alives of the last byte read); nothing applied
    was acknowledged (the broker delivers it again)."""
    clock = Clock()
    session = accepted(keepalive_s=1)
    timeline = Timeline(session, clock)
    intake, applied, _ = reading(clock, messages=4)
    wire = SessionWire(timeline)
    intake.begin(wire, persistent=True)
    clock.now = 0.2
    session.receive_data(b"".join(publish_packet(TOPIC, b"%d" % n, n) for n in range(1, 9)), 0.2)
    assert not intake.read(session, 0.2, budget=16, control=unexpected)
    assert intake.paused
    assert not wire.reading
    assert applied == [b"1", b"2", b"3", b"4"]
    with pytest.raises(ConnectionLostError, match="stopped answering"):
        timeline.to(10.0)
    assert timeline.now == pytest.approx(1.5)
    await asyncio.sleep(0)  # the intake's acknowledgements would have gone out by now
    assert sent(session) == [PINGREQ]


@pytest.mark.asyncio
async def test_backpressure_pauses_at_the_limit_and_acknowledges_only_what_is_durable() -> None:
    """24 QoS 1 messages (packet ids in no order) arrive at once; the intake's limit is 8
    messages not yet durable. It takes 8, applies them, and pauses (the driver stops reading:
    the broker holds the rest); no PUBACK leaves while the log holds them. Once durable, their
    8 PUBACKs leave in one write, in the order received, and reading resumes; so on until all
    24 are applied and acknowledged, none shed."""
    clock = Clock()
    session = accepted(keepalive_s=30)
    intake, applied, held = reading(clock, messages=8)
    wire = SessionWire(Timeline(session, clock))
    intake.begin(wire, persistent=True)
    mids = [9, 3, 200, 1, 77, 4, 65535, 12, 2, 100, 5, 6, 7, 8, 10, 11, 13, 14, 15, 16, 17, 18,
            19, 20]  # fmt: skip
    session.receive_data(b"".join(publish_packet(TOPIC, b"%d" % m, m) for m in mids), 0.0)
    acknowledged: list[int] = []
    while len(acknowledged) < len(mids):
        assert wire.reading
        intake.read(session, clock.now, budget=16, control=unexpected)
        assert intake.paused
        assert not wire.reading
        assert len(applied) == len(acknowledged) + 8
        await asyncio.sleep(0)
        assert session.data_to_send() == b""  # nothing durable: no PUBACK
        durable(held)
        await asyncio.sleep(0)
        out = session.data_to_send()
        assert set(out[::4]) == {PUBACK}  # PUBACKs only, 4 bytes each, in one write
        acknowledged += [int.from_bytes(out[i + 2 : i + 4], "big") for i in range(0, len(out), 4)]
    assert acknowledged == mids
    assert applied == [b"%d" % m for m in mids]
    assert intake.pending == 0


def dup(packet: bytes) -> bytes:
    """`packet` (a PUBLISH) with the DUP flag set: the broker delivers it again."""
    return bytes((packet[0] | 0x08,)) + packet[1:]


async def deliver(session: Session, intake: Intake, data: bytes, at: float) -> list[int]:
    """The broker sends `data` at `at`; the intake reads it (its log durable at once): the
    packet types the session then writes."""
    session.receive_data(data, at)
    intake.read(session, at, budget=16, control=unexpected)
    await asyncio.sleep(0)  # the acknowledgements go out
    return sent(session)


async def session_at(intake: Intake, clock: Clock, begin: float) -> Session:
    """A new session of the intake, accepted at `begin`."""
    session = accepted(keepalive_s=30, at=begin)
    clock.now = begin
    intake.begin(SessionWire(Timeline(session, clock)), persistent=True)
    return session


ONCE = publish_packet(TOPIC, b"once", 7)


async def lost_after_acknowledging(
    clock: Clock, *, ended: float, next_begins: float
) -> tuple[Intake, list[bytes], Session]:
    """A session from 0 s to `ended` in which the message `ONCE` was applied and acknowledged
    (its PUBACK may not have reached the broker before the end), then the next session, from
    `next_begins`: the intake, what it applied, the next session."""
    intake, applied, _ = reading(clock, hold=False)
    first = await session_at(intake, clock, 0.0)
    assert await deliver(first, intake, ONCE, 0.0) == [PUBACK]
    clock.now = ended
    intake.end(persistent=True)
    return intake, applied, await session_at(intake, clock, next_begins)


@pytest.mark.asyncio
async def test_a_message_acknowledged_as_the_session_ended_is_applied_once() -> None:
    """A message applied and acknowledged just before the connection was lost (its PUBACK may
    not have reached the broker) comes again, DUP, to the next session: acknowledged, not
    applied a second time. It was expected once: the same message again is applied. The
    first session lasted 50 s and the next began 20 s after it: the message is recognised
    all the same (before, the window opened at the first session's start ran out in
    between, 60 s after it, and forgot what the next should expect)."""
    clock = Clock()
    intake, applied, second = await lost_after_acknowledging(clock, ended=50.0, next_begins=70.0)
    assert await deliver(second, intake, dup(ONCE), 71.0) == [PUBACK]
    assert applied == [b"once"]
    assert intake.redelivered == 1
    assert await deliver(second, intake, dup(ONCE), 71.5) == [PUBACK]
    assert applied == [b"once", b"once"]


@pytest.mark.asyncio
async def test_redeliveries_are_expected_for_a_window_after_the_session_begins() -> None:
    """What the previous session left unconfirmed is expected again only in the first
    `REDELIVERY_WINDOW_S` of the next session (a broker redelivers right after the CONNACK):
    a DUP message with the same topic and payload after that is a new message, applied."""
    clock = Clock()
    intake, applied, second = await lost_after_acknowledging(clock, ended=1.0, next_begins=2.0)
    late = 2.0 + REDELIVERY_WINDOW_S
    clock.now = late
    assert await deliver(second, intake, dup(ONCE), late) == [PUBACK]
    assert applied == [b"once", b"once"]
    assert intake.redelivered == 0
