"""The MQTT link (aiomqtt 2.x): one broker session at a time, re-established forever.

- Client id fixed, persistent session (clean session off, MQTT 3.1.1) so the broker queues
  what devices send while edgemon is away; the last will is the retained `offline` status.
- On every connect: retained `online` status, then subscribe `P/+/events` and `P/+/engine`
  (as `$share/<group>/...` when a shared group is configured), then messages flow.
- A lost session is re-established with jittered exponential backoff capped at 30 s; nothing
  of the engine's state is touched.
- Incoming messages are applied as they are read and acknowledged once durable (`intake`):
  flow control by TCP backpressure, nothing shed; on MQTT 5 a Receive Maximum is declared.
- A session that keeps ending right after it began (another instance with the same client id
  takes it over, and is taken over in turn) is reported, and reconnecting backs off.
"""

from __future__ import annotations

import asyncio
import random
import socket
import ssl
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edgemon.daemon.intake import PENDING_BYTES, PENDING_MESSAGES, Intake
from edgemon.daemon.publisher import PublishError
from edgemon.settings import ConfigError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from edgemon.adapters.state import ConnectionState
    from edgemon.settings import MqttSettings
    from edgemon.wire.topics import Topics

PUBLISH_TIMEOUT_S = 5.0
#: MQTT 5: QoS 1 messages the broker may have out to edgemon unacknowledged at once.
RECEIVE_MAXIMUM = 256
#: A session that lasted less than this is not proof that the broker is reachable for good:
#: the backoff is not reset, and a run of them is reported as a likely takeover.
STABLE_SESSION_S = 60.0
#: So many short sessions in a row, each lost without our asking: report a takeover.
TAKEOVER_STREAK = 3
#: MQTT 5 DISCONNECT reason code "Session taken over".
SESSION_TAKEN_OVER = 142


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


@dataclass(frozen=True, slots=True)
class LinkHooks:
    """What the link calls back into: the daemon's side of the session."""

    #: One message (topic, payload), in arrival order; must not block.
    on_message: Callable[[str, bytes], None]
    #: The status payload for `online` / `offline`, built when needed.
    status_payload: Callable[[str], bytes]
    #: Subscriptions acknowledged (every session).
    on_subscribed: Callable[[], None] = lambda: None
    #: CONNACK received, before any message of the session is read (every session).
    on_connected: Callable[[], None] = lambda: None
    #: The session is gone (or never came up): no message can arrive until `on_connected`.
    on_disconnected: Callable[[], None] = lambda: None
    #: Call the callback once every message given to `on_message` so far is durable.
    when_durable: Callable[[Callable[[], None]], None] = lambda callback: callback()


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
        pending_limits: tuple[int, int] = (PENDING_MESSAGES, PENDING_BYTES),
    ) -> None:
        self._settings = settings
        self._status_topic = topics.status(settings.client_id)
        self._filters = subscriptions(topics, shared_group=settings.shared_group)
        self.connection = connection
        self._on_subscribed = hooks.on_subscribed
        self._on_connected = hooks.on_connected
        self._on_disconnected = hooks.on_disconnected
        self._status_payload = hooks.status_payload
        self._log = log
        self._backoff = backoff or Backoff()
        self._connected = asyncio.Event()
        #: Set when the current session ends: publishes waiting for an ack give up at once.
        self._lost = asyncio.Event()
        self._client: aiomqtt.Client | None = None
        self.intake = Intake(
            hooks.on_message, when_durable=hooks.when_durable, pending_limits=pending_limits
        )
        self._sessions = 0
        #: Sessions in a row that the broker ended soon after they began.
        self._short_sessions = 0

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
            timeout=10,
        )
        paho_client = client._client  # noqa: SLF001 - aiomqtt 2 exposes no message callback
        # Every message goes straight to the intake, which acknowledges it once applied and
        # durable; a crash before that leaves it unacknowledged, and the broker delivers it
        # again. Set before connecting: a persistent session's queue comes right after CONNACK.
        self.intake.attach(paho_client)
        connected = paho_client.on_connect
        assert connected is not None  # aiomqtt's

        def on_connect(*args: Any) -> None:
            # args: client, userdata, flags, reason code, properties (paho's VERSION2)
            if not args[3].is_failure:
                self._on_connected()  # before the first message of the session is read
            connected(*args)

        paho_client.on_connect = on_connect
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
        if not sending.done() or sending.cancelled():  # cancelled just now, or before
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
        persistent = self._settings.persistent_session
        while not stop.is_set():
            # A fresh client per session: aiomqtt 2.5 does not reset its connection future
            # after an unexpected disconnect, so a reused client can report "connected"
            # before the broker's CONNACK. The password file is read again on each attempt.
            began: float | None = None
            try:
                self._client = client = self._new_client()
                async with client:
                    began = time.monotonic()
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
                if began is not None:
                    self._session_lost(time.monotonic() - began, exc)
            finally:
                self.intake.end(persistent=persistent)
                self._down()
            if stop.is_set():
                return
            delay = self._backoff.next_delay()
            self._log.info("mqtt_reconnect_scheduled", delay_s=round(delay, 3))
            try:
                async with asyncio.timeout(delay):
                    await stop.wait()
            except TimeoutError:
                pass

    def _session_lost(self, lasted_s: float, error: aiomqtt.MqttError) -> None:
        """A session the broker ended: a stable one resets the backoff; a run of short ones
        is what two instances sharing a client id do to each other, and is reported."""
        if lasted_s >= STABLE_SESSION_S:
            self._short_sessions = 0
            self._backoff.reset()
            return
        self._short_sessions += 1
        taken_over = getattr(error, "rc", None) == SESSION_TAKEN_OVER
        if taken_over or self._short_sessions >= TAKEOVER_STREAK:
            self._log.error(
                "mqtt_session_taken_over",
                client_id=self._settings.client_id,
                sessions_lost=self._short_sessions,
                lasted_s=round(lasted_s, 3),
                cause="the broker reported the session taken over"
                if taken_over
                else "sessions keep ending right after they begin: another client is "
                "probably connecting with the same client id",
                fix="give every edgemon instance its own [mqtt] client_id",
            )

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
        disconnected = client._disconnected  # noqa: SLF001 - aiomqtt's end-of-session future

        def fail(exc: BaseException) -> None:
            if not disconnected.done():
                disconnected.set_exception(exc)

        self.intake.begin(fail, persistent=self._settings.persistent_session)
        await client.publish(self._status_topic, self._status_payload("online"), qos=1, retain=True)
        qos = self._settings.qos
        await client.subscribe([(topic, qos) for topic in self._filters])
        self.connection.subscribed = True
        if self._sessions == 1:
            self._backoff.reset()
        self._log.info("mqtt_subscribed", broker=self._settings.url, topics=self._filters)
        self._on_subscribed()
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait((disconnected, stopped), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if disconnected.done():
            error = disconnected.exception()
            raise aiomqtt.MqttError("disconnected") if error is None else _as_mqtt_error(error)
        self.connection.subscribed = False  # intake stops here: no more messages are taken
        await self.intake.settle()  # what was applied is durable and acknowledged
        await farewell()

    def _down(self) -> None:
        self._connected.clear()
        self._lost.set()
        self.connection.connected = False
        self.connection.subscribed = False
        self._on_disconnected()


def _as_mqtt_error(error: BaseException) -> aiomqtt.MqttError:
    if isinstance(error, aiomqtt.MqttError):
        return error
    return aiomqtt.MqttError(f"connection lost ({error!r})")


def session_options(settings: MqttSettings) -> dict[str, Any]:
    """How the broker keeps our session: clean session off on 3.1.1; on MQTT 5, no clean
    start and a session expiry (0 when the session is not meant to persist)."""
    if settings.protocol == "5":
        properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        properties.SessionExpiryInterval = (
            settings.session_expiry_s if settings.persistent_session else 0
        )
        # Flow control: at most this many unacknowledged QoS 1 messages out to us at once.
        properties.ReceiveMaximum = RECEIVE_MAXIMUM
        return {
            "protocol": aiomqtt.ProtocolVersion.V5,
            "clean_start": not settings.persistent_session,
            "properties": properties,
        }
    return {
        "protocol": aiomqtt.ProtocolVersion.V311,
        "clean_session": not settings.persistent_session,
    }
