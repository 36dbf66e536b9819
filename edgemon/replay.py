"""`edgemon replay`: a recorded trace through the same engine, on a virtual clock (semantics.md).

The virtual clock is the trace's `recv_ms` (never running back). An `underrun` line is written
when the underrun is confirmed (docs/semantics.md), with its exact instant; one announced live and
then retracted is written as `underrun_retracted`. At equal times messages are
applied before timers fire and before samples are taken. After the last record the clock runs
on until nothing is pending, so every stream ends (completed, ended or expired) and is
summarised.

A trace recorded across restarts holds the daemon's marks (`edgemon.trace.MARKS`), and replay
does there what the daemon did: at `stop` every throttle is released (the farewell's
`false`); at `restart` and `stall` the stretch from `since_ms` is cut out of the devices'
timelines and the waits for late chunks start afresh; from `restart` until `resumed` no
throttle line is written (the daemon published nothing while catching up), and at `resumed`
one per device, its state as of then. A trace without marks replays as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgemon.engine.outputs import (
    DeviceForgotten,
    Rejected,
    StreamEnded,
    StreamSample,
    ThrottleChanged,
    UnderrunConfirmed,
    UnderrunRetracted,
)
from edgemon.monitor import Monitor
from edgemon.trace import TraceMark

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from edgemon.engine.config import EngineConfig
    from edgemon.engine.outputs import Output
    from edgemon.engine.stats import DeviceStats
    from edgemon.trace import TraceRecord


def replay(
    records: Iterable[TraceRecord | TraceMark],
    config: EngineConfig,
    *,
    sample_ms: float | None = 100.0,
) -> Iterator[dict[str, Any]]:
    """Yield the JSON-line objects of README for a trace, in virtual-time order."""
    monitor = Monitor(config, sample_every_ms=sample_ms or None)
    rejected = 0
    now = float("-inf")
    out: list[Output] = []
    forgotten: list[DeviceStats] = []  # devices forgotten on the way still count
    catching_up = False  # between a `restart` mark and its `resumed`: no throttle line
    for record in records:
        now = max(now, record.recv_ms)
        quiet = catching_up  # a mark's own decisions stay out if it starts or ends a catch-up
        if isinstance(record, TraceMark):
            catching_up = _mark(monitor, record, now, out, catching_up=catching_up)
            quiet = quiet or catching_up
        else:
            # Messages at one instant all come before its timers and samples: the next
            # record (or the run-on below) takes the decision at `now` once it is later.
            monitor.handle(record.topic, record.payload, now, out, decide=False)
        for line in _lines(out, forgotten, throttles=not quiet):
            rejected += line["kind"] == "rejected"
            yield line
        out.clear()
        if isinstance(record, TraceMark) and record.mark == "resumed" and not catching_up:
            for state in monitor.engine.throttle_states(now):
                yield _throttle_line(state)
    while (deadline := monitor.next_deadline()) is not None:
        monitor.advance(deadline, out)
        yield from _lines(out, forgotten)
        out.clear()
    devices = [device.stats for device in monitor.engine.devices()] + forgotten
    yield {
        "kind": "summary",
        "messages": monitor.messages,
        "events": monitor.events,
        "rejected": rejected,
        "streams": sum(stats.streams_started for stats in devices),
        "underruns": sum(stats.underruns for stats in devices),
        "throttle_engagements": sum(stats.throttle_engagements for stats in devices),
    }


def _mark(
    monitor: Monitor, mark: TraceMark, now: float, out: list[Output], *, catching_up: bool
) -> bool:
    """What the daemon did at `mark` (module docstring); whether it is catching up after."""
    kind = mark.mark
    if kind == "stop":
        monitor.advance(now, out)
        monitor.engine.release_all(now, out)
        return catching_up
    if kind == "resumed":
        monitor.advance(now, out)  # decided, not published: the lines stay out
        return False
    if mark.since_ms is not None:  # restart (with state restored) or stall
        since = min(mark.since_ms, now)
        monitor.advance(since, out)
        monitor.cut(since, now)
    monitor.engine.input_restored(now)
    return catching_up or kind == "restart"


def _lines(
    outputs: list[Output], forgotten: list[DeviceStats], *, throttles: bool = True
) -> Iterator[dict[str, Any]]:
    for output in outputs:
        if type(output) is DeviceForgotten:
            forgotten.append(output.stats)
            continue
        if not throttles and type(output) is ThrottleChanged:
            continue
        line = to_line(output)
        if line is not None:
            yield line


def to_line(output: Output) -> dict[str, Any] | None:
    """The replay line of one engine output (None for outputs replay does not print)."""
    if isinstance(output, StreamSample):
        return {
            "kind": "sample",
            "t_ms": output.t_ms,
            "device": output.device,
            "stream": output.stream,
            "slack_ms": output.slack_ms,
            "eta_ms": output.eta_ms,
            "headroom_ms": output.headroom_ms,
            "at_risk": output.at_risk,
        }
    if isinstance(output, UnderrunConfirmed | UnderrunRetracted):
        return _underrun_line(output)
    if isinstance(output, ThrottleChanged):
        return _throttle_line(output)
    if isinstance(output, StreamEnded):
        return {
            "kind": "stream_end",
            "t_ms": output.t_ms,
            "device": output.device,
            "stream": output.stream,
            "reason": output.reason,
            "chunks": output.chunks,
            "audio_ms": output.audio_ms,
            "underruns": output.underruns,
            "underrun_ms": output.underrun_ms,
            "min_slack_ms": output.min_slack_ms,
            "longest_gap_ms": output.longest_gap_ms,
            "outcome": output.outcome,
        }
    if isinstance(output, Rejected):
        return {
            "kind": "rejected",
            "recv_ms": output.recv_ms,
            "topic": output.topic,
            "reason": output.reason,
            "detail": output.detail,
        }
    return None


def _throttle_line(output: ThrottleChanged) -> dict[str, Any]:
    return {
        "kind": "throttle",
        "t_ms": output.t_ms,
        "device": output.device,
        "active": output.active,
        "streams": list(output.streams),
        "min_headroom_ms": output.min_headroom_ms,
    }


def _underrun_line(output: UnderrunConfirmed | UnderrunRetracted) -> dict[str, Any]:
    """`underrun` once confirmed, at its exact instant; `underrun_retracted` for one that
    was announced live (`UnderrunBegan`) and then shown never to have happened."""
    line: dict[str, Any] = {
        "kind": "underrun",
        "t_ms": output.t_ms,
        "device": output.device,
        "stream": output.stream,
    }
    if isinstance(output, UnderrunRetracted):
        line["kind"] = "underrun_retracted"
        line["retracted_ms"] = output.retracted_ms
    return line
