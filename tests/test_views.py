"""The engine's read-only views (`edgemon.engine.views`): the incrementally kept per-device
aggregates equal a brute-force reading of every stream, whatever happened in between.

Random traffic (starts, chunks, finals, ends, engine objects with margins, rebuffer players,
timers, restarts from a snapshot) on a few devices, read at random instants; all times are
whole milliseconds, so the comparisons are exact.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pytest

from edgemon.engine import EngineConfig
from edgemon.engine.config import Limits
from edgemon.engine.stream import Phase
from edgemon.engine.views import DeviceView, device_views
from edgemon.monitor import Monitor

if TYPE_CHECKING:
    from edgemon.engine.outputs import Output

K = 3


def brute(view: DeviceView, now: float) -> tuple[int, float | None, float | None, list[Any]]:
    """At-risk count, minima and the K lowest, from every live stream (the naive way)."""
    live = [s for s in view.streams() if s.phase is Phase.LIVE]
    ranked = sorted((s.headroom_at(now), s.id, s.slack_at(now)) for s in live)
    return (
        sum(1 for s in live if s.headroom_at(now) < s.margin),
        ranked[0][0] if ranked else None,
        min((s.slack_at(now) for s in live), default=None),
        [(sid, slack, head) for head, sid, slack in ranked[:K]],
    )


def check(monitor: Monitor, wall: float) -> int:
    """Compare every device's summary with the brute-force reading; how many live streams."""
    live = 0
    for view in device_views(monitor.engine):
        now = view.now(wall)
        summary = view.summary(now, K)
        at_risk, min_headroom, min_slack, lowest = brute(view, now)
        assert summary.at_risk == at_risk
        assert summary.min_headroom == min_headroom
        assert summary.min_slack == min_slack
        assert list(summary.lowest) == lowest
        live += sum(1 for s in view.streams() if s.phase is Phase.LIVE)
    return live


class Traffic:
    """Random valid messages for a few devices and streams."""

    def __init__(self, rng: random.Random, monitor: Monitor) -> None:
        self.rng = rng
        self.monitor = monitor
        self.seq: dict[tuple[str, str], int] = {}
        self.out: list[Output] = []

    def send(self, wall: float) -> None:
        rng = self.rng
        device = f"d{rng.randrange(3)}"
        stream = f"s{rng.randrange(12)}"
        key = (device, stream)
        t = wall  # device clocks = wall clock
        roll = rng.random()
        if roll < 0.1:
            body: Any = {"type": "start", "stream": stream, "t_ms": t}
            if rng.random() < 0.5:
                body["player"] = "rebuffer"
            if rng.random() < 0.3:
                body["margin_ms"] = float(rng.randrange(0, 300))
            self.seq.pop(key, None)
        elif roll < 0.17:
            body = {"type": "end", "stream": stream, "t_ms": t, "reason": "completed"}
            self.seq.pop(key, None)
        elif roll < 0.2:
            margin = float(rng.randrange(0, 300))
            payload = json.dumps({"margin_ms": margin}).encode()
            self.monitor.receive(f"edgemon/v1/{device}/engine", payload, wall, self.out)
            return
        else:
            seq = self.seq.get(key, -1) + 1
            self.seq[key] = seq
            body = {
                "type": "chunk", "stream": stream, "t_ms": t, "seq": seq,
                "audio_ms": float(rng.randrange(0, 600)),
                "eta_ms": float(rng.randrange(0, 800)),
            }  # fmt: skip
            if rng.random() < 0.05:
                body["final"] = True
                self.seq.pop(key, None)
        payload = json.dumps(body).encode()
        self.monitor.handle(f"edgemon/v1/{device}/events", payload, wall, self.out)


@pytest.mark.parametrize("seed", range(12))
def test_summaries_equal_a_full_reading_of_every_stream(seed: int) -> None:
    """After any mix of events and timers, read at the last event or later between events
    (the scrape's case), the at-risk count, minima and lowest streams are the brute force's."""
    rng = random.Random(seed)
    monitor = Monitor(EngineConfig())
    traffic = Traffic(rng, monitor)
    wall = 1_000_000.0
    seen_live = 0
    for _ in range(400):
        wall += rng.randrange(0, 120)
        traffic.send(wall)
        if rng.random() < 0.3:
            seen_live = max(seen_live, check(monitor, wall + rng.randrange(0, 400)))
        if rng.random() < 0.02:  # a restart from a snapshot
            data = json.loads(json.dumps(monitor.snapshot(wall)))
            monitor = Monitor(EngineConfig())
            monitor.restore(data, wall)
            traffic.monitor = monitor
    assert seen_live >= 5  # the traffic did build live fleets


def test_unread_changes_are_bounded_and_a_later_read_is_still_exact() -> None:
    """With nobody reading, a device's noted changes never exceed the cap (memory stays
    bounded, however many streams come and go); the next read is still exact, though the
    streams read live the last time all ended meanwhile."""
    config = replace(EngineConfig(), limits=Limits(max_streams_per_device=4))
    cap = 2 * 4 + 64
    monitor = Monitor(config)
    out: list[Output] = []
    wall = 1_000_000.0

    def send(body: dict[str, Any]) -> None:
        monitor.handle("edgemon/v1/d/events", json.dumps(body).encode(), wall, out)

    for i in range(4):
        audio = 50.0 * (i + 1)
        send({"type": "chunk", "stream": f"a{i}", "t_ms": wall, "seq": 0, "audio_ms": audio})
    assert check(monitor, wall) == 4
    for i in range(4):
        send({"type": "end", "stream": f"a{i}", "t_ms": wall, "reason": "cancelled"})
    for i in range(3 * cap):
        wall += 5
        chunk = {"type": "chunk", "stream": f"b{i}", "t_ms": wall, "seq": 0, "audio_ms": 400.0}
        send(chunk)
        if i < 3 * cap - 2:  # the last two stay live
            send({"type": "end", "stream": f"b{i}", "t_ms": wall, "reason": "completed"})
        index = next(monitor.engine.devices()).live_index
        assert len(index.changed) <= cap
    assert check(monitor, wall + 10) == 2
