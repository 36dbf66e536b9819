"""Bounded connections for edgemon's listeners: a cap on those open at once, and a few
seconds for each to bring a complete request (docs/reliability.md, "Hostile clients").

Without them anyone who reaches a port holds a file descriptor per connection for as long
as it likes (an idle connection, a request head dripped a byte at a time): a few hundred such
connections use every descriptor the process may have, and then the write-ahead log cannot
open its next file and `/healthz` cannot be answered.

`ConnectionGuard` keeps the open connections in the order they came:
- each must bring a complete request within `timeout_s` of its opening, and a kept-alive one
  its next request within `timeout_s` of the last answer, else it is closed (a response still
  being written to a slow reader is given up to `WRITE_TIMEOUT_S` more);
- at `limit` open connections a new one closes the oldest that is waiting for its request
  (an idle or dripping one: never one being answered); if every one is being answered, the
  new one is closed at once. A probe that sends its request at once therefore always gets in,
  whatever number of idle connections an attacker keeps opening.

`limits_for(nofile)` sizes the caps of the HTTP listener and the agent port from the
process's limit of open files, leaving `RESERVED_FILES` for everything else and room for one
burst of accepts on each listener (`BACKLOG`).

For aiohttp, `GuardedProtocol` wraps each connection's protocol (aiohttp's documented
low-level `web.Server` is the protocol factory); it creates aiohttp's handler only when the
first bytes arrive, so an idle connection costs no more than its socket. `guard_middleware`
tells the guard when a request begins and ends.
"""

from __future__ import annotations

import asyncio
import resource
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from collections.abc import Callable

    from aiohttp.typedefs import Handler, Middleware

__all__ = [
    "BACKLOG",
    "REQUEST_TIMEOUT_S",
    "ConnectionGuard",
    "GuardedProtocol",
    "guard_middleware",
    "limits_for",
]

#: Seconds a connection has to bring a complete request (and a kept-alive one its next).
REQUEST_TIMEOUT_S = 5.0
#: More seconds an answer may take to be read by a slow client before the connection goes.
WRITE_TIMEOUT_S = 30.0
#: Open files kept for the daemon itself (broker, log files, snapshot, event loop, threads).
RESERVED_FILES = 64
#: Connections the kernel holds complete but not yet accepted (the `listen` backlog), which
#: is also how many asyncio accepts in one go. A burst opens that many descriptors before the
#: connections they evict are closed (an abort closes in the next loop iteration), so each
#: listener needs twice this beyond its cap (`limits_for`): else `accept` fails with EMFILE,
#: asyncio stops accepting for a second, and every connection attempt meanwhile waits.
BACKLOG = 32
#: The caps at most: HTTP connections (scrapers, probes, `top`), agent-check connections.
MAX_HTTP_CONNECTIONS = 128
MAX_AGENT_CONNECTIONS = 32


def limits_for(nofile: int | None = None) -> tuple[int, int]:
    """(HTTP, agent) connection caps for a limit of `nofile` open files (the process's own
    soft limit when None): three quarters and one quarter of what `RESERVED_FILES` and two
    bursts of accepts per listener (`BACKLOG`) leave, at most `MAX_HTTP_CONNECTIONS` and
    `MAX_AGENT_CONNECTIONS`, at least 4 each."""
    if nofile is None:
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    spare = max(0, nofile - RESERVED_FILES - 2 * 2 * BACKLOG)
    return (
        max(4, min(MAX_HTTP_CONNECTIONS, spare * 3 // 4)),
        max(4, min(MAX_AGENT_CONNECTIONS, spare // 4)),
    )


class _Slot:
    """One open connection: its transport, its deadline, whether a request is being answered."""

    __slots__ = ("busy", "timer", "transport", "writing_since")

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.busy = 0
        self.timer: asyncio.TimerHandle | None = None
        self.writing_since: float | None = None


class ConnectionGuard:
    """The connections of one listener (see the module doc). Counts what it closed."""

    __slots__ = ("_loop", "_slots", "evicted", "limit", "refused", "timed_out", "timeout_s")

    def __init__(self, limit: int, *, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.limit = limit
        self.timeout_s = timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Open connections, oldest first (dicts keep insertion order).
        self._slots: dict[asyncio.Transport, _Slot] = {}
        #: Connections closed for holding on without a request, evicted by newer ones, and
        #: refused because every slot was answering a request.
        self.timed_out = 0
        self.evicted = 0
        self.refused = 0

    @property
    def open(self) -> int:
        """Connections open now."""
        return len(self._slots)

    @property
    def answering(self) -> int:
        """Connections whose request is being answered now."""
        return sum(1 for slot in self._slots.values() if slot.busy)

    def admit(self, transport: asyncio.Transport) -> bool:
        """A new connection: False (and closed) when every slot is answering a request."""
        if len(self._slots) >= self.limit and not self._evict_one():
            self.refused += 1
            transport.abort()
            return False
        slot = _Slot(transport)
        self._slots[transport] = slot
        self._arm(slot, self.timeout_s)
        return True

    def busy(self, transport: asyncio.Transport | None) -> None:
        """A complete request arrived on `transport`: no deadline while it is answered."""
        slot = self._slots.get(transport) if transport is not None else None
        if slot is not None:
            slot.busy += 1
            self._disarm(slot)

    def idle(self, transport: asyncio.Transport | None) -> None:
        """The request on `transport` was answered: the next must come within the timeout."""
        slot = self._slots.get(transport) if transport is not None else None
        if slot is not None:
            slot.busy = max(0, slot.busy - 1)
            if not slot.busy:
                slot.writing_since = None
                self._arm(slot, self.timeout_s)

    def release(self, transport: asyncio.Transport) -> None:
        """The connection is gone."""
        slot = self._slots.pop(transport, None)
        if slot is not None:
            self._disarm(slot)

    def close_all(self) -> None:
        """Close every connection (the listener stops)."""
        for transport in list(self._slots):
            self.release(transport)
            transport.abort()

    def _evict_one(self) -> bool:
        for transport, slot in self._slots.items():
            if not slot.busy:
                self.evicted += 1
                self.release(transport)
                transport.abort()
                return True
        return False

    def _arm(self, slot: _Slot, delay: float) -> None:
        self._disarm(slot)
        loop = self._loop or asyncio.get_running_loop()
        self._loop = loop
        slot.timer = loop.call_later(delay, self._expire, slot)

    @staticmethod
    def _disarm(slot: _Slot) -> None:
        if slot.timer is not None:
            slot.timer.cancel()
            slot.timer = None

    def _expire(self, slot: _Slot) -> None:
        """The deadline passed: close the connection, unless an answer is still being read."""
        slot.timer = None
        transport = slot.transport
        if transport.get_write_buffer_size() > 0 and not transport.is_closing():
            now = asyncio.get_running_loop().time()
            if slot.writing_since is None:
                slot.writing_since = now
            if now - slot.writing_since < WRITE_TIMEOUT_S:
                self._arm(slot, self.timeout_s)
                return
        self.timed_out += 1
        self.release(transport)
        transport.abort()


class GuardedProtocol(asyncio.Protocol):
    """One HTTP connection under a `ConnectionGuard`: aiohttp's handler, made from
    `factory` (the `web.Server`) when the first bytes arrive, does the rest."""

    __slots__ = ("_factory", "_guard", "_inner", "_transport")

    def __init__(self, factory: Callable[[], asyncio.Protocol], guard: ConnectionGuard) -> None:
        self._factory = factory
        self._guard = guard
        self._inner: asyncio.Protocol | None = None
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)  # a stream server's: TCP, or TLS over it
        if self._guard.admit(transport):
            self._transport = transport

    def data_received(self, data: bytes) -> None:
        if self._transport is None:
            return
        inner = self._inner
        if inner is None:
            inner = self._inner = self._factory()
            inner.connection_made(self._transport)
        inner.data_received(data)

    def eof_received(self) -> bool | None:
        if self._inner is None:
            return None  # close the connection
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._guard.release(self._transport)
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()


def guard_middleware(guard: ConnectionGuard) -> Middleware:
    """Tells `guard` when each request begins (its head is complete) and ends."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        transport = request.transport
        guard.busy(transport)
        try:
            return await handler(request)
        finally:
            guard.idle(transport)

    return middleware
