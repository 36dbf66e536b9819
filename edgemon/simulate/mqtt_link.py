"""The simulator's connection to the broker: paho-mqtt on its own network thread, each QoS 1
publish awaitable on the event loop until the broker's PUBACK.

paho's public API only (`connect`, `loop_start`, `publish`, `on_publish`). Acknowledgements
reach the event loop through `call_soon_threadsafe`, and a publish registers its waiter in the
same loop turn in which paho hands out its packet id, so an acknowledgement that arrives
before `publish()` returns is not lost. The link does not reconnect: a simulation whose broker
went away ends with `PublishError`, as the commands report it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Self

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode

from edgemon.client._mqtt import stop
from edgemon.errors import PublishError

if TYPE_CHECKING:
    from paho.mqtt.properties import Properties
    from paho.mqtt.reasoncodes import ReasonCode

__all__ = ["PublishError", "PublishLink"]

KEEPALIVE_S = 30
#: How long the broker may take to accept the connection.
CONNECT_TIMEOUT_S = 10.0
#: How long closing may wait for paho's network thread to end.
STOP_TIMEOUT_S = 5.0


class PublishLink:
    """One MQTT 3.1.1 connection, clean session, used from one event loop (`async with`)."""

    def __init__(self, hostname: str, port: int, *, identifier: str | None = None) -> None:
        self._hostname = hostname
        self._port = port
        self._loop = asyncio.get_running_loop()
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=identifier or "",
            clean_session=True,
            protocol=mqtt.MQTTv311,
            reconnect_on_failure=False,
        )
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        self._client = client
        self._accepted: asyncio.Future[None] = self._loop.create_future()
        #: PUBACKs awaited, by packet id; and those that came before their waiter.
        self._waiting: dict[int, asyncio.Future[None]] = {}
        self._early: set[int] = set()
        self._error: PublishError | None = None
        self._closing = False

    async def __aenter__(self) -> Self:
        try:
            await asyncio.to_thread(
                self._client.connect, self._hostname, self._port, keepalive=KEEPALIVE_S
            )
        except OSError as exc:
            raise PublishError(f"cannot connect: {exc}") from None
        self._client.loop_start()
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
        await asyncio.to_thread(stop, self._client, STOP_TIMEOUT_S)

    # paho's network thread calls these; each hands its news to the event loop.

    def _on_connect(
        self,
        _client: mqtt.Client,
        _userdata: Any,
        _flags: mqtt.ConnectFlags,
        reason: ReasonCode,
        _properties: Properties | None,
    ) -> None:
        self._loop.call_soon_threadsafe(self._connected, None if reason == 0 else str(reason))

    def _on_disconnect(
        self,
        _client: mqtt.Client,
        _userdata: Any,
        _flags: mqtt.DisconnectFlags,
        reason: ReasonCode,
        _properties: Properties | None,
    ) -> None:
        self._loop.call_soon_threadsafe(self._lost, str(reason))

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
            self._accepted.set_exception(PublishError(f"the broker refused us: {refused}"))

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
