"""The MQTT link: one broker connection at a time, re-established forever, for one session.

Built on asyncio's public transport API (`loop.create_connection`, an `asyncio.Protocol`, TLS
by the `ssl` module) and a small codec of the packets edgemon uses (`mqtt_codec`), not on an
MQTT client library: see the README's "The MQTT link" for why.

- Client id fixed, persistent session (clean session off, MQTT 3.1.1) so the broker queues
  what devices send while edgemon is away; the last will is the retained `offline` status.
- On every connect: retained `online` status, then subscribe `P/+/events`, `P/+/engine` and
  `P/+/capacity` (with `[mqtt] devices`, each listed device's topics only), then messages flow.
- A lost connection is re-established with jittered exponential backoff capped at 30 s;
  nothing of the engine's state is touched. A broker gone silent is noticed within 1.5
  keep-alives (`mqtt_session`).
- What the broker says is heard: a reconnection whose CONNACK says it kept no session (what
  was queued for edgemon is gone) is logged and counted; a grant below the QoS asked for
  (SUBACK, or MQTT 5's Maximum QoS) is an error and `/readyz` says "degraded"; a refused
  subscription is an error and a count, and the session is tried again; a broker without
  retained messages (MQTT 5's Retain Available 0) is refused.
- Incoming messages are applied as they are read and acknowledged once durable (`intake`):
  flow control by TCP backpressure, nothing shed; on MQTT 5 a Receive Maximum is declared.
- A session that keeps ending right after it began (another instance with the same client id
  takes it over, and is taken over in turn) is reported, and reconnecting backs off.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from edgemon.daemon import mqtt_codec as codec
from edgemon.daemon.intake import PENDING_BYTES, PENDING_MESSAGES, Intake
from edgemon.daemon.mqtt_codec import Connack, ConnectRequest, Will
from edgemon.daemon.mqtt_connection import Connection
from edgemon.daemon.mqtt_terms import BrokerUnsuitableError, Terms, refusal
from edgemon.errors import ConnectionLostError, NotSendableError, PublishError
from edgemon.settings import ConfigError

#: A device's topics edgemon reads.
KINDS = ("events", "engine", "capacity")

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from edgemon.adapters.connection_state import ConnectionState
    from edgemon.settings import MqttSettings
    from edgemon.wire.topics import Topics

T = TypeVar("T")

#: TCP connect, TLS handshake and CONNACK, at most.
CONNECT_TIMEOUT_S = 10.0
#: MQTT 5: QoS 1 messages the broker may have out to edgemon unacknowledged at once.
RECEIVE_MAXIMUM = 256
#: A session that lasted less than this is not proof that the broker is reachable for good:
#: the backoff is not reset, and a run of them is reported as a likely takeover.
STABLE_SESSION_S = 60.0
#: So many short sessions in a row, each lost without our asking: report a takeover.
TAKEOVER_STREAK = 3
#: MQTT 5 DISCONNECT reason code "Session taken over".
SESSION_TAKEN_OVER = 142
#: Room in a packet beyond its payload: fixed header, topic (up to 1 KiB of prefix and the
#: device id), packet id and MQTT 5 properties (`max_packet_size`).
PACKET_OVERHEAD = 4096


def max_packet_size(max_payload_bytes: int) -> int:
    """The largest packet edgemon reads: a little above the largest payload it accepts
    (`[limits] max_payload_bytes`), so every message it would apply fits."""
    return max_payload_bytes + PACKET_OVERHEAD


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


def subscriptions(topics: Topics, *, devices: tuple[str, ...] | None) -> list[str]:
    """The topic filters to subscribe to: every device's (`P/+/events`, `P/+/engine`,
    `P/+/capacity`), or with `devices` only theirs (`P/<device>/events`, ...)."""
    if devices is None:
        return list(topics.subscriptions)
    return [topics.prefix + f"/{device}/{kind}" for device in devices for kind in KINDS]


@dataclass(frozen=True, slots=True)
class LinkHooks:
    """What the link calls back into: the daemon's side of the connection."""

    #: One message (topic, payload), in arrival order; must not block.
    on_message: Callable[[str, bytes], None]
    #: The status payload for `online` / `offline`, built when needed.
    status_payload: Callable[[str], bytes]
    #: Subscriptions acknowledged (every connection).
    on_subscribed: Callable[[], None] = lambda: None
    #: CONNACK received, before any message of the connection is read (every connection).
    on_connected: Callable[[], None] = lambda: None
    #: The connection is gone (or never came up): no message can arrive until `on_connected`.
    on_disconnected: Callable[[], None] = lambda: None
    #: Call the callback once every message given to `on_message` so far is durable.
    when_durable: Callable[[Callable[[], None]], None] = lambda callback: callback()
    #: A message too large to read (topic, packet size), dropped unread (MQTT 3.1.1).
    on_too_large: Callable[[str, int], None] = lambda _topic, _size: None


class MqttLink:
    """The broker link: messages in to `hooks`, publishes out, state in `connection`."""

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
        max_packet: int = codec.MAX_REMAINING_LENGTH,
    ) -> None:
        self._settings = settings
        self._status_topic = topics.status(settings.client_id)
        self._filters = subscriptions(topics, devices=settings.devices)
        #: With a device list: the wildcard filters an earlier configuration of this persistent
        #: session may have left on the broker, dropped on every connect.
        self._stale = [] if settings.devices is None else list(topics.subscriptions)
        self.connection = connection
        self._on_subscribed = hooks.on_subscribed
        self._on_connected = hooks.on_connected
        self._on_disconnected = hooks.on_disconnected
        self._status_payload = hooks.status_payload
        self._log = log
        self._backoff = backoff or Backoff()
        self._connected = asyncio.Event()
        self._conn: Connection | None = None
        #: The largest packet read from the broker (declared to it on MQTT 5).
        self._max_packet = max_packet
        self.intake = Intake(
            hooks.on_message, when_durable=hooks.when_durable, pending_limits=pending_limits,
            topics=None if settings.devices is None else frozenset(self._filters),
            too_large=hooks.on_too_large,
        )  # fmt: skip
        self._sessions = 0
        #: Sessions in a row that the broker ended soon after they began.
        self._short_sessions = 0
        #: What the broker granted that edgemon reports once (`mqtt_terms`).
        self._terms = Terms(log, connection)

    async def _connect(self) -> Connection:
        """A new connection, CONNECT sent and CONNACK accepted; ConnectionLostError (or OSError,
        for TCP and TLS) if not."""
        settings = self._settings
        broker = settings.broker
        request = connect_request(
            settings, self._status_payload("offline"), self._status_topic,
            max_packet=self._max_packet,
        )  # fmt: skip
        persistent = settings.persistent_session
        terms = self._terms

        def accepted(conn: Connection, connack: Connack) -> None:
            # Before the first message is handled: a persistent session's queue comes right
            # after CONNACK.
            terms.accepted(connack, persistent=persistent, reconnection=self._sessions > 0)
            self._on_connected()
            self.intake.begin(conn, persistent=persistent)

        conn = Connection(self.intake, request, on_accepted=accepted, max_packet=self._max_packet)
        context = tls_context(settings)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                await loop.create_connection(
                    lambda: conn, broker.host, broker.port, ssl=context,
                    server_hostname=broker.host if context is not None else None,
                )  # fmt: skip
                connack = await conn.connack
        except TimeoutError:
            conn.fail(ConnectionLostError("no CONNACK in time"))
            waited = f"{CONNECT_TIMEOUT_S:g} s"
            raise ConnectionLostError(f"no answer from the broker within {waited}") from None
        except BaseException:
            conn.fail(ConnectionLostError("connection abandoned"))
            raise
        if connack.refused:
            conn.fail(ConnectionLostError("refused"))
            raise refusal(connack, version=request.version)
        return conn

    # ------------------------------------------------------------------ out
    async def wait_connected(self) -> None:
        """Return once a connection is up (subscribed or not)."""
        await self._connected.wait()

    async def publish(self, topic: str, payload: bytes, *, qos: int, retain: bool) -> None:
        """Publish now; PublishError when there is no connection, it is lost meanwhile (a
        PUBACK not in time ends it), or the broker refuses (the caller sends again on the next
        connection)."""
        conn = self._conn
        if conn is None or not self._connected.is_set():
            raise PublishError("not connected")
        try:
            code = await conn.publish(topic, payload, qos=qos, retain=retain)
        except ConnectionLostError as exc:
            raise PublishError(f"connection lost before the broker acknowledged ({exc})") from exc
        except NotSendableError as exc:
            raise PublishError(str(exc)) from exc
        if code >= 0x80:
            raise PublishError(f"refused: {codec.reason_text(code, version=codec.V5)}")

    # ------------------------------------------------------------------ in
    async def run(self, stop: asyncio.Event, farewell: Callable[[], Awaitable[None]]) -> None:
        """Keep a connection up until `stop`; then await `farewell()` while still connected.

        This is the `mqtt-ingest` task: it returns after a clean disconnect once `stop` is
        set (the farewell is skipped when no connection is up at that moment). A connection
        attempt under way when `stop` comes is abandoned at once.
        """
        persistent = self._settings.persistent_session
        terms = self._terms
        while not stop.is_set():
            began: float | None = None
            try:
                conn = await _unless_stopped(self._connect(), stop)
                if conn is None:
                    return
                self._conn = conn
                began = time.monotonic()
                try:
                    await self._connection_up(conn, stop, farewell)
                finally:
                    await conn.close()
            except ConfigError as exc:
                # A password file missing or empty right now (being rotated, say): a failed
                # attempt like any other, tried again after the backoff.
                self._log.warning("mqtt_credentials_unreadable", problems=list(exc.problems))
            except BrokerUnsuitableError as exc:
                terms.unsuitable(exc, broker=self._settings.url)
            except (ConnectionLostError, OSError) as exc:
                self._log.warning(
                    "mqtt_disconnected" if self._sessions else "mqtt_connect_failed",
                    broker=self._settings.url,
                    error=str(exc),
                )
                if began is not None:
                    self._session_lost(time.monotonic() - began, exc)
            finally:
                self._conn = None
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

    def _session_lost(self, lasted_s: float, error: Exception) -> None:
        """A session the broker ended: a stable one resets the backoff; a run of short ones
        is what two instances sharing a client id do to each other, and is reported."""
        if lasted_s >= STABLE_SESSION_S:
            self._short_sessions = 0
            self._backoff.reset()
            return
        self._short_sessions += 1
        taken_over = getattr(error, "reason", None) == SESSION_TAKEN_OVER
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

    async def _connection_up(
        self, conn: Connection, stop: asyncio.Event, farewell: Callable[[], Awaitable[None]]
    ) -> None:
        self._sessions += 1
        if self._sessions > 1:
            self.connection.reconnects += 1
        self.connection.connected = True
        self._connected.set()
        online = self._status_payload("online")
        await _or_ended(conn.publish(self._status_topic, online, qos=1, retain=True), conn)
        if self._stale:
            await _or_ended(conn.unsubscribe(self._stale), conn)
        qos = self._settings.qos
        granted = await _or_ended(conn.subscribe([(t, qos) for t in self._filters]), conn)
        codes = [*granted, *[0x80] * (len(self._filters) - len(granted))]
        refused = [f for f, code in zip(self._filters, codes, strict=False) if code >= 0x80]
        if refused:
            self._terms.refused(refused, broker=self._settings.url)
            raise ConnectionLostError(f"subscription refused by the broker: {refused}")
        self._terms.granted(self._filters, granted, asked=qos, max_qos=conn.max_qos)
        self.connection.subscribed = True
        if self._sessions == 1:
            self._backoff.reset()
        self._log.info("mqtt_subscribed", broker=self._settings.url, topics=self._filters)
        self._on_subscribed()
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait((conn.ended, stopped), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if conn.ended.done():
            raise _lost(conn.ended.result())
        self.connection.subscribed = False  # intake stops here: no more messages are taken
        await self.intake.drain()  # what was applied is durable and acknowledged
        await farewell()

    def _down(self) -> None:
        self._connected.clear()
        self.connection.connected = False
        self.connection.subscribed = False
        self._on_disconnected()


async def _unless_stopped(
    connecting: Awaitable[Connection], stop: asyncio.Event
) -> Connection | None:
    """The connection `connecting` brings up, or None if `stop` comes first (then abandoned)."""
    attempt = asyncio.ensure_future(connecting)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((attempt, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if attempt.done():
        return attempt.result()
    attempt.cancel()
    with contextlib.suppress(asyncio.CancelledError, ConnectionLostError, OSError):
        await attempt
    return None


async def _or_ended(step: Awaitable[T], conn: Connection) -> T:
    """`step`'s result, or the connection's end as an exception if that comes first."""
    doing = asyncio.ensure_future(step)
    try:
        await asyncio.wait((doing, conn.ended), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not doing.done():
            doing.cancel()
    if doing.done() and not doing.cancelled():
        return doing.result()
    raise _lost(conn.ended.result())


def _lost(error: BaseException | None) -> ConnectionLostError:
    if isinstance(error, ConnectionLostError):
        return error
    return ConnectionLostError("disconnected" if error is None else f"connection lost ({error!r})")


def connect_request(
    settings: MqttSettings,
    offline: bytes,
    status_topic: str,
    *,
    max_packet: int = codec.MAX_REMAINING_LENGTH,
) -> ConnectRequest:
    """CONNECT for `settings`: the retained `offline` status as the will; how the broker keeps
    our session: clean session off on 3.1.1; on MQTT 5, no clean start and a session expiry
    (0 when the session is not meant to persist), a Receive Maximum and a Maximum Packet
    Size (`max_packet`)."""
    password = settings.resolve_password()
    v5 = settings.protocol == "5"
    persistent = settings.persistent_session
    return ConnectRequest(
        client_id=settings.client_id,
        keepalive_s=settings.keepalive_s,
        clean=not persistent,
        version=codec.V5 if v5 else codec.V311,
        username=settings.username,
        password=None if password is None else password.get_secret_value().encode(),
        will=Will(status_topic, offline, qos=1, retain=True),
        session_expiry_s=settings.session_expiry_s if persistent else 0,
        # Flow control: at most this many unacknowledged QoS 1 messages out to us at once.
        receive_maximum=RECEIVE_MAXIMUM if v5 else None,
        # The broker sends nothing larger: it drops such a message for edgemon instead.
        maximum_packet_size=max_packet if v5 else None,
    )
