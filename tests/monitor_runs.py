"""Driving a `Monitor` through a trace as replay and the daemon do, and comparing the lines
that come out (the snapshot and the timer-order properties share these)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgemon.engine.outputs import StreamSample
from edgemon.replay import to_line

if TYPE_CHECKING:
    from edgemon.engine.outputs import Output
    from edgemon.monitor import Monitor

#: One message of a trace: (received at, wall ms; topic; payload).
Received = tuple[float, str, bytes]


def drive(monitor: Monitor, messages: list[Received]) -> list[dict[str, Any]]:
    """Messages through the monitor, the clock advanced only to each message's receipt (in
    one jump over every timer in between); the printable outputs (samples left out)."""
    out: list[Output] = []
    for recv, topic, payload in messages:
        monitor.advance(recv, out)
        monitor.receive(topic, payload, recv, out)
    return printable(out)


def drive_stepping(monitor: Monitor, messages: list[Received]) -> list[dict[str, Any]]:
    """As `drive`, but the clock visits every deadline the monitor names before each message
    (`next_deadline()`, as the daemon sleeps until it), one at a time."""
    out: list[Output] = []
    for recv, topic, payload in messages:
        for _ in range(100_000):
            deadline = monitor.next_deadline()
            if deadline is None or deadline > recv:
                break
            monitor.advance(deadline, out)
            if deadline == recv:
                break
        else:
            raise AssertionError("next_deadline() did not move on")
        monitor.advance(recv, out)
        monitor.receive(topic, payload, recv, out)
    return printable(out)


def printable(out: list[Output]) -> list[dict[str, Any]]:
    """The JSON lines (README "edgemon replay") of `out`, samples left out."""
    lines = [to_line(o) for o in out if not isinstance(o, StreamSample)]
    return [line for line in lines if line is not None]


def per_stream(lines: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Lines in order, per (device, stream) (throttle lines under stream "")."""
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for line in lines:
        key = (str(line.get("device")), str(line.get("stream", "")))
        grouped.setdefault(key, []).append(line)
    return grouped
