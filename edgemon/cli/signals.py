"""SIGINT and SIGTERM as a clean end of a foreground command, not a traceback."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


@contextlib.contextmanager
def on_stop_signals(handler: Callable[[], None]) -> Iterator[None]:
    """While the block runs, SIGINT and SIGTERM call `handler` on the running event loop."""
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        # Not every loop can: another thread, or a platform without loop signal handlers.
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, handler)
            installed.append(sig)
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
