"""The players' network to the real engine, slowed now and then: a delaying TCP proxy.

The `network` scenario (`--network D:S:P`, as the virtual loop's) on the real engine: the
players reach the server through this proxy, a process of its own. What a player sends goes
upstream at once; what the server sends reaches the player D ms later when it arrives inside
a window (the last S s of every P s from the run's origin), at once outside, and never
before anything the server sent earlier on that connection (a Wi-Fi link that degrades holds
its queue; chunks are never reordered). `DelayProxy` starts it and waits until it accepts;
run as a script it is the proxy:

    python benchmarks/_real_proxy.py LISTEN_PORT UPSTREAM_PORT D:S:P ORIGIN_S
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _real_server import free_port

from edgemon.simulate.scenarios import Network, scenario

START_S = 30.0
READ_BYTES = 65_536


async def _upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The player's bytes to the server, at once."""
    with contextlib.suppress(OSError):
        while data := await reader.read(READ_BYTES):
            writer.write(data)
            await writer.drain()
    writer.close()  # an HTTP client never half-closes: its end is the connection's


async def _downstream(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    network: Network,
    origin_s: float,
) -> None:
    """The server's bytes to the player, each read released at max(its arrival + the delay
    in force then, the previous release)."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def read() -> None:
        last = 0.0
        with contextlib.suppress(OSError):
            while data := await reader.read(READ_BYTES):
                now = time.time()
                last = max(now + network.extra_ms((now - origin_s) * 1000.0) / 1000.0, last)
                queue.put_nowait((last, data))
        queue.put_nowait((last, b""))

    async def send() -> None:
        while True:
            release, data = await queue.get()
            wait = release - time.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        writer.close()

    with contextlib.suppress(OSError):
        await asyncio.gather(read(), send())


async def serve(listen: int, upstream: int, network: Network, origin_s: float) -> None:
    """Proxy 127.0.0.1:`listen` to 127.0.0.1:`upstream` until killed."""

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream)
        except OSError:
            writer.close()
            return
        await asyncio.gather(
            _upstream(reader, up_writer),
            _downstream(up_reader, writer, network, origin_s),
        )
        up_writer.close()

    server = await asyncio.start_server(connection, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


class DelayProxy:
    """The proxy as a process in front of the server on `upstream` (see the module doc)."""

    def __init__(self, upstream: int, network: str, origin_s: float) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            [sys.executable, __file__, str(self.port), str(upstream), network, repr(origin_s)],
            stdin=subprocess.DEVNULL,
        )

    @property
    def url(self) -> str:
        """The URL players use instead of the server's."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> DelayProxy:
        """Wait until it accepts connections (RuntimeError if it does not)."""
        deadline = time.monotonic() + START_S
        while self.process.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return self
            time.sleep(0.05)
        self.close()
        raise RuntimeError("the delaying proxy did not start")

    def close(self) -> None:
        """Stop it."""
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def main(argv: list[str]) -> int:
    """The proxy process: LISTEN_PORT UPSTREAM_PORT D:S:P ORIGIN_S."""
    listen, upstream, flag, origin = argv
    network = scenario("network", network=flag).network
    assert network is not None
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(int(listen), int(upstream), network, float(origin)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
