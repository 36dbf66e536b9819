"""Publish a `Simulation` to an MQTT broker at real time (its virtual clock = wall clock ms).

Each device's engine object goes out first, retained, on `P/{device}/engine`; then every
event at its `t_ms` on `P/{device}/events`, QoS 1. Events of one device that fall due
together may go as one JSON array (a batch). At the end (duration over, or `stop` set) every
stream still being generated is ended as `cancelled`, so a monitor sees no false underruns.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgemon.simulate.mqtt_link import PublishError, PublishLink

__all__ = ["PublishError", "PublishReport", "publish_simulation", "wall_ms"]

if TYPE_CHECKING:
    from collections.abc import Callable

    from edgemon.simulate.model import Message, Simulation


def wall_ms() -> float:
    """The wall clock in Unix epoch milliseconds (the devices' clock)."""
    return time.time() * 1000.0


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishReport:
    """What a run published."""

    messages: int
    events: int
    streams: int
    chunks: int
    audio_ms: float
    cancelled: int
    completed: int


@dataclass(slots=True)
class _Tally:
    messages: int = 0
    events: int = 0
    streams: int = 0
    chunks: int = 0
    audio_ms: float = 0.0
    cancelled: int = 0
    completed: int = 0

    def count(self, payload: dict[str, Any]) -> None:
        self.events += 1
        kind = payload["type"]
        if kind == "start":
            self.streams += 1
        elif kind == "chunk":
            self.chunks += 1
            self.audio_ms += payload["audio_ms"]
            self.completed += bool(payload.get("final"))
        else:
            self.cancelled += 1

    def report(self) -> PublishReport:
        return PublishReport(
            messages=self.messages,
            events=self.events,
            streams=self.streams,
            chunks=self.chunks,
            audio_ms=self.audio_ms,
            cancelled=self.cancelled,
            completed=self.completed,
        )


async def publish_simulation(  # noqa: PLR0913 - keyword-only knobs of one run
    simulation: Simulation,
    *,
    hostname: str,
    port: int,
    duration_s: float | None,
    stop: asyncio.Event | None = None,
    topic_prefix: str = "edgemon/v1",
    batch: bool = False,
    identifier: str | None = None,
    clock: Callable[[], float] = wall_ms,
) -> PublishReport:
    """Publish `simulation` in real time until `duration_s` has passed or `stop` is set.

    `simulation.start_ms` should be about `clock()` now: events are sent when `clock()`
    reaches their `t_ms`. Raises `PublishError` if the broker cannot be reached or goes away.
    """
    stop = stop or asyncio.Event()
    end = None if duration_s is None else clock() + duration_s * 1000.0
    tally = _Tally()
    async with PublishLink(hostname, port, identifier=identifier) as client:
        await asyncio.gather(
            *(
                client.publish(f"{topic_prefix}/{device}/engine", _json(obj), retain=True)
                for device, obj in simulation.engine_objects().items()
            )
        )
        while not stop.is_set():
            now = clock()
            if end is not None and now >= end:
                break
            await _send(client, simulation.until(now), topic_prefix, batch, tally)
            due = simulation.next_t_ms()
            if due is None:  # pragma: no cover - only a stopped simulation has none
                break
            if end is not None and due > end:
                due = end
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, due - clock()) / 1000.0)
        await _send(client, simulation.stop(clock()), topic_prefix, batch, tally)
    return tally.report()


async def _send(
    client: PublishLink,
    messages: list[Message],
    prefix: str,
    batch: bool,
    tally: _Tally,
) -> None:
    """Publish in order: paho queues each publish when called, so order per topic holds."""
    if not messages:
        return
    for message in messages:
        tally.count(message.payload)
    if batch:
        groups: dict[str, list[dict[str, Any]]] = {}
        for message in messages:
            groups.setdefault(message.device, []).append(message.payload)
        outgoing = [(device, _json(events)) for device, events in groups.items()]
    else:
        outgoing = [(message.device, _json(message.payload)) for message in messages]
    tally.messages += len(outgoing)
    await asyncio.gather(
        *(client.publish(f"{prefix}/{device}/events", body) for device, body in outgoing)
    )


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
