"""HAProxy's agent check, answered on a small TCP port (`[http] agent_listen`, docs/fleet.md).

HAProxy connects every `agent-inter`, may send its `agent-send` string, and reads one line
up to `\\n`. edgemon writes the line at once (`edgemon.adapters.capacity.agent_reply`: the
weight from the engines' spare real-time streams), then reads whatever HAProxy sent until it
closes its side (at most `LINGER_S`), so that closing never resets a connection with unread
data in it. What HAProxy sends does not change the answer: one port answers for one device
(`[http] agent_device`) or for every device of the box, summed.

The answer is read from the engine on the event loop, as `/api/v1/capacity` is: O(devices)
with a device set, O(1) per device, no I/O.

Connections are bounded: at most `limit` open (`edgemon.adapters.connection_guard.limits_for`);
a new one beyond closes the oldest, which has had its answer already, so every connection
gets its line and none is kept longer than `LINGER_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from edgemon.adapters.connection_guard import BACKLOG, limits_for

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

__all__ = ["LINGER_S", "serve_agent"]

#: How long a connection is kept after the answer, for the peer to close its side.
LINGER_S = 2.0
#: What is read of the peer's data at most (its `agent-send` line; the rest is ignored).
READ_LIMIT = 4096


class _Agent:
    """The connections of one agent server, oldest first, so that a new one beyond `limit`
    ends the oldest, and stopping the server ends each of them."""

    __slots__ = ("_answer", "_limit", "_tasks", "evicted")

    def __init__(self, answer: Callable[[], str], limit: int) -> None:
        self._answer = answer
        self._limit = limit
        #: Open connections' tasks, oldest first (dicts keep insertion order).
        self._tasks: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        #: Connections ended early because newer ones came beyond the limit.
        self.evicted = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        while len(self._tasks) >= self._limit:
            oldest, oldest_writer = next(iter(self._tasks.items()))
            del self._tasks[oldest]
            oldest_writer.transport.abort()  # its read ends: the task ends on its own
            self.evicted += 1
        self._tasks[task] = writer
        try:
            writer.write(self._answer().encode("ascii"))
            if writer.can_write_eof():
                writer.write_eof()
            async with asyncio.timeout(LINGER_S):
                await writer.drain()
                while await reader.read(READ_LIMIT):
                    pass
        except (OSError, TimeoutError):
            pass  # the peer went away, or kept its side open: the answer was written
        finally:
            writer.close()
            self._tasks.pop(task, None)

    def cancel_all(self) -> list[asyncio.Task[None]]:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        return tasks


@contextlib.asynccontextmanager
async def serve_agent(
    answer: Callable[[], str], *, host: str, port: int, limit: int | None = None
) -> AsyncIterator[int]:
    """Answer the agent check with `answer()` on `host:port` for the block, at most `limit`
    connections open (by default `limits_for`'s); yields the port bound (port 0 picks a
    free one). On exit stops listening and ends every connection."""
    agent = _Agent(answer, limits_for()[1] if limit is None else limit)
    server = await asyncio.start_server(agent.handle, host, port, backlog=BACKLOG)
    try:
        bound: int = server.sockets[0].getsockname()[1]
        yield bound
    finally:
        server.close()
        tasks = agent.cancel_all()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()
