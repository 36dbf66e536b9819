"""What every paho user in edgemon shares: client ids, and `PahoLink`, the paho client for a
`Broker` (`edgemon.broker_url`) with the callbacks of its connection: up, refused or
unreachable (said once), lost.

The Reporter, the ThrottleGate, the engine's retained links and the simulator's publisher each
hold a `PahoLink`, and run paho-mqtt 2.x on its own network thread (`loop_start`), never
asyncio: a player's audio thread and a vLLM EngineCore import them, and neither should own an
event loop for it. paho's public API only.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import uuid
from typing import TYPE_CHECKING, Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from edgemon.broker_url import Broker

_CLIENT_ID_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")

#: Reconnect backoff (seconds): paho doubles the delay from the first to the second.
RECONNECT_MIN_S = 1
RECONNECT_MAX_S = 5
#: How long one connection attempt may take before paho gives up on it.
CONNECT_TIMEOUT_S = 3.0
KEEPALIVE_S = 30

log = logging.getLogger("edgemon.client")


def default_client_id(role: str, device: str) -> str:
    """`edgemon-{role}-{device}-{host}-{pid}-{random}`: unique, so two clients of one device
    on one host (or in one process) never take each other's session."""
    host = _CLIENT_ID_UNSAFE.sub("_", socket.gethostname())[:64] or "host"
    return f"edgemon-{role}-{device}-{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def refused_filters(filters: Sequence[str], reason_codes: Iterable[Any]) -> tuple[str, ...]:
    """The filters a SUBACK refused: those whose reason code (paho's, or an int) is 0x80 or
    above, and those it gave no code for (fewer codes than filters)."""
    codes = [int(getattr(code, "value", code)) for code in reason_codes]
    padded = codes + [0x80] * len(filters)
    return tuple(f for f, code in zip(filters, padded, strict=False) if code >= 0x80)


def new_client(
    broker: Broker, *, client_id: str, clean_session: bool, retry: bool = True
) -> mqtt.Client:
    """A paho client (MQTT 3.1.1) for `broker`, not yet connected; without `retry` it does
    not connect again once its connection is lost.

    An exception in a callback is logged (as an error) rather than ending the network thread;
    paho's other messages are debug lines (its "not connected" at a normal stop is no error).
    """
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=client_id,
        clean_session=clean_session,
        protocol=mqtt.MQTTv311,
        reconnect_on_failure=retry,
    )
    client.suppress_exceptions = True
    client.on_log = _paho_log
    client.on_socket_open = _no_delay
    client.reconnect_delay_set(RECONNECT_MIN_S, RECONNECT_MAX_S)
    client.connect_timeout = CONNECT_TIMEOUT_S
    if broker.username is not None:
        client.username_pw_set(broker.username, broker.password)
    if broker.tls:
        client.tls_set(ca_certs=broker.ca_file, certfile=broker.cert_file, keyfile=broker.key_file)
    return client


class Unreachable:
    """Says once, as a WARNING, that the broker cannot be reached (or refused us); says again
    only after a connection succeeded in between. `who` begins each line."""

    __slots__ = ("_broker", "_lock", "_said", "who")

    def __init__(self, who: str, broker: Broker) -> None:
        self.who = who
        self._broker = broker
        self._lock = threading.Lock()
        self._said = False

    def failed(self, why: str) -> None:
        """A connection attempt failed (`why`): a WARNING the first time."""
        with self._lock:
            first, self._said = not self._said, True
        if first:
            broker = self._broker
            log.warning(
                "%s: cannot connect to the broker %s:%d%s (%s); retrying every %d-%d s",
                self.who,
                broker.host,
                broker.port,
                " (TLS)" if broker.tls else "",
                why,
                RECONNECT_MIN_S,
                RECONNECT_MAX_S,
            )
        else:
            log.debug("%s: connection attempt failed again (%s)", self.who, why)

    def connected(self) -> None:
        """A connection succeeded: the next failure is said again."""
        with self._lock:
            self._said = False


def _no_delay(_client: mqtt.Client, _userdata: Any, sock: Any) -> None:
    """Each new TCP connection sends at once (`TCP_NODELAY`), as edgemon and the shipped broker
    configuration do. With Nagle's algorithm a message waits while anything sent before it is
    unacknowledged: a report published right after the client's PUBACK of a throttle object
    would wait for the broker's delayed ACK (tens of ms on Linux), one published while the
    last is in flight for a network round trip."""
    if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _paho_log(_client: mqtt.Client, _userdata: Any, _level: int, text: str) -> None:
    level = logging.ERROR if text.startswith("Caught exception") else logging.DEBUG
    log.log(level, "paho: %s", text)


class PahoLink:
    """One paho client for a `Broker`, on its own network thread: what every paho user in
    edgemon holds (the Reporter's sender, the gate, the engine's retained links, the
    simulator's publisher) for the connect, refusal and loss callbacks they share.

    The owner says what it does with a connection that comes up (`on_up`, on the network
    thread, CONNACK accepted) and one that is lost or closed (`on_down`, given paho's reason,
    says whether that is news: it was up and nobody asked to close); the link logs
    "connected" and, for news, "lost the broker" with what that means for the owner
    (`lost_means`). An attempt that fails (refused, or no connection) is said once, as a
    WARNING, while the link keeps trying (`Unreachable`), or goes to `on_refused` when the
    owner gives one. With `retry` (the default) the link connects in the background and
    reconnects for ever; without, `open` connects at once (OSError if it cannot) and a lost
    connection stays lost. A client closed meanwhile that connects is ignored; its
    disconnection still reaches `on_down` (closed is down) and is not logged.
    """

    __slots__ = (
        "_broker",
        "_clean_session",
        "_client",
        "_lost_means",
        "_on_down",
        "_on_refused",
        "_on_up",
        "_retry",
        "_unreachable",
        "client_id",
        "who",
    )

    def __init__(  # noqa: PLR0913 - the owner's callbacks and the connection's terms, by keyword
        self,
        broker: Broker,
        *,
        who: str,
        client_id: str,
        on_up: Callable[[mqtt.Client], None],
        on_down: Callable[[str], bool],
        lost_means: str = "",
        clean_session: bool = True,
        retry: bool = True,
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        self._broker = broker
        #: Begins each line the link logs ("edgemon gate dev1").
        self.who = who
        self.client_id = client_id
        self._clean_session = clean_session
        self._on_up = on_up
        self._on_down = on_down
        self._lost_means = lost_means
        self._retry = retry
        self._on_refused = on_refused
        self._unreachable = Unreachable(who, broker)
        self._client: mqtt.Client | None = None

    @property
    def client(self) -> mqtt.Client | None:
        """The paho client while the link is open."""
        return self._client

    def open(self, configure: Callable[[mqtt.Client], None] | None = None) -> mqtt.Client:
        """Build the client (`configure` adds the owner's other callbacks and options) and
        start its network thread: in the background with `retry`, else connected first."""
        broker = self._broker
        client = new_client(
            broker, client_id=self.client_id, clean_session=self._clean_session, retry=self._retry
        )
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        if configure is not None:
            configure(client)
        self._client = client
        try:
            if self._retry:
                client.connect_async(broker.host, broker.port, keepalive=KEEPALIVE_S)
            else:
                client.connect(broker.host, broker.port, keepalive=KEEPALIVE_S)
        except BaseException:
            self._client = None
            raise
        client.loop_start()
        return client

    def close(self, timeout: float) -> None:
        """Disconnect and end the network thread, waiting at most `timeout` s (a connect
        attempt under way can take up to `CONNECT_TIMEOUT_S` to give up; the thread is a
        daemon). The client's callbacks from now on are ignored."""
        client, self._client = self._client, None
        if client is None:
            return

        def end() -> None:
            client.disconnect()
            client.loop_stop()
            # The thread is gone: `reinitialise` closes the wake-up socket pair paho made for
            # it, now rather than whenever the garbage collector reaches the client.
            client.reinitialise()

        stopper = threading.Thread(target=end, name="edgemon-client-stop", daemon=True)
        stopper.start()
        stopper.join(max(0.0, timeout))

    # ------------------------------------------------------------------ paho's callbacks
    def _on_connect(
        self, client: mqtt.Client, _userdata: Any, _flags: Any, reason_code: Any, _props: Any
    ) -> None:
        if client is not self._client:  # closed meanwhile
            return
        if reason_code.is_failure:
            self._failed(f"the broker refused the connection: {reason_code}")
            return
        self._unreachable.connected()
        log.info("%s: connected to the broker", self.who)
        self._on_up(client)

    def _on_connect_fail(self, client: mqtt.Client, _userdata: Any) -> None:
        if client is self._client:
            self._failed("no connection")

    def _failed(self, why: str) -> None:
        if self._on_refused is None:
            self._unreachable.failed(why)
        else:
            self._on_refused(why)

    def _on_disconnect(
        self, client: mqtt.Client, _userdata: Any, _flags: Any, reason_code: Any, _props: Any
    ) -> None:
        news = self._on_down(str(reason_code))
        if news and client is self._client:
            log.warning("%s: lost the broker (%s)%s", self.who, reason_code, self._lost_means)
