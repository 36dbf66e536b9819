"""The simulator's connection to the broker: a `PahoLink` (paho-mqtt on its own network
thread), each QoS 1 publish awaitable on the event loop until the broker's PUBACK.

paho's public API only (`publish`, `on_publish`; the link's `connect`, `loop_start`).
Acknowledgements reach the event loop through `call_soon_threadsafe`, and a publish registers
its waiter in the same loop turn in which paho hands out its packet id, so an acknowledgement
that arrives before `publish()` returns is not lost. The link does not reconnect: a
simulation whose broker went away ends with `PublishError`, as the commands report it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Self

import paho.mqtt.client as mqtt
from paho.mqtt.enums import MQTTErrorCode

from edgemon.broker_url import Broker
from edgemon.client._mqtt import PahoLink
from edgemon.errors import PublishError

if TYPE_CHECKING:
    from paho.mqtt.properties import Properties
    from paho.mqtt.reasoncodes import ReasonCode

__all__ = ["PublishError", "PublishLink"]

#: How long the broker may take to accept the connection.
CONNECT_TIMEOUT_S = 10.0
#: How long closing may wait for paho's network thread to end.
STOP_TIMEOUT_S = 5.0


class PublishLink:
    """One MQTT 3.1.1 connection, clean session, used from one event loop (`async with`)."""

    def __init__(self, hostname: str, port: int, *, identifier: str | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._link = PahoLink(
            Broker(hostname, port), who="edgemon simulate", client_id=identifier or "",
            on_up=self._on_up, on_down=self._on_down, on_refused=self._on_refused, retry=False,
        )  # fmt: skip
        self._client: mqtt.Client | None = None
        self._accepted: asyncio.Future[None] = self._loop.create_future()
        #: PUBACKs awaited, by packet id; and those that came before their waiter.
        self._waiting: dict[int, asyncio.Future[None]] = {}
        self._early: set[int] = set()
        self._error: PublishError | None = None
        self._closing = False

    async def __aenter__(self) -> Self:
        try:
            self._client = await asyncio.to_thread(self._link.open, self._configure)
        except OSError as exc:
            raise PublishError(f"cannot connect: {exc}") from None
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                await self._accepted
        except BaseException:
            await self._stop()
            raise
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self._stop()

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        """Publish at QoS 1; return once the broker has acknowledged it."""
        if self._error is not None:
            raise self._error
        if self._client is None:
            raise PublishError("not connected")
        info = self._client.publish(topic, payload, qos=1, retain=retain)
        if info.rc not in {MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN}:
            raise PublishError(f"publish to {topic!r} failed: {mqtt.error_string(info.rc)}")
        if info.mid in self._early:
            self._early.discard(info.mid)
            return
        waiter = self._waiting[info.mid] = self._loop.create_future()
        await waiter

    async def _stop(self) -> None:
        self._closing = True
        await asyncio.to_thread(self._link.close, STOP_TIMEOUT_S)

    # paho's network thread calls these; each hands its news to the event loop.

    def _configure(self, client: mqtt.Client) -> None:
        client.on_publish = self._on_publish

    def _on_up(self, _client: mqtt.Client) -> None:
        self._loop.call_soon_threadsafe(self._connected, None)

    def _on_refused(self, why: str) -> None:
        self._loop.call_soon_threadsafe(self._connected, why)

    def _on_down(self, reason: str) -> bool:
        self._loop.call_soon_threadsafe(self._lost, reason)
        return False  # not for the link to log: the commands say it, through PublishError

    def _on_publish(
        self,
        _client: mqtt.Client,
        _userdata: Any,
        mid: int,
        _reason: ReasonCode,
        _properties: Properties | None,
    ) -> None:
        self._loop.call_soon_threadsafe(self._acked, mid)

    # On the event loop.

    def _connected(self, refused: str | None) -> None:
        if self._accepted.done():
            return
        if refused is None:
            self._accepted.set_result(None)
        else:
            self._accepted.set_exception(PublishError(refused))

    def _lost(self, reason: str) -> None:
        if self._closing:
            return
        error = self._error = PublishError(f"the broker went away: {reason}")
        if not self._accepted.done():
            self._accepted.set_exception(error)
        waiting, self._waiting = self._waiting, {}
        for waiter in waiting.values():
            if not waiter.done():
                waiter.set_exception(error)

    def _acked(self, mid: int) -> None:
        waiter = self._waiting.pop(mid, None)
        if waiter is None:
            self._early.add(mid)
        elif not waiter.done():
            waiter.set_result(None)
