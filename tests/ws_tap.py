"""A WebSocket relay to a broker's TCP listener that sees every MQTT packet: the web
Reporter's MQTT link (clients/js/src/mqtt.ts) is tested through it.

`WsTap` accepts WebSocket connections (subprotocol `mqtt`) on a free loopback port and relays
each to 127.0.0.1:`target`, keeping every packet in `packets` (`strict_peer.Packet`: `out`
from the page to the broker, `in` the other way). What a real broker and browser do not do on
demand, it does when asked: `piece` re-cuts the broker's bytes into WebSocket messages of that
many bytes (a packet split across messages, or several in one), and `mute()` stops passing the
broker's bytes on to the connections open now (connections that went dead without closing).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import TYPE_CHECKING

from aiohttp import WSMsgType, web

from strict_peer import Packet, PacketSplitter

if TYPE_CHECKING:
    from collections.abc import Awaitable


class WsTap:
    """The relay; `await start()`, then `url`; `await stop()` at the end."""

    def __init__(self, target: int, *, piece: int | None = None) -> None:
        self.target = target
        self.piece = piece
        self.packets: list[Packet] = []
        self.connections = 0
        self._muted: set[int] = set()
        self._open: set[int] = set()
        self._arrived = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/mqtt"

    def mute(self) -> None:
        """From now on the broker's bytes reach none of the connections open now."""
        self._muted |= self._open

    def kinds(self, connection: int | None = None) -> list[tuple[str, str]]:
        """(direction, kind) of each packet so far, of one connection (from 0) or all."""
        return [
            (p.direction, p.kind)
            for p in self.packets
            if connection is None or p.connection == connection
        ]

    async def wait_connections(self, count: int) -> None:
        """Return once `count` connections came (whether or not they reached the broker)."""
        async with self._arrived:
            await self._arrived.wait_for(lambda: self.connections >= count)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/mqtt", self._relay)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        listener = socket.create_server(("127.0.0.1", 0))
        self.port = listener.getsockname()[1]
        await web.SockSite(self._runner, listener).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _relay(self, request: web.Request) -> web.WebSocketResponse:
        page = web.WebSocketResponse(protocols=("mqtt",))
        await page.prepare(request)
        connection = self.connections
        self.connections += 1
        async with self._arrived:
            self._arrived.notify_all()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:  # no broker there (yet): the page sees its WebSocket close
            await page.close()
            return page
        self._open.add(connection)

        def keep(direction: str, splitter: PacketSplitter, data: bytes) -> None:
            for packet in splitter.feed(data):
                self.packets.append(Packet(len(self.packets), connection, direction, packet))

        async def upstream() -> None:
            splitter = PacketSplitter()
            async for message in page:
                if message.type != WSMsgType.BINARY:
                    break
                keep("out", splitter, message.data)
                writer.write(message.data)
                await writer.drain()

        async def downstream() -> None:
            splitter = PacketSplitter()
            while data := await reader.read(65536):
                keep("in", splitter, data)
                if connection in self._muted:
                    continue
                step = self.piece or len(data)
                for at in range(0, len(data), step):
                    await page.send_bytes(data[at : at + step])

        tasks: list[Awaitable[None]] = [upstream(), downstream()]
        running = [asyncio.ensure_future(task) for task in tasks]
        await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
        for task in running:
            task.cancel()
        self._open.discard(connection)
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
        await page.close()
        return page
