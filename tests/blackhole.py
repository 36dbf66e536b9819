"""A TCP proxy to a broker that can turn every connection open so far into a black hole: the
connection stays open and the client's writes are taken (its kernel ACKs them), but nothing
reaches the broker and nothing comes back. A half-open link, or a hung broker whose kernel
still answers, as the client sees it. Connections made after that pass through again.

It records each connection's bytes from the client, so a test can read what the client sent
into the hole.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Self

if TYPE_CHECKING:
    from types import TracebackType


@dataclass(slots=True)
class Pipe:
    """One client connection through the proxy."""

    #: Everything the client sent, and where in it the black hole began (None: it did not).
    sent: bytearray = field(default_factory=bytearray)
    holed_at: int | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def packets_into_the_hole(self) -> list[int]:
        """The first byte of every packet the client sent after the black hole began."""
        firsts = []
        data, pos = bytes(self.sent), 0
        while pos + 1 < len(data):
            length, shift, i = 0, 0, pos + 1
            while i < len(data):
                byte = data[i]
                length |= (byte & 0x7F) << shift
                i += 1
                if byte < 0x80:
                    break
                shift += 7
            if self.holed_at is not None and pos >= self.holed_at:
                firsts.append(data[pos])
            pos = i + length
        return firsts


class BlackHoleProxy:
    """`async with BlackHoleProxy(port) as proxy`: listens on `proxy.port`, forwards to
    127.0.0.1:`port`; `black_hole()` silences the connections open now."""

    def __init__(self, target_port: int) -> None:
        self._target = target_port
        self._server: asyncio.Server | None = None
        self.port = 0
        self.pipes: list[Pipe] = []

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        assert self._server is not None
        self._server.close()
        tasks = [task for pipe in self.pipes for task in pipe.tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._server.wait_closed()

    def black_hole(self) -> Pipe:
        """Silence every connection open now, both ways; the last one (edgemon's)."""
        for pipe in self.pipes:
            if pipe.holed_at is None:
                pipe.holed_at = len(pipe.sent)
        return self.pipes[-1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pipe = Pipe()
        self.pipes.append(pipe)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._target)
        pipe.tasks = [
            asyncio.create_task(self._pump(reader, up_writer, pipe, record=True)),
            asyncio.create_task(self._pump(up_reader, writer, pipe, record=False)),
        ]
        try:
            await pipe.tasks[0]  # until the client closes
        finally:
            pipe.tasks[1].cancel()
            for end in (writer, up_writer):
                end.close()
                with contextlib.suppress(OSError):
                    await end.wait_closed()

    @staticmethod
    async def _pump(
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        pipe: Pipe,
        *,
        record: bool,
    ) -> None:
        with contextlib.suppress(OSError):
            while data := await source.read(65536):
                if record:
                    pipe.sent += data
                if pipe.holed_at is None:
                    sink.write(data)
                    await sink.drain()
        if not record:  # the broker closed: in the hole, the client must not learn it
            if pipe.holed_at is not None:
                await asyncio.Future()  # until cancelled
            sink.close()
