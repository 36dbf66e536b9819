"""SIGINT and SIGTERM end a foreground command through its handler, only while it runs."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from edgemon.cli.signals import on_stop_signals


@pytest.mark.asyncio
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
async def test_a_stop_signal_calls_the_handler_then_the_handler_is_gone(
    sig: signal.Signals,
) -> None:
    """Inside the block the signal reaches the handler (no KeyboardInterrupt, no exit); after
    it, the loop has no handler for it any more."""
    called = asyncio.Event()
    loop = asyncio.get_running_loop()
    with on_stop_signals(called.set):
        os.kill(os.getpid(), sig)
        async with asyncio.timeout(2):
            await called.wait()
    assert not loop.remove_signal_handler(sig)
