"""One gate for several devices, and a gate that outlives a stopped edgemon, on real parts:
Reporters feeding `edgemon run` (a process) on Mosquitto, a ThrottleGate following what that
edgemon publishes (README "Topologies")."""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING

import pytest

from processes import edgemon_process

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from edgemon.client import GateState, Reporter

    from brokers import Broker

pytestmark = pytest.mark.integration

T = 30.0  # generous: a loaded machine


def holding(*devices: str) -> Callable[[GateState], bool]:
    """A `wait_until` predicate: connected, edgemon online, and exactly `devices` throttled."""

    def check(state: GateState) -> bool:
        return state.connected and state.edgemon_online and state.holding == devices

    return check


def run_dry(reporter: Reporter, stream: str) -> None:
    """A stream with 50 ms of audio and no next chunk coming: below the 80 ms margin at once."""
    reporter.start(stream)
    reporter.chunk(stream, audio_ms=50, eta_ms=0)


def test_two_devices_either_holds_and_both_must_release(
    mosquitto_broker: Broker, tmp_path: Path
) -> None:
    """A gate following `hall,kitchen` (one engine, two players): a throttle on either device
    holds the engine; with both throttled, releasing one keeps it held; it is released only
    once both are."""
    broker = mosquitto_broker
    with (
        edgemon_process(broker, tmp_path),
        broker.reporter("hall", "hall-reporter") as hall,
        broker.reporter("kitchen", "kitchen-reporter") as kitchen,
        broker.gate("hall,kitchen") as gate,
    ):
        assert gate.wait_until(lambda s: s.connected and s.edgemon_online, T)
        for round_, (first, second) in enumerate(((hall, kitchen), (kitchen, hall))):
            a, b = f"a{round_}", f"b{round_}"
            run_dry(first, a)
            assert gate.wait_until(holding(first.device), T)
            assert gate.should_throttle_prefills()
            run_dry(second, b)
            assert gate.wait_until(holding("hall", "kitchen"), T)
            first.end(a)
            assert gate.wait_until(holding(second.device), T)
            assert gate.should_throttle_prefills()  # the other device still holds
            second.end(b)
            assert gate.wait_until(lambda s: s.throttle is False, T)
            assert not gate.should_throttle_prefills()
        stats = gate.stats
    assert stats.holds == 2
    assert stats.following == ("hall", "kitchen")


def test_all_devices_follows_a_device_that_appears_later(
    mosquitto_broker: Broker, tmp_path: Path
) -> None:
    """A gate following `+` before any device exists: a device that first reports afterwards
    is followed, its throttle holds the engine, and its end releases it."""
    broker = mosquitto_broker
    with (
        edgemon_process(broker, tmp_path),
        broker.gate("+") as gate,
    ):
        assert gate.wait_until(lambda s: s.connected and s.edgemon_online, T)
        assert gate.state.devices == {}
        with broker.reporter("newcomer", "newcomer-reporter") as reporter:
            run_dry(reporter, "s")
            assert gate.wait_until(holding("newcomer"), T)
            assert gate.should_throttle_prefills()
            assert gate.state.following == ("+",)
            reporter.end("s")
            assert gate.wait_until(lambda s: s.throttle is False, T)
            assert not gate.should_throttle_prefills()


def test_a_stopped_edgemon_holds_no_engine_for_long(
    mosquitto_broker: Broker, tmp_path: Path
) -> None:
    """edgemon (heartbeat 0.5 s) throttles a device, then is stopped (SIGSTOP, as a VM pause
    would): the gate stops holding once 3 heartbeats pass unheard, long before the broker's
    keepalive would announce edgemon's will (45 s); continued (SIGCONT), its next heartbeat
    makes the gate hold again, and the stream's end releases it."""
    broker = mosquitto_broker
    with (
        edgemon_process(broker, tmp_path, config="heartbeat_s = 0.5") as edgemon,
        broker.reporter("paused", "paused-reporter") as reporter,
        broker.gate("paused") as gate,
    ):
        assert gate.wait_until(lambda s: s.connected and s.edgemon_online, T)
        run_dry(reporter, "s")
        assert gate.wait_until(holding("paused"), T)
        assert gate.should_throttle_prefills()
        os.kill(edgemon.process.pid, signal.SIGSTOP)
        try:
            assert gate.wait_until(lambda s: not s.edgemon_online, T)
            assert not gate.should_throttle_prefills()
            assert set(gate.state.instances.values()) == {"silent"}
            assert gate.state.holding == ("paused",)  # the object is kept: edgemon is not
        finally:
            os.kill(edgemon.process.pid, signal.SIGCONT)
        assert gate.wait_until(holding("paused"), T)
        assert gate.should_throttle_prefills()
        reporter.end("s")
        assert gate.wait_until(lambda s: s.throttle is False, T)
        assert not gate.should_throttle_prefills()
