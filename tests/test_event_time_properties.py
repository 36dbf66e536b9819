"""Late delivery against the reference on the devices' own times (docs/semantics.md).

Each trace is delivered late (``strategies.late_scenarios``): random delays, reordering within a
stream, and optionally a broker outage whose backlog arrives in a burst. Once every message is
in, the record — underrun lines, per-stream underrun counts and durations, stream summaries —
must equal the naive reference (``tests/reference.py``) run on the same events delivered the
instant they happened (``recv_ms = t_ms``). Live decisions (the throttle) are only checked to
be well formed: they use what edgemon knew at each instant, which differs by design.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, given, settings

from edgemon.engine.outputs import (
    DeviceForgotten,
    UnderrunBegan,
    UnderrunConfirmed,
    UnderrunRetracted,
)
from edgemon.monitor import Monitor
from edgemon.replay import to_line

from properties import examples
from reference import Reference
from strategies import LateScenario, late_scenarios

if TYPE_CHECKING:
    from edgemon.engine.outputs import Output

PROPERTY = settings(
    max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def drive(sc: LateScenario) -> list[Output]:
    """The trace through a monitor as the daemon drives it (replay's order at equal times),
    telling the engine when its input was lost and restored during the outage."""
    monitor = Monitor(sc.config)
    out: list[Output] = []
    lost = restored = False
    prefix = sc.config.topic_prefix
    for message in sc.messages:
        now = float(message.recv_ms)
        if sc.outage is not None and not lost and now >= sc.outage[0]:
            monitor.advance(sc.outage[0], out)
            monitor.engine.input_lost()
            lost = True
        if sc.outage is not None and lost and not restored and now >= sc.outage[1]:
            monitor.advance(sc.outage[1], out, inclusive=False)
            monitor.engine.input_restored(sc.outage[1])
            restored = True
        monitor.advance(now, out, inclusive=False)
        payload = json.dumps(message.events[0]).encode()
        monitor.receive(f"{prefix}/{message.device}/events", payload, now, out)
    if lost and not restored:
        assert sc.outage is not None
        monitor.advance(sc.outage[1], out, inclusive=False)
        monitor.engine.input_restored(sc.outage[1])
    while (deadline := monitor.next_deadline()) is not None:
        monitor.advance(deadline, out)
    return out


def reference(sc: LateScenario) -> Reference:
    """The reference on the devices' own times: every event delivered when it happened."""
    slack = replace(sc.config.slack, clock="trust", allowed_lateness_ms=0)
    return Reference(sc.on_event_time, replace(sc.config, slack=slack))


def record_mismatches(sc: LateScenario) -> list[str]:
    """What differs between the engine's record and the reference's."""
    out = drive(sc)
    ref = reference(sc)
    lines = [line for o in out if (line := to_line(o)) is not None]
    problems: list[str] = []
    got = Counter((x["device"], x["stream"], x["t_ms"]) for x in lines if x["kind"] == "underrun")
    want = Counter((u.device, u.stream, u.begin) for u in ref.underruns())
    if got != want:
        problems.append(f"underrun lines: engine {sorted(got)}, reference {sorted(want)}")
    ends = {(x["device"], x["stream"]): x for x in lines if x["kind"] == "stream_end"}
    expected = ref.stream_ends()
    if sorted(ends) != sorted(expected):
        problems.append(f"streams: engine {sorted(ends)}, reference {sorted(expected)}")
    for key in sorted(ends.keys() & expected.keys()):
        names = ["chunks", "audio_ms", "underruns", "underrun_ms", "min_slack_ms"]
        if not expected[key]["open_at_removal"]:
            # An underrun open at removal lasts until then: on edgemon's clock here, on the
            # device's in the reference; the gaps ended by chunks are the device's own.
            names.append("longest_gap_ms")
            if ends[key]["reason"] == expected[key]["reason"]:
                names.append("outcome")
        for name in names:
            if name == "underrun_ms" and expected[key][name] is None:
                continue  # an underrun still open at removal: no duration defined
            if ends[key][name] != expected[key][name]:
                problems.append(
                    f"{key} {name}: engine {ends[key][name]}, ref {expected[key][name]}"
                )
    confirmed = sum(
        o.stats.underruns for o in out if isinstance(o, DeviceForgotten)
    )  # every device is forgotten once the clock has run out
    if confirmed != len(ref.underruns()):
        problems.append(f"underruns counted {confirmed}, reference {len(ref.underruns())}")
    return problems


def announcement_mismatches(out: list[Output]) -> list[str]:
    """Every underrun announced live is, in the end, confirmed or retracted exactly once;
    one never announced is never retracted."""
    fate: dict[tuple[str, str, float], list[str]] = defaultdict(list)
    announced = set()
    for o in out:
        if isinstance(o, UnderrunBegan):
            announced.add((o.device, o.stream, o.t_ms))
        elif isinstance(o, UnderrunConfirmed) and o.published:
            fate[o.device, o.stream, o.t_ms].append("confirmed")
        elif isinstance(o, UnderrunRetracted):
            fate[o.device, o.stream, o.t_ms].append("retracted")
    problems = [f"{key} announced but {fate.get(key)}" for key in announced if len(fate[key]) != 1]
    problems += [f"{key} settled but never announced" for key in fate.keys() - announced]
    return problems


def throttle_mismatches(lines: list[dict[str, Any]], sc: LateScenario) -> list[str]:
    """Live throttle lines per device alternate ON/OFF, start ON, end OFF, and each ON lasts
    at least min_on_ms (what edgemon decides with what it knows; not compared to the record)."""
    problems: list[str] = []
    by_device: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in lines:
        if line["kind"] == "throttle":
            by_device[line["device"]].append(line)
    for device, mine in by_device.items():
        states = [line["active"] for line in mine]
        if states != [i % 2 == 0 for i in range(len(states))] or states[-1]:
            problems.append(f"{device}: throttle states {states}")
        for on, off in zip(mine[::2], mine[1::2], strict=False):
            if off["t_ms"] - on["t_ms"] < sc.config.slack.min_on_ms:
                problems.append(f"{device}: ON at {on['t_ms']} for less than min_on")
    return problems


@pytest.mark.slow  # a property: many generated examples
@PROPERTY
@given(late_scenarios())
def test_late_delivery_leaves_the_record_of_the_devices_own_times(sc: LateScenario) -> None:
    """Random delays and reordering within a stream: underrun lines (instants), per-stream
    underrun counts and durations, chunks, audio and minimum slack, and the underruns counted
    equal the reference on t_ms; announcements are each settled once; the throttle is sane."""
    assert record_mismatches(sc) == []
    out = drive(sc)
    assert announcement_mismatches(out) == []
    lines = [line for o in out if (line := to_line(o)) is not None]
    assert throttle_mismatches(lines, sc) == []


@pytest.mark.slow  # a property: many generated examples
@PROPERTY
@given(late_scenarios(outage=True))
def test_an_outage_burst_leaves_the_record_of_the_devices_own_times(sc: LateScenario) -> None:
    """The same with a broker outage longer than allowed_lateness_ms whose backlog arrives in
    a burst: nothing that the late chunks disprove is counted."""
    assert record_mismatches(sc) == []
    assert announcement_mismatches(drive(sc)) == []
