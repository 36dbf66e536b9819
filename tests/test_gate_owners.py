"""A throttle object names the instance that owns its device (`owner`): a gate voids a
`throttle: true` whose owner is offline or silent for 3 heartbeats, while the throttles of the
instances still running are obeyed (docs/protocol.md, "Throttle object"). On a real Mosquitto:
a test's own publisher standing for edgemon, then two `edgemon run` processes partitioning the
devices (`[mqtt] devices`), one of them SIGKILLed."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import pytest

from mqtt_probe import probe
from processes import edgemon_process

if TYPE_CHECKING:
    from pathlib import Path

    from edgemon.client import GateState, Reporter

    from brokers import Broker

pytestmark = pytest.mark.integration

T = 30.0  # generous: a loaded machine
#: Long enough that no hold ends by `max_hold_ms` during a test.
NO_MAX_HOLD_MS = 3_600_000


def status(broker: Broker, instance: str) -> str:
    return broker.topic("_edgemon", instance, "status")


def throttle(device: str, seq: int, **extra: Any) -> dict[str, Any]:
    return {"device": device, "throttle": True, "t_ms": 1000.0 + seq, "seq": seq} | extra


def test_an_owner_silent_for_three_heartbeats_voids_its_throttles_only(
    mosquitto_broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """Two instances online: `e1` (heartbeat 0.2 s, never repeated) owns device a, `e2`
    (heartbeat 1 h) owns b; a third device c has an object without `owner` (an older edgemon).
    Once `e1` is silent for 3 heartbeats, a's `throttle: true` is void (`state.voided`) and
    holds nothing, while b's and then c's (any instance online: today's rule) still hold;
    a fresh `online` of `e1` makes a's count again. The silence is one warning naming `e1`."""
    broker = mosquitto_broker
    beat = {"state": "online", "heartbeat_s": 0.2, "started_ms": 1}
    with probe(broker.host, broker.port) as edgemon:
        edgemon.publish(
            status(broker, "e2"), {"state": "online", "heartbeat_s": 3600, "started_ms": 2}
        )
        edgemon.publish(broker.topic("a", "throttle"), throttle("a", 1, owner="e1"))
        gate = broker.gate("a,b,c", max_hold_ms=NO_MAX_HOLD_MS)
        with gate, caplog.at_level(logging.WARNING, logger="edgemon.client"):
            edgemon.publish(status(broker, "e1"), beat)
            silent = {"e1": "silent", "e2": "online"}
            assert gate.wait_until(
                lambda s: s.holding == s.voided == ("a",) and s.instances == silent, T
            )
            said = [r.getMessage() for r in caplog.records if "void" in r.getMessage()]
            assert len(said) == 1
            assert "instance e1" in said[0]
            assert gate.state.edgemon_online  # e2 is: the global rule alone would hold
            assert not gate.state.active
            assert not gate.should_throttle_prefills()

            edgemon.publish(broker.topic("b", "throttle"), throttle("b", 1, owner="e2"))
            assert gate.wait_until(lambda s: s.active, T)
            assert gate.state.voided == ("a",)
            assert gate.should_throttle_prefills()
            edgemon.publish(broker.topic("b", "throttle"), throttle("b", 2, owner="e2") | {
                "throttle": False
            })  # fmt: skip
            assert gate.wait_until(lambda s: not s.active, T)
            assert not gate.should_throttle_prefills()

            edgemon.publish(broker.topic("c", "throttle"), throttle("c", 1))  # no owner
            assert gate.wait_until(lambda s: s.active, T)
            assert gate.state.holding == ("a", "c")
            assert gate.should_throttle_prefills()
            edgemon.publish(broker.topic("c", "throttle"), b"")
            assert gate.wait_until(lambda s: not s.active, T)

            edgemon.publish(status(broker, "e1"), beat | {"heartbeat_s": 3600})  # e1 back, for good
            assert gate.wait_until(lambda s: s.active and s.voided == (), T)
            assert gate.should_throttle_prefills()


def run_dry(reporter: Reporter, stream: str) -> None:
    """A stream with 50 ms of audio and no next chunk coming: below the 80 ms margin at once."""
    reporter.start(stream)
    reporter.chunk(stream, audio_ms=50, eta_ms=0)


def holding_both(state: GateState) -> bool:
    return state.active and state.holding == ("a", "b") and state.voided == ()


def test_a_killed_partition_holds_no_engine_while_the_other_is_obeyed(
    mosquitto_broker: Broker, tmp_path: Path
) -> None:
    """Two `edgemon run` processes split the devices (`[mqtt] devices` ["a"] and ["b"],
    heartbeat 0.5 s); one gate follows both devices. Both throttle; the owner of a is killed
    (SIGKILL: its retained `throttle: true` stays on the broker). The gate voids a's throttle
    within the 3-heartbeat bound (the broker's will says `offline` at once), keeps obeying b's
    (it still holds), and stops holding once b releases: before owners, the other instance's
    `online` kept a's stale throttle holding the engine for ever."""
    broker = mosquitto_broker
    first_id, second_id = broker.client_id("edgemon-a"), broker.client_id("edgemon-b")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with (
        edgemon_process(
            broker,
            tmp_path / "a",
            client_id="edgemon-a",
            config='heartbeat_s = 0.5\ndevices = ["a"]',
        ) as first,
        edgemon_process(
            broker,
            tmp_path / "b",
            client_id="edgemon-b",
            config='heartbeat_s = 0.5\ndevices = ["b"]',
        ),
        broker.reporter("a", "a-reporter") as a,
        broker.reporter("b", "b-reporter") as b,
        broker.gate("a,b", max_hold_ms=NO_MAX_HOLD_MS) as gate,
    ):
        assert gate.wait_until(lambda s: s.connected and len(s.instances) == 2, T)
        run_dry(a, "sa")
        run_dry(b, "sb")
        assert gate.wait_until(holding_both, T)
        assert {d: t.owner for d, t in gate.state.devices.items()} == {
            "a": first_id,
            "b": second_id,
        }
        assert gate.should_throttle_prefills()

        first.process.kill()
        first.process.wait()
        assert gate.wait_until(lambda s: s.voided == ("a",), T)
        state = gate.state
        assert state.instances[first_id] == "offline"  # its will: at once, within the bound
        assert state.holding == ("a", "b")  # a's stale object is still there, void
        assert state.instances[second_id] == "online"
        assert state.active
        assert gate.should_throttle_prefills()  # b's throttle is obeyed

        b.end("sb")
        assert gate.wait_until(lambda s: s.holding == ("a",), T)
        assert not gate.state.active
        assert not gate.should_throttle_prefills()
