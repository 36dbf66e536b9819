"""The ThrottleGate on a real Mosquitto: it follows the retained throttle object and edgemon's
status, fails open, reconnects, bounds holds with `max_hold_ms`, and reads its environment."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

import pytest

from edgemon.client import GateState, ThrottleGate

from mqtt_probe import probe
from ports import MosquittoServer
from sockets import left_open

if TYPE_CHECKING:
    from pathlib import Path

    from brokers import Broker

T = 15.0  # generous: a loaded machine


def status(broker: Broker, instance: str) -> str:
    return broker.topic("_edgemon", instance, "status")


def throttle(on: bool, seq: int, **extra: Any) -> dict[str, Any]:
    return {"device": "dev1", "throttle": on, "t_ms": 1000.0 + seq, "seq": seq} | extra


def active(state: GateState) -> bool:
    return state.active


def inactive(state: GateState) -> bool:
    return not state.active


class FakeClock:
    """Monotonic seconds that only move when the test says so; `break_here()` makes it raise
    when read from the calling thread (the scheduler's, in these tests) until `mend()`."""

    def __init__(self) -> None:
        self.now = 100.0
        self._broken_in: int | None = None

    def break_here(self) -> None:
        self._broken_in = threading.get_ident()

    def mend(self) -> None:
        self._broken_in = None

    def __call__(self) -> float:
        if self._broken_in == threading.get_ident():
            raise OSError("clock gone")
        return self.now


@pytest.mark.integration
def test_follows_throttle_and_status(mosquitto_broker: Broker) -> None:
    """True only while the throttle object says so and an instance is online; an older or
    equal `seq` is ignored; the state snapshot carries the object's fields; `offline` from the
    only instance fails open, and a second online instance keeps it online."""
    broker = mosquitto_broker
    throttle_at = broker.topic("dev1", "throttle")
    with probe(broker.host, broker.port) as edgemon, broker.gate("dev1") as gate:
        assert not gate.should_throttle_prefills()  # nothing known yet
        edgemon.publish(throttle_at, throttle(True, 10, streams=["a"], min_headroom_ms=12.5))
        assert gate.wait_until(lambda s: s.throttle is True and s.connected, T)
        assert not gate.should_throttle_prefills()  # status unknown: fail-open
        edgemon.publish(status(broker, "e1"), {"state": "online", "version": "x", "t_ms": 1})
        assert gate.wait_until(active, T)
        assert gate.should_throttle_prefills()
        state = gate.state
        assert (state.seq, state.t_ms, state.streams, state.min_headroom_ms) == (
            10, 1010.0, ("a",), 12.5,
        )  # fmt: skip
        assert state.instances == {"e1": "online"}

        edgemon.publish(throttle_at, throttle(True, 12))
        assert gate.wait_until(lambda s: s.seq == 12, T)
        edgemon.publish(throttle_at, throttle(False, 9))  # out of order: ignored
        edgemon.publish(throttle_at, throttle(False, 12))  # a duplicate: ignored
        edgemon.publish(status(broker, "e2"), {"state": "online"})
        assert gate.wait_until(lambda s: len(s.instances) == 2, T)
        assert gate.should_throttle_prefills()
        assert gate.stats.stale_ignored == 2

        edgemon.publish(status(broker, "e1"), {"state": "offline"})
        assert gate.wait_until(lambda s: s.instances.get("e1") == "offline", T)
        assert gate.should_throttle_prefills()  # e2 is still online
        edgemon.publish(status(broker, "e2"), b"")  # its retained status removed
        assert gate.wait_until(inactive, T)
        assert not gate.should_throttle_prefills()
        assert not gate.state.edgemon_online

        edgemon.publish(status(broker, "e1"), {"state": "online"})
        assert gate.wait_until(active, T)
        assert gate.should_throttle_prefills()
        edgemon.publish(throttle_at, throttle(False, 13))
        assert gate.wait_until(inactive, T)
        assert not gate.should_throttle_prefills()
        edgemon.publish(throttle_at, b"{not json")
        assert gate.wait_until(lambda _: gate.stats.unreadable == 1, T)
        assert gate.state.throttle is None  # unreadable: the device's throttle is forgotten
        stats = gate.stats
        assert stats.holds == 2
        assert stats.held_s > 0
        assert stats.max_hold_releases == 0


@pytest.mark.integration
def test_online_accepts_a_lower_seq_once(mosquitto_broker: Broker) -> None:
    """After an `online` status of a new process (a restarted edgemon, perhaps with its clock
    stepped back: another `started_ms`) the next throttle object is taken whatever its `seq`;
    later ones are ordered again. A heartbeat (the same `started_ms`) changes nothing."""
    broker = mosquitto_broker
    throttle_at = broker.topic("dev1", "throttle")
    with probe(broker.host, broker.port) as edgemon, broker.gate("dev1") as gate:
        edgemon.publish(status(broker, "e1"), {"state": "online", "started_ms": 1})
        edgemon.publish(throttle_at, throttle(True, 500))
        assert gate.wait_until(active, T)
        edgemon.publish(throttle_at, throttle(True, 501))  # ordered: whichever came first above
        assert gate.wait_until(lambda s: s.seq == 501, T)
        edgemon.publish(status(broker, "e1"), {"state": "online", "started_ms": 1})  # a heartbeat
        edgemon.publish(throttle_at, throttle(False, 400))
        assert gate.wait_until(lambda _: gate.stats.stale_ignored == 1, T)
        assert gate.state.active
        edgemon.publish(status(broker, "e1"), {"state": "online", "started_ms": 2})  # a restart
        edgemon.publish(throttle_at, throttle(False, 7))
        assert gate.wait_until(inactive, T)
        edgemon.publish(throttle_at, throttle(True, 6))
        edgemon.publish(throttle_at, throttle(True, 8))
        assert gate.wait_until(lambda s: s.seq == 8, T)
        assert gate.stats.stale_ignored == 2


@pytest.mark.integration
def test_a_restarted_edgemon_is_heard_before_it_says_online(
    mosquitto_broker: Broker,
) -> None:
    """A restarted edgemon says `offline` (its new `started_ms`) until its fresh throttle
    objects are out, then `online`: the first object after that `offline` is taken whatever
    its `seq` (a clock stepped back across the restart), and holds once `online` comes."""
    broker = mosquitto_broker
    throttle_at = broker.topic("dev1", "throttle")
    with probe(broker.host, broker.port) as edgemon, broker.gate("dev1") as gate:
        edgemon.publish(status(broker, "e1"), {"state": "online", "started_ms": 1})
        edgemon.publish(throttle_at, throttle(False, 500))
        assert gate.wait_until(lambda s: s.seq == 500 and s.edgemon_online, T)
        edgemon.publish(status(broker, "e1"), {"state": "offline", "started_ms": 2})  # restarted
        edgemon.publish(throttle_at, throttle(True, 7))  # its fresh object, a lower seq
        assert gate.wait_until(lambda s: s.seq == 7, T)
        assert not gate.state.active  # not online yet
        edgemon.publish(status(broker, "e1"), {"state": "online", "started_ms": 2})
        assert gate.wait_until(active, T)
        assert gate.stats.stale_ignored == 0


@pytest.mark.integration
def test_fails_open_when_the_broker_goes_and_recovers(tmp_path: Path) -> None:
    """Broker stopped: the gate says False at once it notices (disconnected); broker back
    (with its retained objects): the gate reconnects, takes them afresh and holds again."""
    server = MosquittoServer(tmp_path, persistence=True)
    server.start()
    try:
        with probe(server.host, server.port) as edgemon:
            edgemon.publish(status(server.broker, "e1"), {"state": "online"})
            edgemon.publish(server.broker.topic("dev1", "throttle"), throttle(True, 1))
        with ThrottleGate(server.url, "dev1") as gate:
            assert gate.wait_until(active, T)
            assert gate.should_throttle_prefills()
            server.stop()
            assert gate.wait_until(lambda s: not s.connected, T)
            assert not gate.should_throttle_prefills()
            server.start()
            assert gate.wait_until(active, 30)
            assert gate.should_throttle_prefills()
            assert gate.stats.holds == 2
    finally:
        server.stop()


@pytest.mark.integration
def test_max_hold_releases_until_a_step_admits(mosquitto_broker: Broker) -> None:
    """A hold lasting `max_hold_ms` ends in a release, counted once: the gate answers False
    until the scheduler reports a step that admitted (`admitted()`), however many steps that
    takes; the next call begins a new hold. Held time counts on the injected clock, and a
    hold that the throttle ends counts up to when the gate saw the change."""
    broker = mosquitto_broker
    throttle_at = broker.topic("dev1", "throttle")
    clock = FakeClock()
    with (
        probe(broker.host, broker.port) as edgemon,
        broker.gate("dev1", max_hold_ms=2000, clock=clock) as gate,
    ):
        edgemon.publish(status(broker, "e1"), {"state": "online"})
        edgemon.publish(throttle_at, throttle(True, 1))
        assert gate.wait_until(active, T)
        answers = []
        for now in (100.0, 101.0, 101.999, 102.0, 102.0, 103.0):
            clock.now = now
            answers.append(gate.should_throttle_prefills())
        assert answers == [True, True, True, False, False, False]
        assert gate.releasing
        gate.admitted()  # a step admitted a waiting request
        assert not gate.releasing
        for now in (103.5, 103.75):
            clock.now = now
            answers.append(gate.should_throttle_prefills())
        assert answers[-2:] == [True, True]
        stats = gate.stats
        assert (stats.holds, stats.max_hold_releases, stats.held_s) == (2, 1, 2.25)
        clock.now = 105.0
        edgemon.publish(throttle_at, throttle(False, 2))
        assert gate.wait_until(inactive, T)
        clock.now = 200.0  # the scheduler asks again much later
        assert not gate.should_throttle_prefills()
        assert gate.stats.held_s == 3.5


def test_from_environ() -> None:
    """No device: None (the scheduler runs as vLLM's own). Every variable is read; a bad
    value raises ValueError naming its variable; the gate comes back unopened."""
    assert ThrottleGate.from_environ({}) is None
    assert ThrottleGate.from_environ({"EDGEMON_GATE_DEVICE": " "}) is None
    gate = ThrottleGate.from_environ(
        {
            "EDGEMON_GATE_DEVICE": "box-1",
            "EDGEMON_GATE_BROKER": "mqtts://user:pw@broker.local",
            "EDGEMON_GATE_MAX_HOLD_MS": "750",
            "EDGEMON_GATE_TOPIC_PREFIX": "site/a",
        }
    )
    assert gate is not None
    assert (gate.device, gate.max_hold_ms) == ("box-1", 750.0)
    assert not gate.state.connected
    assert not gate.should_throttle_prefills()
    default = ThrottleGate.from_environ({"EDGEMON_GATE_DEVICE": "box-1"})
    assert default is not None
    assert default.max_hold_ms == 2000.0
    for name, value in (
        ("DEVICE", "a/b"),
        ("BROKER", "http://x"),
        ("MAX_HOLD_MS", "soon"),
        ("MAX_HOLD_MS", "0"),
        ("MAX_HOLD_MS", "nan"),
        ("TOPIC_PREFIX", "a/#"),
    ):
        env = {"EDGEMON_GATE_DEVICE": "box-1", f"EDGEMON_GATE_{name}": value}
        with pytest.raises(ValueError, match=f"^EDGEMON_GATE_{name}: "):
            ThrottleGate.from_environ(env)


@pytest.mark.integration
def test_a_throttle_that_ends_between_calls_ends_the_hold(
    mosquitto_broker: Broker,
) -> None:
    """The throttle goes off and on again while the scheduler makes no call (an idle engine):
    the next call begins a new hold with a full `max_hold_ms`, and the old hold counts only
    up to when the gate saw the throttle go off."""
    broker = mosquitto_broker
    throttle_at = broker.topic("dev1", "throttle")
    clock = FakeClock()
    with (
        probe(broker.host, broker.port) as edgemon,
        broker.gate("dev1", max_hold_ms=2000, clock=clock) as gate,
    ):
        edgemon.publish(status(broker, "e1"), {"state": "online"})
        edgemon.publish(throttle_at, throttle(True, 1))
        assert gate.wait_until(active, T)
        assert gate.should_throttle_prefills()  # hold 1 from 100.0
        clock.now = 100.5
        edgemon.publish(throttle_at, throttle(False, 2))
        assert gate.wait_until(inactive, T)
        clock.now = 101.0
        edgemon.publish(throttle_at, throttle(True, 3))
        assert gate.wait_until(active, T)
        clock.now = 101.5
        assert gate.should_throttle_prefills()  # hold 2 from 101.5
        clock.now = 103.0
        assert gate.should_throttle_prefills()  # 1.5 s into hold 2: still held
        stats = gate.stats
        assert (stats.holds, stats.held_s, stats.max_hold_releases) == (2, 2.0, 0)


@pytest.mark.integration
def test_an_unreadable_object_while_holding_ends_the_hold(
    mosquitto_broker: Broker,
) -> None:
    """docs/client.md's fail-open promise: an unreadable throttle object (not JSON, or JSON
    without a boolean `throttle` and an integer `seq`) that arrives while the gate holds ends
    the hold, and so does an emptied retained object; each unreadable one is counted."""
    broker = mosquitto_broker
    throttle_at = broker.topic("dev1", "throttle")
    with probe(broker.host, broker.port) as edgemon, broker.gate("dev1") as gate:
        edgemon.publish(status(broker, "e1"), {"state": "online"})
        for seq, garbage in ((1, b"{not json"), (3, b'{"throttle": "yes", "seq": 4}'), (5, b"")):
            edgemon.publish(throttle_at, throttle(True, seq))
            assert gate.wait_until(active, T)
            assert gate.should_throttle_prefills()
            edgemon.publish(throttle_at, garbage)
            assert gate.wait_until(inactive, T)
            assert not gate.should_throttle_prefills()
            assert gate.state.holding == ()
        assert gate.stats.unreadable == 2


@pytest.mark.integration
def test_an_instance_silent_for_three_heartbeats_counts_offline(
    mosquitto_broker: Broker,
) -> None:
    """A retained `online` (heartbeat 0.2 s) and a retained `throttle: true` that nobody
    refreshes, as a lost will or a stopped edgemon leaves them: the gate holds, then stops
    holding once 3 heartbeats (0.6 s by its own receipt time) pass without a status, and shows
    the instance `silent`; a fresh `online` makes it hold again."""
    broker = mosquitto_broker
    throttle_at = broker.topic("dev1", "throttle")
    beat = {"state": "online", "heartbeat_s": 0.2, "started_ms": 1}
    with probe(broker.host, broker.port) as edgemon:
        edgemon.publish(throttle_at, throttle(True, 1))
        edgemon.publish(status(broker, "e1"), beat)
        with broker.gate("dev1") as gate:
            assert gate.wait_until(lambda s: s.connected and s.instances != {}, T)
            assert gate.wait_until(inactive, T)
            assert not gate.should_throttle_prefills()
            assert gate.state.instances == {"e1": "silent"}
            assert gate.state.throttle is True  # still known: only edgemon went quiet
            edgemon.publish(status(broker, "e1"), beat)
            assert gate.wait_until(active, T)
            assert gate.should_throttle_prefills()
            assert gate.wait_until(inactive, T)


@pytest.mark.integration
def test_one_hold_clock_for_several_devices(mosquitto_broker: Broker) -> None:
    """`device="a,b"`: a throttle on either holds; the hold is one, timed from its start
    whichever devices come and go, and `max_hold_ms` ends it once; `state` and `stats` show
    the devices followed and those holding. A device not followed changes nothing."""
    broker = mosquitto_broker
    clock = FakeClock()
    topic = broker.topic("{}", "throttle").format
    with (
        probe(broker.host, broker.port) as edgemon,
        broker.gate("b, a", max_hold_ms=2000, clock=clock) as gate,
    ):
        assert gate.following == ("a", "b")
        edgemon.publish(status(broker, "e1"), {"state": "online"})
        edgemon.publish(topic("c"), throttle(True, 1))  # not followed
        edgemon.publish(topic("a"), throttle(True, 1))
        assert gate.wait_until(active, T)
        assert gate.should_throttle_prefills()  # the hold begins at 100.0
        clock.now = 101.0
        edgemon.publish(topic("b"), throttle(True, 1))
        assert gate.wait_until(lambda s: s.holding == ("a", "b"), T)
        edgemon.publish(topic("a"), throttle(False, 2))
        assert gate.wait_until(lambda s: s.holding == ("b",), T)
        assert gate.should_throttle_prefills()
        assert gate.stats.holding == ("b",)
        assert gate.stats.following == ("a", "b")
        clock.now = 102.0
        assert not gate.should_throttle_prefills()  # 2 s since 100.0: one clock
        assert set(gate.state.devices) == {"a", "b"}
        stats = gate.stats
        assert (stats.holds, stats.max_hold_releases, stats.held_s) == (1, 1, 2.0)
        edgemon.publish(topic("b"), throttle(False, 2))
        assert gate.wait_until(lambda s: s.throttle is False, T)
        assert not gate.should_throttle_prefills()


@pytest.mark.integration
def test_an_error_inside_the_gate_answers_do_not_hold(
    mosquitto_broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """An exception inside `should_throttle_prefills` (here its clock fails, a fault no real
    part produces on demand) never reaches the scheduler: the answer is False, every error is
    counted, only the first is logged."""
    broker = mosquitto_broker
    throttle_at = broker.topic("dev1", "throttle")
    clock = FakeClock()
    with (
        probe(broker.host, broker.port) as edgemon,
        broker.gate("dev1", clock=clock) as gate,
    ):
        edgemon.publish(status(broker, "e1"), {"state": "online"})
        edgemon.publish(throttle_at, throttle(True, 1))
        assert gate.wait_until(active, T)
        clock.break_here()
        with caplog.at_level("ERROR", logger="edgemon.client"):
            answers = [gate.should_throttle_prefills() for _ in range(3)]
        clock.mend()
        assert answers == [False, False, False]
        assert gate.stats.errors == 3
        assert [r.getMessage() for r in caplog.records].count(
            "edgemon gate dev1: an error in should_throttle_prefills; answering 'do not hold' "
            "(further errors are counted in stats.errors, not logged)"
        ) == 1


def test_a_misspelt_variable_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    """`EDGEMON_GATE_BROKR` is no gate setting: `from_environ` warns, naming the variable and
    the one it probably meant; known variables are not warned about."""
    with caplog.at_level("WARNING", logger="edgemon.client"):
        gate = ThrottleGate.from_environ(
            {"EDGEMON_GATE_DEVICE": "box-1", "EDGEMON_GATE_BROKR": "mqtt://x"}
        )
    assert gate is not None
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1, messages
    assert "EDGEMON_GATE_BROKR is not a gate setting" in messages[0]
    assert "did you mean EDGEMON_GATE_BROKER?" in messages[0]


def test_devices_from_environ() -> None:
    """`EDGEMON_GATE_DEVICE` takes one id, a comma-separated list or `+`; a list holding `+`
    or a bad id is refused naming the variable."""
    for value, following in (("a", ("a",)), ("b,a, b", ("a", "b")), (" + ", ("+",))):
        gate = ThrottleGate.from_environ({"EDGEMON_GATE_DEVICE": value})
        assert gate is not None
        assert gate.following == following
    for value in ("a,+", "a,,b", "a/b,c"):
        with pytest.raises(ValueError, match=r"^EDGEMON_GATE_DEVICE: "):
            ThrottleGate.from_environ({"EDGEMON_GATE_DEVICE": value})


@pytest.mark.integration
def test_a_closed_gate_leaves_no_socket_open(mosquitto_broker: Broker) -> None:
    """After `close()`, every socket the gate opened is closed: the connection and the
    wake-up socket pair of paho's network thread, not left for the garbage collector (a vLLM
    engine may open and close gates as it reconfigures)."""
    broker = mosquitto_broker
    with left_open() as still_open:
        gate = broker.gate("dev1").open()
        assert gate.wait_until(lambda s: s.connected, T)
        gate.close(T)
        assert not still_open()  # none of the sockets it opened is still open


@pytest.mark.integration
def test_a_subscription_the_broker_refuses_is_said_and_shown(
    subscriptions_denied_broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """A broker whose ACL denies the gate's throttle topic answers its SUBSCRIBE with 0x80 for
    that filter: the gate logs one error naming the filter, shows it in `state.refused` (the
    status filter, granted, is not there) and counts it (`stats.subscriptions_refused`),
    and still fails open."""
    broker = subscriptions_denied_broker
    throttle_at = broker.topic("dev1", "throttle")
    with caplog.at_level(logging.ERROR, logger="edgemon.client"):
        with ThrottleGate(broker.url, "dev1") as gate:
            assert gate.wait_until(lambda s: s.refused != (), T)
            assert gate.state.refused == (throttle_at,)
            assert gate.stats.subscriptions_refused == 1
            assert not gate.should_throttle_prefills()
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert throttle_at in errors[0].getMessage()
    assert "refused" in errors[0].getMessage()
