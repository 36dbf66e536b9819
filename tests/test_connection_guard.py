"""Bounded connections (docs/reliability.md, "Hostile clients"): the HTTP listener and the agent
port cap their open connections and close one that brings no complete request in time, on
real sockets. Before, both kept any number of connections for as long as a client liked, and
a few hundred idle ones used every file descriptor the daemon had."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

import pytest
from aiohttp import web

from edgemon.adapters.agent import serve_agent
from edgemon.adapters.connection_guard import (
    BACKLOG,
    MAX_AGENT_CONNECTIONS,
    MAX_HTTP_CONNECTIONS,
    RESERVED_FILES,
    ConnectionGuard,
    limits_for,
)
from edgemon.adapters.http import serve
from edgemon.daemon import Daemon
from edgemon.settings import HttpSettings

from clients import settings_for
from daemons import running

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from brokers import Broker

pytestmark = pytest.mark.asyncio

#: Generous: only waited in full when a test fails on a loaded machine.
WITHIN_S = 30.0
#: The deadline for a request in these tests (the daemon's is `REQUEST_TIMEOUT_S`).
TIMEOUT_S = 0.5
HEAD = b"GET /healthz HTTP/1.1\r\nHost: t\r\n"


def healthz_app(release: asyncio.Event) -> web.Application:
    """/healthz answers at once; /slow answers once `release` is set."""

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def slow(_request: web.Request) -> web.Response:
        await release.wait()
        return web.Response(text="late\n")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/slow", slow)
    return app


@contextlib.asynccontextmanager
async def served(guard: ConnectionGuard) -> AsyncIterator[tuple[int, asyncio.Event]]:
    """The app behind `guard` on a free port: (port, the event that releases /slow)."""
    release = asyncio.Event()
    try:
        async with serve(healthz_app(release), host="127.0.0.1", port=0, guard=guard) as port:
            yield port, release
    finally:
        release.set()


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """Whether the server closes the connection (read until EOF or a reset)."""
    try:
        async with asyncio.timeout(WITHIN_S):
            while await reader.read(4096):
                pass
    except ConnectionError:
        pass
    return True


async def get(port: int, path: str = "/healthz") -> bytes:
    """One GET on a new connection: the response's first line."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode())
        async with asyncio.timeout(WITHIN_S):
            return await reader.readline()
    finally:
        writer.close()


async def test_a_connection_without_a_complete_request_is_closed_in_time() -> None:
    """An idle connection, one dripping its request head, and a kept-alive one that brings no
    next request are each closed once `timeout_s` passes without a complete request; a
    request that came in time is answered."""
    guard = ConnectionGuard(16, timeout_s=TIMEOUT_S)
    async with served(guard) as (port, _):
        idle_reader, idle = await asyncio.open_connection("127.0.0.1", port)
        drip_reader, drip = await asyncio.open_connection("127.0.0.1", port)
        kept_reader, kept = await asyncio.open_connection("127.0.0.1", port)
        kept.write(HEAD + b"\r\n")
        assert await kept_reader.readline() == b"HTTP/1.1 200 OK\r\n"

        async def dripping() -> None:
            for byte in HEAD:
                drip.write(bytes([byte]))
                await asyncio.sleep(TIMEOUT_S / 4)

        dripper = asyncio.create_task(dripping())
        try:
            for reader in (idle_reader, drip_reader, kept_reader):
                assert await closed_by_server(reader)
        finally:
            dripper.cancel()
            for writer in (idle, drip, kept):
                writer.close()
    assert guard.timed_out == 3
    assert guard.open == 0


async def test_at_the_cap_a_new_connection_closes_the_oldest_waiting_one() -> None:
    """With `limit` idle connections open, a probe still gets its answer: it closes the oldest
    idle one; a connection whose request is being answered is never closed for a newer one,
    and when every slot is answering, the newcomer is closed at once."""
    guard = ConnectionGuard(3, timeout_s=WITHIN_S)
    async with served(guard) as (port, release):
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        await _until(lambda: guard.open == 3)
        assert await get(port) == b"HTTP/1.1 200 OK\r\n"
        assert await closed_by_server(idle[0][0])
        assert guard.evicted >= 1
        slow = [asyncio.create_task(get(port, "/slow")) for _ in range(3)]
        await _until(lambda: guard.answering == 3)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await closed_by_server(reader)
        writer.close()
        assert guard.refused == 1
        release.set()
        assert [await task for task in slow] == [b"HTTP/1.1 200 OK\r\n"] * 3
        for _, idle_writer in idle:
            idle_writer.close()


async def test_the_agent_port_answers_every_connection_and_keeps_at_most_its_limit() -> None:
    """Each connection gets its answer line; beyond `limit` open (peers that never close their
    side), the oldest is closed, so at most `limit` stay open."""
    async with serve_agent(lambda: "up 50%\n", host="127.0.0.1", port=0, limit=4) as port:
        peers = [await asyncio.open_connection("127.0.0.1", port) for _ in range(10)]
        for reader, _ in peers:
            assert await reader.readline() == b"up 50%\n"
        for reader, _ in peers[:6]:
            assert await closed_by_server(reader)
        for _, writer in peers:
            writer.close()


async def test_connection_caps_leave_files_for_the_daemon() -> None:
    """The caps follow the limit of open files: with `ulimit -n 256` both together leave
    `RESERVED_FILES` free and room for a burst of accepts on each listener (the connections
    accepted, and as many evicted but not closed yet); with a large limit they stop at their
    maxima."""
    http, agent = limits_for(256)
    assert http + agent + RESERVED_FILES + 2 * 2 * BACKLOG <= 256
    assert limits_for(1 << 20) == (MAX_HTTP_CONNECTIONS, MAX_AGENT_CONNECTIONS)
    assert min(limits_for(64)) == 4


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(WITHIN_S):
        while not condition():  # noqa: ASYNC110 - state the server's callbacks change
            await asyncio.sleep(0.005)


@pytest.mark.integration
async def test_the_daemons_ports_close_idle_connections_and_stay_bounded(
    mosquitto_broker: Broker,
) -> None:
    """A running daemon with the agent check on: an idle connection to its HTTP port is closed
    by the daemon within `REQUEST_TIMEOUT_S` (before: kept for ever), and of 60 connections to
    its agent port that never close their side at most its cap stay open, each having had
    its answer (before: every one kept for 2 s, with no cap)."""
    http = HttpSettings(listen="127.0.0.1:0", agent_listen="127.0.0.1:0")
    daemon = Daemon(
        settings_for(mosquitto_broker, http=http), environ={}, install_signal_handlers=False
    )
    async with running(daemon):
        assert daemon.http_port is not None
        await _until(lambda: daemon.agent_port is not None)
        assert daemon.agent_port is not None
        reader, idle = await asyncio.open_connection("127.0.0.1", daemon.http_port)
        assert await closed_by_server(reader)
        idle.close()
        peers = [await asyncio.open_connection("127.0.0.1", daemon.agent_port) for _ in range(60)]
        for peer_reader, _ in peers:
            assert (await peer_reader.readline()).startswith(b"up ")
        closed = 0
        for peer_reader, _ in peers[: 60 - limits_for()[1]]:
            closed += await closed_by_server(peer_reader)
        for _, writer in peers:
            writer.close()
    assert closed == 60 - limits_for()[1]
