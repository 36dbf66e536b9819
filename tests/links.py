"""The daemon's MQTT link run against a `FakeBroker`, for the tests of what it does on the wire."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

import structlog

from edgemon.adapters.connection_state import ConnectionState
from edgemon.daemon.mqtt import LinkHooks, MqttLink
from edgemon.daemon.mqtt_codec import MAX_REMAINING_LENGTH
from edgemon.settings import MqttSettings
from edgemon.wire.topics import Topics

from fake_broker import FakeBroker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable


async def until(condition: Callable[[], bool], what: str, within_s: float = 30.0) -> None:
    """Wait for `condition` (a generous deadline: the machine may be loaded)."""
    try:
        async with asyncio.timeout(within_s):
            while not condition():  # noqa: ASYNC110 - polling state another thread sets
                await asyncio.sleep(0.005)
    except TimeoutError:
        raise AssertionError(f"not within {within_s} s: {what}") from None


@contextlib.asynccontextmanager
async def running_link(
    client_id: str,
    log_name: str,
    *,
    broker: FakeBroker | None = None,
    hooks: LinkHooks | None = None,
    max_packet: int = MAX_REMAINING_LENGTH,
    pending_limits: tuple[int, int] = (4096, 1 << 40),
    **settings: Any,
) -> AsyncIterator[tuple[MqttLink, FakeBroker]]:
    """The daemon's link (`MqttSettings(**settings)`) running against `broker` (a new
    FakeBroker by default; another broker if `settings` has a `url`); on exit it is stopped
    (within 30 s) and the broker closed."""
    broker = broker or FakeBroker()
    url = settings.pop("url", f"mqtt://127.0.0.1:{broker.port}")
    link = MqttLink(
        MqttSettings(url=url, client_id=client_id, **settings),
        topics=Topics(),
        connection=ConnectionState(),
        hooks=hooks
        or LinkHooks(on_message=lambda *_: None, status_payload=lambda state: state.encode()),
        log=structlog.get_logger(log_name),
        max_packet=max_packet,
        pending_limits=pending_limits,
    )
    stop = asyncio.Event()

    async def farewell() -> None:
        return None

    task = asyncio.create_task(link.run(stop, farewell))
    try:
        yield link, broker
    finally:
        stop.set()
        async with asyncio.timeout(30):
            await task
        broker.close()
