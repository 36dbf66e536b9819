"""Rebuilding a device from a snapshot, on its own: the lifecycle adopts each stream, late
delivery arms its waits afresh, the timers are recomputed, and a throttle that was on keeps
the rest of its minimum on-time."""

from __future__ import annotations

import json

from edgemon.engine.config import EngineConfig
from edgemon.engine.engine import Engine
from edgemon.engine.events import ChunkEvent
from edgemon.engine.outputs import Output, ThrottleChanged
from edgemon.engine.reorder_buffer import Held
from edgemon.engine.snapshot import restore_devices, take
from edgemon.engine.stream import Phase, Stream
from edgemon.engine.timers import MIN_ON, ConfirmDeadline, HoldEnd

from engine_parts import Parts, a_stream


def test_adopted_streams_are_counted_and_their_waits_armed_afresh() -> None:
    """A live stream takes the margin its start asked for and counts as live; a provisional
    underrun and held chunks wait again an allowed lateness after their instants; a
    confirmed underrun is ongoing again. `restore_timers` then arms each stream's timer and
    leaves the throttle to be decided."""
    parts = Parts()
    live = a_stream("live")
    live.phase, live.start, live.buffered, live.expected = Phase.LIVE, 0.0, 2_000.0, 900.0
    live.margin_from_start = 40.0
    provisional = a_stream("p")
    provisional.underrun_since, provisional.underrun_provisional = 500.0, True
    confirmed = a_stream("c")
    confirmed.underrun_since = 300.0
    held = a_stream("h")
    held.held = Held()
    held.held.add(ChunkEvent(stream="h", t_ms=600.0, seq=2, audio_ms=100.0), 600.0)
    for stream in (live, provisional, confirmed, held):
        parts.lifecycle.adopt(stream)
    assert (live.margin, parts.lifecycle.live) == (40.0, 1)
    assert parts.lateness.provisional == {"p": provisional}
    assert parts.lateness.open_underruns == {"c": confirmed}
    waits = [(at, type(what)) for at, what in parts.due()]
    assert waits == [(1_500.0, ConfirmDeadline), (1_600.0, HoldEnd)]
    parts.throttle.dirty = False
    parts.lifecycle.restore_timers(700.0)
    armed = {what.id: at for at, what in parts.due() if isinstance(what, Stream)}
    assert armed == {
        "live": 2_000.0 - 40.0 - 20.0,  # its headroom enters margin + hysteresis (unsafe)
        "p": 30_000.0,  # waiting since 0: its expiry
        "c": 30_000.0,
        "h": 30_000.0,
    }
    assert parts.throttle.dirty


def test_a_restored_throttle_keeps_the_rest_of_its_minimum_on_time() -> None:
    """A throttle on since 100 (min-on 250), snapshotted at 150: the device rebuilt from the
    snapshot's JSON has it on with its streams, ids and counts, and its minimum on-time
    runs out at 350 on the device's clock, as it would have without the restart."""
    engine, out = Engine(EngineConfig()), list[Output]()
    engine.apply(
        "d", [ChunkEvent(stream="s", t_ms=0.0, seq=0, audio_ms=180.0, eta_ms=50.0)], 0.0, out
    )
    engine.advance(150.0, out)
    assert [o.t_ms for o in out if isinstance(o, ThrottleChanged) and o.active] == [100.0]
    data = json.loads(json.dumps(take(engine.devices(), 150.0)))
    (device,) = restore_devices(data, EngineConfig(), 10_150.0)
    assert (device.throttle_on, device.throttle_since, list(device.streams)) == (True, 100.0, ["s"])
    assert device.stats.chunks == 1
    assert (350.0, MIN_ON) in [(at, what) for at, _, _, what in device.timers.heap]
