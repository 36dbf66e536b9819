"""The MQTT link: one broker session at a time, re-established forever.

Built on asyncio's public transport API (`loop.create_connection`, an `asyncio.Protocol`, TLS
by the `ssl` module) and a small codec of the packets edgemon uses (`mqtt_codec`), not on an
MQTT client library: see the README's "The MQTT link" for why.

- Client id fixed, persistent session (clean session off, MQTT 3.1.1) so the broker queues
  what devices send while edgemon is away; the last will is the retained `offline` status.
- On every connect: retained `online` status, then subscribe `P/+/events`, `P/+/engine` and
  `P/+/capacity` (with `[mqtt] devices`, each listed device's topics only), then messages flow.
- A lost session is re-established with jittered exponential backoff capped at 30 s; nothing
  of the engine's state is touched.
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
from edgemon.daemon.mqtt_session import Session, SessionLostError
from edgemon.daemon.publisher import PublishError
from edgemon.settings import ConfigError

#: A device's topics edgemon reads.
KINDS = ("events", "engine", "capacity")

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from edgemon.adapters.state import ConnectionState
    from edgemon.settings import MqttSettings
    from edgemon.wire.topics import Topics

T = TypeVar("T")

PUBLISH_TIMEOUT_S = 5.0
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
        self._session: Session | None = None
        self.intake = Intake(
            hooks.on_message, when_durable=hooks.when_durable, pending_limits=pending_limits,
            topics=None if settings.devices is None else frozenset(self._filters),
        )  # fmt: skip
        self._sessions = 0
        #: Sessions in a row that the broker ended soon after they began.
        self._short_sessions = 0

    async def _connect(self) -> Session:
        """A new connection, CONNECT sent and CONNACK accepted; SessionLostError (or OSError, for
        TCP and TLS) if not."""
        settings = self._settings
        broker = settings.broker
        request = connect_request(settings, self._status_payload("offline"), self._status_topic)
        persistent = settings.persistent_session

        def accepted(session: Session, _connack: Connack) -> None:
            # Before the first message of the session is handled: a persistent session's
            # queue comes right after CONNACK.
            self._on_connected()
            self.intake.begin(session, persistent=persistent)

        session = Session(
            self.intake, version=request.version, keepalive_s=request.keepalive_s,
            on_accepted=accepted,
        )  # fmt: skip
        context = tls_context(settings)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                await loop.create_connection(
                    lambda: session, broker.host, broker.port, ssl=context,
                    server_hostname=broker.host if context is not None else None,
                )  # fmt: skip
                session.write(codec.connect(request))
                connack = await session.connack
        except TimeoutError:
            session.fail(SessionLostError("no CONNACK in time"))
            waited = f"{CONNECT_TIMEOUT_S:g} s"
            raise SessionLostError(f"no answer from the broker within {waited}") from None
        except BaseException:
            session.fail(SessionLostError("connection abandoned"))
            raise
        if connack.refused:
            session.fail(SessionLostError("refused"))
            text = codec.reason_text(connack.code, version=request.version)
            raise SessionLostError(f"connection refused: {text}", reason=connack.code)
        return session

    # ------------------------------------------------------------------ out
    async def wait_connected(self) -> None:
        """Return once a session is up (subscribed or not)."""
        await self._connected.wait()

    async def publish(self, topic: str, payload: bytes, *, qos: int, retain: bool) -> None:
        """Publish now; PublishError when there is no session, it is lost meanwhile, or the
        broker does not acknowledge in time (the caller sends again on the next session)."""
        session = self._session
        if session is None or not self._connected.is_set():
            raise PublishError("not connected")
        try:
            async with asyncio.timeout(PUBLISH_TIMEOUT_S):
                code = await session.publish(topic, payload, qos=qos, retain=retain)
        except TimeoutError:
            raise PublishError("the broker did not acknowledge in time") from None
        except SessionLostError as exc:
            raise PublishError(f"session lost before the broker acknowledged ({exc})") from exc
        if code >= 0x80:
            raise PublishError(f"refused: {codec.reason_text(code, version=codec.V5)}")

    # ------------------------------------------------------------------ in
    async def run(self, stop: asyncio.Event, farewell: Callable[[], Awaitable[None]]) -> None:
        """Keep a session up until `stop`; then await `farewell()` while still connected.

        This is the `mqtt-ingest` task: it returns after a clean disconnect once `stop` is
        set (the farewell is skipped when no session is up at that moment). A connection
        attempt under way when `stop` comes is abandoned at once.
        """
        persistent = self._settings.persistent_session
        while not stop.is_set():
            began: float | None = None
            try:
                session = await _unless_stopped(self._connect(), stop)
                if session is None:
                    return
                self._session = session
                began = time.monotonic()
                try:
                    await self._session_up(session, stop, farewell)
                finally:
                    await session.close()
            except ConfigError as exc:
                # A password file missing or empty right now (being rotated, say): a failed
                # attempt like any other, tried again after the backoff.
                self._log.warning("mqtt_credentials_unreadable", problems=list(exc.problems))
            except (SessionLostError, OSError) as exc:
                self._log.warning(
                    "mqtt_disconnected" if self._sessions else "mqtt_connect_failed",
                    broker=self._settings.url,
                    error=str(exc),
                )
                if began is not None:
                    self._session_lost(time.monotonic() - began, exc)
            finally:
                self._session = None
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

    async def _session_up(
        self, session: Session, stop: asyncio.Event, farewell: Callable[[], Awaitable[None]]
    ) -> None:
        self._sessions += 1
        if self._sessions > 1:
            self.connection.reconnects += 1
        self.connection.connected = True
        self._connected.set()
        await _or_ended(
            session.publish(self._status_topic, self._status_payload("online"), qos=1, retain=True),
            session,
        )
        if self._stale:
            await _or_ended(session.unsubscribe(self._stale), session)
        qos = self._settings.qos
        granted = await _or_ended(session.subscribe([(t, qos) for t in self._filters]), session)
        refused = [f for f, code in zip(self._filters, granted, strict=False) if code >= 0x80]
        if refused or len(granted) != len(self._filters):
            what = refused or self._filters
            raise SessionLostError(f"subscription refused by the broker: {what}")
        self.connection.subscribed = True
        if self._sessions == 1:
            self._backoff.reset()
        self._log.info("mqtt_subscribed", broker=self._settings.url, topics=self._filters)
        self._on_subscribed()
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait((session.ended, stopped), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if session.ended.done():
            raise _lost(session.ended.result())
        self.connection.subscribed = False  # intake stops here: no more messages are taken
        await self.intake.drain()  # what was applied is durable and acknowledged
        await farewell()

    def _down(self) -> None:
        self._connected.clear()
        self.connection.connected = False
        self.connection.subscribed = False
        self._on_disconnected()


async def _unless_stopped(connecting: Awaitable[Session], stop: asyncio.Event) -> Session | None:
    """The session `connecting` brings up, or None if `stop` comes first (then abandoned)."""
    attempt = asyncio.ensure_future(connecting)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((attempt, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if attempt.done():
        return attempt.result()
    attempt.cancel()
    with contextlib.suppress(asyncio.CancelledError, SessionLostError, OSError):
        await attempt
    return None


async def _or_ended(step: Awaitable[T], session: Session) -> T:
    """`step`'s result, or the session's end as an exception if that comes first."""
    doing = asyncio.ensure_future(step)
    try:
        await asyncio.wait((doing, session.ended), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not doing.done():
            doing.cancel()
    if doing.done() and not doing.cancelled():
        return doing.result()
    raise _lost(session.ended.result())


def _lost(error: BaseException | None) -> SessionLostError:
    if isinstance(error, SessionLostError):
        return error
    return SessionLostError("disconnected" if error is None else f"connection lost ({error!r})")


def connect_request(settings: MqttSettings, offline: bytes, status_topic: str) -> ConnectRequest:
    """CONNECT for `settings`: the retained `offline` status as the will; how the broker keeps
    our session: clean session off on 3.1.1; on MQTT 5, no clean start and a session expiry
    (0 when the session is not meant to persist) and a Receive Maximum."""
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
    )
