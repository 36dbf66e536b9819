"""Whether this machine kept up while a test ran: for the few tests that can judge timing only
then (on a loaded 2-core machine a process may not run for a second). `LoopLag` measures how
late the test's own event loop woke up; `CpuLag` how late a thread did; a test asserts its
timing only when the lag stayed below what the timing allows, and else skips with the figure."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING, Self

import pytest

if TYPE_CHECKING:
    from types import TracebackType

#: How often the probes wake.
TICK_S = 0.02


class LoopLag:
    """`async with LoopLag() as lag:` — `lag.max_s`, the most the event loop overslept a
    `TICK_S` sleep during the block."""

    def __init__(self) -> None:
        self.max_s = 0.0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._probe())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _probe(self) -> None:
        while True:
            began = time.monotonic()
            await asyncio.sleep(TICK_S)
            self.max_s = max(self.max_s, time.monotonic() - began - TICK_S)


class CpuLag:
    """`with CpuLag() as lag:` — `lag.max_s`, the most a thread overslept a `TICK_S` sleep
    during the block (for tests without an event loop, whose work runs in other processes)."""

    def __init__(self) -> None:
        self.max_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._probe, name="cpu-lag", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()

    def _probe(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            time.sleep(TICK_S)
            self.max_s = max(self.max_s, time.monotonic() - began - TICK_S)


def skip_unless_kept_up(lag_s: float, allowed_s: float, what: str) -> None:
    """Skip the rest of the test (its timing assertions) when the machine fell behind by more
    than `allowed_s`: `what` could not be judged."""
    if lag_s > allowed_s:
        pytest.skip(
            f"the machine did not keep up (a {TICK_S * 1000:.0f} ms sleep woke {lag_s:.2f} s "
            f"late, more than {allowed_s:.2f} s): {what} not judged"
        )
