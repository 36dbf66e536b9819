"""`edgemon replay`: a recorded trace through the same engine, on a virtual clock (semantics.md).

The virtual clock is the trace's `recv_ms` (never running back). An `underrun` line is written
when the underrun is confirmed (docs/semantics.md), with its exact instant; one announced live and
then retracted is written as `underrun_retracted`. At equal times messages are
applied before timers fire and before samples are taken. After the last record the clock runs
on until nothing is pending, so every stream ends (completed, ended or expired) and is
summarised.
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

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from edgemon.engine.config import EngineConfig
    from edgemon.engine.outputs import Output
    from edgemon.engine.stats import DeviceStats
    from edgemon.trace import TraceRecord


def replay(
    records: Iterable[TraceRecord], config: EngineConfig, *, sample_ms: float | None = 100.0
) -> Iterator[dict[str, Any]]:
    """Yield the JSON-line objects of README for a trace, in virtual-time order."""
    monitor = Monitor(config, sample_every_ms=sample_ms or None)
    rejected = 0
    now = float("-inf")
    out: list[Output] = []
    forgotten: list[DeviceStats] = []  # devices forgotten on the way still count
    for record in records:
        now = max(now, record.recv_ms)
        # Messages at one instant all come before its timers and samples: the next record
        # (or the run-on below) takes the decision at `now` once it is later.
        monitor.handle(record.topic, record.payload, now, out, decide=False)
        for line in _lines(out, forgotten):
            rejected += line["kind"] == "rejected"
            yield line
        out.clear()
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


def _lines(outputs: list[Output], forgotten: list[DeviceStats]) -> Iterator[dict[str, Any]]:
    for output in outputs:
        if type(output) is DeviceForgotten:
            forgotten.append(output.stats)
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
        return {
            "kind": "throttle",
            "t_ms": output.t_ms,
            "device": output.device,
            "active": output.active,
            "streams": list(output.streams),
            "min_headroom_ms": output.min_headroom_ms,
        }
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
