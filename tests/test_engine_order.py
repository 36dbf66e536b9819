"""Timers of different devices fire in wall-time order, however far one `advance` jumps.

The engine keeps one queue entry per device, at the wall time of the device's earliest
timer. A message at that very instant can move the timer later (a chunk refills the
buffer); the entry, now early, must not let the device fire its later timer ahead of another
device's earlier one. Hypothesis found this through the restart property
(`test_snapshot.py`): a restored engine has no such early entries, so its lines came in
another order than the uninterrupted run's.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from edgemon.engine.config import EngineConfig, SlackPolicy
from edgemon.monitor import Monitor

from monitor_runs import drive, drive_stepping, per_stream
from properties import examples
from strategies import FOUND_RESTART_TRACE, late_scenarios, scenarios

if TYPE_CHECKING:
    from strategies import LateScenario, Scenario

TRUST = EngineConfig(
    slack=SlackPolicy(
        clock="trust", default_margin_ms=100, hysteresis_ms=0, min_on_ms=0, allowed_lateness_ms=0
    )
)


def chunk(stream: str, seq: int, audio_ms: float, **fields: Any) -> dict[str, Any]:
    """A chunk event at device time 0."""
    return {"type": "chunk", "stream": stream, "t_ms": 0, "seq": seq, "audio_ms": audio_ms}


def message(recv: float, device: str, *events: dict[str, Any]) -> tuple[float, str, bytes]:
    """One message of `events` (a batch if more than one) received at `recv`."""
    body: object = list(events) if len(events) > 1 else events[0]
    return (recv, f"edgemon/v1/{device}/events", json.dumps(body).encode())


def test_a_timer_moved_later_at_its_instant_waits_for_the_other_devices() -> None:
    """Device a's stream would run dry at 100, then a second message at the same instant
    refills it until 300 (at risk from 200 on); device b's runs dry at 150. Advanced to
    1,000 in one jump, b's underrun (150) comes before a's throttle (200) and underrun (300),
    as when the clock visits every deadline."""
    messages = [
        message(0, "a", chunk("s", 0, 100)),
        message(0, "b", chunk("s", 0, 150)),
        message(0, "a", chunk("s", 1, 200)),
        message(1_000, "c", chunk("s", 0, 5_000)),
    ]
    jumped = drive(Monitor(TRUST), messages)
    timed = [(line["kind"], line["device"], line["t_ms"]) for line in jumped[3:]]
    assert timed == [("underrun", "b", 150.0), ("throttle", "a", 200.0), ("underrun", "a", 300.0)]
    assert jumped == drive_stepping(Monitor(TRUST), messages)


def assert_same_order(jumped: list[dict[str, Any]], stepped: list[dict[str, Any]]) -> None:
    """The same lines at the same sequence of instants, in the same order per stream (only
    lines of different streams at one instant may be swapped)."""
    assert [line.get("t_ms") for line in jumped] == [line.get("t_ms") for line in stepped]
    assert per_stream(jumped) == per_stream(stepped)
    assert sorted(map(json.dumps, jumped)) == sorted(map(json.dumps, stepped))


@pytest.mark.slow  # a property: many generated examples
@settings(max_examples=examples(150))
@given(sc=scenarios())
@example(sc=FOUND_RESTART_TRACE)
def test_jumping_over_deadlines_gives_the_lines_of_visiting_each(sc: Scenario) -> None:
    """Any trace (duplicates, a repeated seq 0 in one batch, re-sent first chunks with
    `play_start_ms`, gaps, finals, both players, both clocks): advancing only to each
    message's receipt gives the lines of advancing to every `next_deadline()` in between."""
    messages = [(r.recv_ms, r.topic, r.payload) for r in sc.records()]
    assert_same_order(
        drive(Monitor(sc.config), messages), drive_stepping(Monitor(sc.config), messages)
    )


@pytest.mark.slow  # a property: many generated examples
@settings(max_examples=examples(100))
@given(sc=late_scenarios(), lateness=st.sampled_from((0, 1, 50)))
def test_late_delivery_jumping_gives_the_lines_of_visiting_each(
    sc: LateScenario, lateness: int
) -> None:
    """Late delivery (docs/semantics.md), with allowed lateness 0 among others: jumping and visiting
    every deadline agree here too."""
    config = replace(sc.config, slack=replace(sc.config.slack, allowed_lateness_ms=lateness))
    messages = [
        (
            float(m.recv_ms),
            f"{config.topic_prefix}/{m.device}/events",
            json.dumps(m.events[0]).encode(),
        )
        for m in sc.messages
    ]
    assert_same_order(drive(Monitor(config), messages), drive_stepping(Monitor(config), messages))
