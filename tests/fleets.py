"""A Monitor and its metrics registry fed a simulated fleet, on a clock the feed moves."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from edgemon.adapters.metrics import ConnectionState, build_registry
from edgemon.engine import EngineConfig
from edgemon.monitor import Monitor

if TYPE_CHECKING:
    from collections.abc import Iterator

    from edgemon.adapters.metrics import EdgemonRegistry
    from edgemon.engine.outputs import Output
    from edgemon.simulate import Simulation


#: The capacity object each simulated device's engine publishes first (docs/protocol.md).
CAPACITY = {"realtime_streams": 8, "running": 0, "waiting": 0, "start_wait_ms": 0, "shed_total": 0}


class SimulatedFleet:
    """`simulation`'s devices (engine and capacity objects first) fed to a Monitor through
    `Monitor.handle`; the registry's wall clock is the instant of the last message fed."""

    __slots__ = ("monitor", "now_ms", "out", "registry", "simulation")

    def __init__(self, simulation: Simulation, start_ms: float, *, per_stream_series: int) -> None:
        self.simulation = simulation
        self.now_ms = start_ms
        self.monitor = Monitor(EngineConfig())
        self.registry: EdgemonRegistry = build_registry(
            self.monitor,
            wall_clock=lambda: self.now_ms,
            connection=ConnectionState(),
            per_stream_series=per_stream_series,
            version="0",
        )
        self.out: list[Output] = []
        for device, engine in simulation.engine_objects().items():
            payload = json.dumps(engine).encode()
            self.monitor.handle(f"edgemon/v1/{device}/engine", payload, start_ms, self.out)
            capacity = json.dumps(CAPACITY).encode()
            self.monitor.handle(f"edgemon/v1/{device}/capacity", capacity, start_ms, self.out)

    def feed(self, until_ms: float) -> Iterator[float]:
        """Feed every message up to `until_ms`, yielding the clock after each."""
        for message in self.simulation.until(until_ms):
            self.now_ms = message.t_ms
            topic = f"edgemon/v1/{message.device}/events"
            payload = json.dumps(message.payload).encode()
            self.monitor.handle(topic, payload, self.now_ms, self.out)
            yield self.now_ms
