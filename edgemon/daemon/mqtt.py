"""The MQTT link (aiomqtt 2.x): one broker session at a time, re-established forever.

- Client id fixed, persistent session (clean session off, MQTT 3.1.1) so the broker queues
  what devices send while edgemon is away; the last will is the retained `offline` status.
- On every connect: retained `online` status, then subscribe `P/+/events` and `P/+/engine`
  (as `$share/<group>/...` when a shared group is configured), then messages flow.
- A lost session is re-established with jittered exponential backoff capped at 30 s; nothing
  of the engine's state is touched, the same client (and its queue) is reused.
- Incoming messages wait in a queue bounded in count and bytes between the network and the
  engine; beyond it a message is dropped and reported (`on_drop`) instead of growing memory.
"""

from __future__ import annotations

import asyncio
import random
import socket
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edgemon.daemon.publisher import PublishError
from edgemon.settings import ConfigError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from edgemon.adapters.state import ConnectionState
    from edgemon.settings import MqttSettings
    from edgemon.wire.topics import Topics

#: Incoming messages waiting for the engine: at most this many, and this many payload bytes.
QUEUE_MESSAGES = 4096
QUEUE_BYTES = 16 * 1024 * 1024
PUBLISH_TIMEOUT_S = 5.0


class Backoff:
    """Exponential delays with jitter: `min(cap, first × 2^n) × uniform(0.5, 1)`."""

    __slots__ = ("_attempt", "_cap_s", "_first_s", "_random")

    def __init__(
        self, *, first_s: float = 0.5, cap_s: float = 30.0, rng: random.Random | None = None
    ) -> None:
        self._first_s = first_s
        self._cap_s = cap_s
        self._attempt = 0
        self._random = rng or random.Random()  # noqa: S311 - jitter, not cryptography

    def next_delay(self) -> float:
        """The delay before the next attempt (grows until the cap)."""
        base = min(self._cap_s, self._first_s * 2.0 ** min(self._attempt, 30))
        self._attempt += 1
        return base * self._random.uniform(0.5, 1.0)

    def reset(self) -> None:
        """After a successful session: start again from the first delay."""
        self._attempt = 0


def tls_context(settings: MqttSettings) -> ssl.SSLContext | None:
    """The client TLS context for `mqtts://` (CA file or system CAs, optional client cert)."""
    if not settings.broker.tls:
        return None
    cafile = None if settings.ca_file is None else str(settings.ca_file)
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile)
    if settings.cert_file is not None and settings.key_file is not None:
        context.load_cert_chain(str(settings.cert_file), str(settings.key_file))
    return context


def subscriptions(topics: Topics, *, shared_group: str | None) -> list[str]:
    """The topic filters to subscribe to."""
    share = "" if shared_group is None else f"$share/{shared_group}/"
    return [share + topic for topic in topics.subscriptions]


def _bounded_queue(
    on_create: Callable[[asyncio.Queue[aiomqtt.Message]], None],
    on_drop: Callable[[aiomqtt.Message], None],
    max_messages: int,
    max_bytes: int,
) -> type[asyncio.Queue[aiomqtt.Message]]:
    """An asyncio queue class bounded in messages and payload bytes, reporting what it drops."""

    class BoundedQueue(asyncio.Queue[aiomqtt.Message]):
        def __init__(self, maxsize: int = 0) -> None:
            super().__init__(maxsize)
            self.payload_bytes = 0
            on_create(self)

        def put_nowait(self, item: aiomqtt.Message) -> None:
            size = _size(item.payload)
            if self.qsize() >= max_messages or self.payload_bytes + size > max_bytes:
                on_drop(item)
                return
            self.payload_bytes += size
            super().put_nowait(item)

        def get_nowait(self) -> aiomqtt.Message:
            item = super().get_nowait()
            self.payload_bytes -= _size(item.payload)
            return item

    return BoundedQueue


def _size(payload: object) -> int:
    return len(payload) if isinstance(payload, bytes | bytearray | str) else 8


@dataclass(frozen=True, slots=True)
class LinkHooks:
    """What the link calls back into: the daemon's side of the session."""

    #: One message (topic, payload), in arrival order; must not block.
    on_message: Callable[[str, bytes], None]
    #: A message dropped because the incoming queue was full (its topic).
    on_drop: Callable[[str], None]
    #: The status payload for `online` / `offline`, built when needed.
    status_payload: Callable[[str], bytes]
    #: Subscriptions acknowledged (every session).
    on_subscribed: Callable[[], None] = lambda: None


class MqttLink:
    """The broker session: messages in to `hooks`, publishes out, state in `connection`."""

    def __init__(
        self,
        settings: MqttSettings,
        *,
        topics: Topics,
        connection: ConnectionState,
        hooks: LinkHooks,
        log: Any,
        backoff: Backoff | None = None,
        queue_limits: tuple[int, int] = (QUEUE_MESSAGES, QUEUE_BYTES),
    ) -> None:
        self._settings = settings
        self._status_topic = topics.status(settings.client_id)
        self._filters = subscriptions(topics, shared_group=settings.shared_group)
        self.connection = connection
        self._on_message = hooks.on_message
        self._on_subscribed = hooks.on_subscribed
        self._status_payload = hooks.status_payload
        self._log = log
        self._backoff = backoff or Backoff()
        self._connected = asyncio.Event()
        #: Set when the current session ends: publishes waiting for an ack give up at once.
        self._lost = asyncio.Event()
        self._client: aiomqtt.Client | None = None
        self._queue_messages, queue_bytes = queue_limits
        on_drop = hooks.on_drop
        self._queue: asyncio.Queue[aiomqtt.Message] | None = None
        self._queue_type = _bounded_queue(
            self._adopt_queue,
            lambda message: self._shed(message, on_drop),
            self._queue_messages,
            queue_bytes,
        )
        self._sessions = 0

    def _new_client(self) -> aiomqtt.Client:
        settings = self._settings
        broker = settings.broker
        password = settings.resolve_password()
        client = aiomqtt.Client(
            broker.host,
            broker.port,
            identifier=settings.client_id,
            username=settings.username,
            password=None if password is None else password.get_secret_value(),
            keepalive=settings.keepalive_s,
            # A throttle object must not wait behind the PUBACK just written for the chunk
            # that caused it: Nagle's algorithm would hold it for the broker's delayed ACK,
            # about 40 ms (measured by benchmarks/ingest.py).
            socket_options=((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),),
            **session_options(settings),
            will=aiomqtt.Will(
                self._status_topic, self._status_payload("offline"), qos=1, retain=True
            ),
            tls_context=tls_context(settings),
            queue_type=self._queue_type,
            max_queued_incoming_messages=self._queue_messages + 1,
            timeout=10,
        )
        # Acknowledge each message only once the engine has applied it (before any message
        # can arrive: a persistent session's queue comes right after CONNACK). A crash before
        # that leaves it unacknowledged, and the broker delivers it again to the next session.
        client._client.manual_ack_set(on=True)  # noqa: SLF001 - paho's API; aiomqtt 2 has none
        return client

    # ------------------------------------------------------------------ out
    async def wait_connected(self) -> None:
        """Return once a session is up (subscribed or not)."""
        await self._connected.wait()

    async def publish(self, topic: str, payload: bytes, *, qos: int, retain: bool) -> None:
        """Publish now; PublishError when there is no session, it is lost meanwhile, or the
        broker does not acknowledge in time (the caller sends again on the next session)."""
        client = self._client
        if client is None or not self._connected.is_set():
            raise PublishError("not connected")
        sending = asyncio.ensure_future(
            client.publish(topic, payload, qos=qos, retain=retain, timeout=PUBLISH_TIMEOUT_S)
        )
        lost = asyncio.ensure_future(self._lost.wait())
        try:
            await asyncio.wait((sending, lost), return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            if not sending.done():
                sending.cancel()
        if sending.cancelled():
            raise PublishError("session lost before the broker acknowledged")
        error = sending.exception()
        if error is not None:
            raise PublishError(str(error)) from error

    # ------------------------------------------------------------------ in
    async def run(self, stop: asyncio.Event, farewell: Callable[[], Awaitable[None]]) -> None:
        """Keep a session up until `stop`; then await `farewell()` while still connected.

        This is the `mqtt-ingest` task: it returns after a clean disconnect once `stop` is
        set (the farewell is skipped when no session is up at that moment).
        """
        while not stop.is_set():
            # A fresh client per session: aiomqtt 2.5 does not reset its connection future
            # after an unexpected disconnect, so a reused client can report "connected"
            # before the broker's CONNACK. The password file is read again on each attempt.
            try:
                self._client = client = self._new_client()
                async with client:
                    await self._session(client, stop, farewell)
            except ConfigError as exc:
                # A password file missing or empty right now (being rotated, say): a failed
                # attempt like any other, tried again after the backoff.
                self._log.warning("mqtt_credentials_unreadable", problems=list(exc.problems))
            except aiomqtt.MqttError as exc:
                self._log.warning(
                    "mqtt_disconnected" if self._sessions else "mqtt_connect_failed",
                    broker=self._settings.url,
                    error=str(exc),
                )
            finally:
                self._down()
            if stop.is_set():
                return
            self._drain()
            delay = self._backoff.next_delay()
            self._log.info("mqtt_reconnect_scheduled", delay_s=round(delay, 3))
            try:
                async with asyncio.timeout(delay):
                    await stop.wait()
            except TimeoutError:
                pass

    async def _session(
        self,
        client: aiomqtt.Client,
        stop: asyncio.Event,
        farewell: Callable[[], Awaitable[None]],
    ) -> None:
        self._sessions += 1
        if self._sessions > 1:
            self.connection.reconnects += 1
        self.connection.connected = True
        self._lost.clear()
        self._connected.set()
        await client.publish(self._status_topic, self._status_payload("online"), qos=1, retain=True)
        qos = self._settings.qos
        await client.subscribe([(topic, qos) for topic in self._filters])
        self.connection.subscribed = True
        self._backoff.reset()
        self._log.info("mqtt_subscribed", broker=self._settings.url, topics=self._filters)
        self._on_subscribed()
        pump = asyncio.create_task(self._pump(client), name="mqtt-pump")
        stopped = asyncio.create_task(stop.wait(), name="mqtt-stop")
        try:
            await asyncio.wait((pump, stopped), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (pump, stopped):
                task.cancel()
            await asyncio.gather(pump, stopped, return_exceptions=True)
        if not pump.cancelled() and pump.exception() is not None:
            raise pump.exception()  # type: ignore[misc]
        self.connection.subscribed = False  # intake stops here: no more messages are taken
        await farewell()

    async def _pump(self, client: aiomqtt.Client) -> None:
        deliver = self._deliver
        ack = client._client.ack  # noqa: SLF001 - paho's manual acknowledgement
        async for message in client.messages:
            deliver(message)
            if message.qos:
                ack(message.mid, message.qos)

    def _shed(self, message: aiomqtt.Message, on_drop: Callable[[str], None]) -> None:
        """A message the full queue cannot take: reported, and acknowledged all the same —
        shed on purpose, it must not hold one of the broker's in-flight slots forever."""
        on_drop(message.topic.value)
        client = self._client
        if client is not None and message.qos:
            client._client.ack(message.mid, message.qos)  # noqa: SLF001

    def _deliver(self, message: aiomqtt.Message) -> None:
        payload = message.payload
        if not isinstance(payload, bytes):  # paho always gives bytes; the type says more
            payload = b"" if payload is None else str(payload).encode()
        self._on_message(message.topic.value, payload)

    def _adopt_queue(self, queue: asyncio.Queue[aiomqtt.Message]) -> None:
        self._queue = queue

    def _drain(self) -> None:
        """Messages the lost session had received (and acknowledged) still go to the engine."""
        queue = self._queue
        while queue is not None and not queue.empty():
            self._deliver(queue.get_nowait())

    def _down(self) -> None:
        self._connected.clear()
        self._lost.set()
        self.connection.connected = False
        self.connection.subscribed = False


def session_options(settings: MqttSettings) -> dict[str, Any]:
    """How the broker keeps our session: clean session off on 3.1.1; on MQTT 5, no clean
    start and a session expiry (0 when the session is not meant to persist)."""
    if settings.protocol == "5":
        properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        properties.SessionExpiryInterval = (
            settings.session_expiry_s if settings.persistent_session else 0
        )
        return {
            "protocol": aiomqtt.ProtocolVersion.V5,
            "clean_start": not settings.persistent_session,
            "properties": properties,
        }
    return {
        "protocol": aiomqtt.ProtocolVersion.V311,
        "clean_session": not settings.persistent_session,
    }
