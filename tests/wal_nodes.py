"""A monitor with its state directory, driven as the daemon drives them (log, then apply):
`Node`, shared by the write-ahead log's tests."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

import structlog

from edgemon.daemon.persistence import Persistence
from edgemon.daemon.wal import generations, wal_path
from edgemon.engine import EngineConfig
from edgemon.monitor import Monitor

if TYPE_CHECKING:
    from pathlib import Path

    from edgemon.engine.outputs import Output

T0 = 1_700_000_000_000.0
TOPIC = "edgemon/v1/d1/events"


def chunk(seq: int, t: float) -> bytes:
    """Chunk `seq` of stream s: 200 ms of audio, the next one expected in 100 ms."""
    event = {"type": "chunk", "stream": "s", "t_ms": t, "seq": seq, "audio_ms": 200}
    return json.dumps(event | {"eta_ms": 100}).encode()


class Node:
    """A Monitor with its Persistence, driven as the daemon drives them (log, then apply)."""

    def __init__(self, directory: Path, *, wal: bool = True) -> None:
        self.monitor = Monitor(EngineConfig())
        self.out: list[Output] = []
        self.commits: list[float] = []
        self.persistence = Persistence(
            directory,
            monitor=self.monitor,
            replay=lambda record: self.apply(record.topic, record.payload, record.recv_ms),
            wal=wal,
            log=structlog.get_logger(),
            on_commit=self.commits.append,
        )

    def apply(self, topic: str, payload: bytes, now: float) -> None:
        """Apply one message at `now`, as the daemon does (outputs dropped)."""
        self.monitor.handle(topic, payload, now, self.out)
        self.out.clear()

    def receive(self, seq: int, now: float) -> None:
        """Chunk `seq` received at `now`: logged, then applied."""
        payload = chunk(seq, now)
        self.persistence.append(now, TOPIC, payload)
        self.apply(TOPIC, payload, now)

    async def durable(self) -> None:
        """Until what was logged so far is on disk (its acknowledgements released)."""
        done = asyncio.get_running_loop().create_future()
        self.persistence.when_durable(lambda: done.set_result(None))
        await done

    def chunks(self) -> int:
        """Chunks applied to device d1 (0 if unknown)."""
        device = self.monitor.engine.device("d1")
        return 0 if device is None else device.stats.chunks


async def closed_log(directory: Path, records: int = 3) -> Path:
    """A node in `directory` that made `records` chunks (seq 0, 1, …) durable and closed: the
    path of its one log file, for a test to tear or corrupt."""
    node = Node(directory)
    node.persistence.restore(T0)
    for seq in range(records):
        node.receive(seq, T0 + seq * 100)
    await node.durable()
    await node.persistence.close()
    (path,) = [wal_path(directory, g) for g in generations(directory)]
    return path
