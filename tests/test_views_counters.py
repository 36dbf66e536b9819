"""The views' time counters (`DeviceView.throttle_ms`, `DeviceView.underrun_ms`) never go
down, whatever arrives and whenever they are read.

They back `edgemon_throttle_seconds_total` and `edgemon_underrun_seconds_total`, and a counter
that goes down reads as a reset. Both include an ongoing period, which the engine may settle
later than a scrape comes: the throttle turns off at a timer the daemon has not run yet, a
late chunk ends an underrun at an earlier `t_ms`. Random traces (jitter, reordering, gaps,
duplicates, chunks later than the allowed lateness, broker outages) are fed message by message
with the clock left behind at random (timers not run yet), and read between every step.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgemon.engine.config import EngineConfig, SlackPolicy
from edgemon.engine.views import device_views
from edgemon.monitor import Monitor

from properties import examples
from strategies import LateScenario, Scenario, late_scenarios, scenarios

if TYPE_CHECKING:
    from edgemon.engine.outputs import Output
    from edgemon.engine.stats import DeviceStats

    from strategies import Message

PROPERTY = settings(
    max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


class Reader:
    """Reads every device's counters and checks each against its previous reading."""

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor
        #: Per device id: its stats object (a forgotten device comes back fresh) and readings.
        self.last: dict[str, tuple[DeviceStats, float, float]] = {}
        self.reads = 0

    def read(self) -> None:
        """One scrape: no counter of a device still tracked is below its last reading."""
        for view in device_views(self.monitor.engine):
            throttle, underrun = view.throttle_ms(), view.underrun_ms()
            seen = self.last.get(view.id)
            if seen is not None and seen[0] is view.stats:
                assert throttle >= seen[1], (view.id, "throttle", seen[1], throttle)
                assert underrun >= seen[2], (view.id, "underrun", seen[2], underrun)
            self.last[view.id] = (view.stats, throttle, underrun)
            self.reads += 1


def feed(
    monitor: Monitor,
    messages: tuple[Message, ...],
    lags: list[int],
    outage: tuple[int, int] | None = None,
) -> Reader:
    """Every message through `Monitor.handle`, the clock first brought only part of the way
    to it (`lags`: ms short of the message; timers due meanwhile wait), read in between;
    then the clock run on until nothing is pending, read after every step."""
    reader = Reader(monitor)
    out: list[Output] = []
    prefix = monitor.engine.config.topic_prefix
    lost = restored = False
    for i, message in enumerate(messages):
        lag = lags[i % len(lags)]
        now = float(message.recv_ms)
        if outage is not None and not lost and now >= outage[0]:
            monitor.advance(outage[0], out)
            monitor.engine.input_lost()
            lost = True
            reader.read()
        if outage is not None and lost and not restored and now >= outage[1]:
            monitor.advance(outage[1], out, inclusive=False)
            monitor.engine.input_restored(outage[1])
            restored = True
            reader.read()
        monitor.advance(now - lag, out)  # a scrape while the daemon is behind its timers
        reader.read()
        body = list(message.events) if message.batch else message.events[0]
        monitor.handle(f"{prefix}/{message.device}/events", json.dumps(body).encode(), now, out)
        reader.read()
        out.clear()
    while (deadline := monitor.next_deadline()) is not None:
        monitor.advance(deadline, out)
        reader.read()
        out.clear()
    return reader


@pytest.mark.slow  # a property: many generated examples
@PROPERTY
@given(
    scenarios(),
    st.sampled_from((0, 30, 1_000)),
    st.lists(st.integers(0, 400), min_size=1, max_size=40),
)
def test_counters_never_decrease_with_jitter_gaps_and_chunks_beyond_the_lateness(
    sc: Scenario, lateness: int, lags: list[int]
) -> None:
    """Traces with delivery jitter up to 100 ms (a later message may carry a smaller `t_ms`),
    gaps, duplicates and finals, with an allowed lateness often shorter than the jitter (so
    chunks arrive beyond it), read between every step: no counter ever goes down, and each
    ends at the device's record."""
    slack = replace(sc.config.slack, allowed_lateness_ms=lateness)
    config = replace(sc.config, slack=slack)
    monitor = Monitor(config)
    reader = feed(monitor, sc.messages, lags)
    assert reader.reads > 0
    assert ends_at_the_record(reader, monitor)


@pytest.mark.slow  # a property: many generated examples
@PROPERTY
@given(
    late_scenarios(outage=True) | late_scenarios(),
    st.lists(st.integers(0, 1_500), min_size=1, max_size=40),
)
def test_counters_never_decrease_under_late_delivery_and_outages(
    sc: LateScenario, lags: list[int]
) -> None:
    """Late delivery (delays up to 500 ms, reordering within a stream) and broker outages
    whose backlog arrives in a burst, read between every step: no counter ever goes down, and
    each ends at the device's record."""
    monitor = Monitor(sc.config)
    reader = feed(monitor, sc.messages, lags, sc.outage)
    assert reader.reads > 0
    assert ends_at_the_record(reader, monitor)


def ends_at_the_record(reader: Reader, monitor: Monitor) -> bool:
    """Once everything has played out (no stream, no throttle left), each device's last
    reading is its record: the time counted throttled and in confirmed underrun."""
    for view in device_views(monitor.engine):
        _, throttle, underrun = reader.last[view.id]
        assert not view.throttle_on
        assert (throttle, underrun) == (view.stats.throttle_ms, view.stats.underrun_ms)
    return True


def test_a_restart_from_a_snapshot_keeps_the_counters() -> None:
    """The lateness horizon is in the snapshot: after a restart the settled part of an ongoing
    underrun is still counted (it would drop to 0 and read as a reset otherwise)."""
    monitor = Monitor(EngineConfig(slack=SlackPolicy(clock="trust")))  # lateness 1000 ms
    out: list[Output] = []
    topic = "edgemon/v1/d/events"
    chunk = {"type": "chunk", "stream": "s", "t_ms": 0, "seq": 0, "audio_ms": 200}
    monitor.handle(topic, json.dumps(chunk).encode(), 0, out)  # runs dry at 200
    other = {"type": "start", "stream": "o", "t_ms": 1_500}
    monitor.handle(topic, json.dumps(other).encode(), 1_500, out)  # horizon 500
    (view,) = device_views(monitor.engine)
    assert view.underrun_ms() == 300
    restored = Monitor(monitor.engine.config)
    restored.restore(monitor.snapshot(1_500), 1_500)
    (view,) = device_views(restored.engine)
    assert view.underrun_ms() == 300
