"""The daemon in-process, as the tests run it: `running(daemon)` starts `Daemon.run()` as a
task, waits until it is up and, when the block ends, stops it as SIGTERM does
(`request_stop()`, the signal handler's own call) and expects exit code 0; `start` and `stop`
are its two halves, for a test that stops and starts daemons in the middle of something
else. `logged()` picks one event's lines out of what the `captured_logs` fixture captured,
`rejections()` the `message_rejected` lines with when they were logged. `PausableClock` is a
daemon clock the test can hold still: what must happen within one instant of edgemon's clock
(a burst inside one rate-limit window, an outage noticed before a deadline) then happens
within it however slowly this machine runs the test."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any, Literal

from edgemon.daemon.wall_clock import MonotonicWallClock

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Iterable, Iterator, Mapping, Sequence

    from edgemon.daemon import Daemon

#: What `running` waits for before the block: subscribed (`daemon.ready`, when READY=1 is
#: sent), only the HTTP server listening (the broker refuses it, say), or nothing at all.
Until = Literal["ready", "http", "started"]

#: What capturing adds to each line besides the fields it was logged with.
CAPTURE_KEYS = frozenset({"event", "log_level", "monotonic_s"})


@contextlib.asynccontextmanager
async def running(
    daemon: Daemon,
    *,
    until: Until = "ready",
    start_within_s: float = 5.0,
    stop_within_s: float = 5.0,
    logs: Sequence[Mapping[str, Any]] = (),
) -> AsyncIterator[asyncio.Task[int]]:
    """Run `daemon` for the block (`start`), which gets its task; then `stop` it, unless the
    block did."""
    task = await start(daemon, until=until, within_s=start_within_s, logs=logs)
    try:
        yield task
    finally:
        await stop(daemon, task, within_s=stop_within_s, logs=logs)


async def start(
    daemon: Daemon,
    *,
    until: Until = "ready",
    within_s: float = 5.0,
    logs: Sequence[Mapping[str, Any]] = (),
) -> asyncio.Task[int]:
    """Run `daemon.run()` as a task; return it once the daemon is up (`until`, within
    `within_s`). If it is not, stop it and fail. `logs`, the captured lines, are shown when
    it ends early."""
    task = asyncio.create_task(daemon.run(), name="daemon")
    try:
        async with asyncio.timeout(within_s):
            waiter = asyncio.ensure_future(_up(daemon, until))
            try:
                await asyncio.wait((waiter, task), return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
        assert not task.done(), f"the daemon ended before it was {until}: {list(logs)}"
    except BaseException:
        await stop(daemon, task, logs=logs)
        raise
    return task


async def stop(
    daemon: Daemon,
    task: asyncio.Task[int],
    *,
    within_s: float = 5.0,
    logs: Sequence[Mapping[str, Any]] = (),
) -> None:
    """Stop the daemon as SIGTERM does (unless it has ended) and expect exit code 0 within
    `within_s`."""
    if not task.done():
        daemon.request_stop()
    async with asyncio.timeout(within_s):
        code = await task
    assert code == 0, f"the daemon exited with {code}: {list(logs)}"


def _up(daemon: Daemon, until: Until) -> Awaitable[object]:
    if until == "ready":
        return daemon.ready.wait()
    if until == "http":
        return _http_listening(daemon)
    return asyncio.sleep(0)


async def _http_listening(daemon: Daemon) -> None:
    while daemon.http_port is None:  # noqa: ASYNC110 - the daemon exposes no event for it
        await asyncio.sleep(0.01)


def logged(logs: Iterable[Mapping[str, Any]], event: str) -> list[dict[str, Any]]:
    """The fields of every captured line of `event`, in order, as the code logged them."""
    return [
        {key: value for key, value in line.items() if key not in CAPTURE_KEYS}
        for line in logs
        if line["event"] == event
    ]


def rejections(
    logs: Iterable[Mapping[str, Any]], device_id: str | None = None, reason: str | None = None
) -> list[tuple[float, Mapping[str, Any]]]:
    """`(monotonic s, line)` of each captured `message_rejected` line, optionally of one
    device and reason."""
    return [
        (line["monotonic_s"], line)
        for line in logs
        if line["event"] == "message_rejected"
        and (device_id is None or line["device"] == device_id)
        and (reason is None or line["reason"] == reason)
    ]


class PausableClock:
    """Monotonic nanoseconds that stop while `paused()` holds and go on from there after (no
    jump): pass `monotonic_ns` to `MonotonicWallClock`, or take `wall_clock()`."""

    __slots__ = ("_frozen_ns", "_lost_ns")

    def __init__(self) -> None:
        self._lost_ns = 0
        self._frozen_ns: int | None = None

    def monotonic_ns(self) -> int:
        """Monotonic time less the time spent paused."""
        if self._frozen_ns is not None:
            return self._frozen_ns
        return time.monotonic_ns() - self._lost_ns

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold the clock still for the block."""
        assert self._frozen_ns is None, "already paused"
        self._frozen_ns = self.monotonic_ns()
        try:
            yield
        finally:
            self._lost_ns = time.monotonic_ns() - self._frozen_ns
            self._frozen_ns = None

    def wall_clock(self) -> MonotonicWallClock:
        """A daemon clock on this time."""
        return MonotonicWallClock(monotonic_ns=self.monotonic_ns)
