"""What the Reporter and the ThrottleGate share: client ids, the paho client for
a `Broker` (`edgemon.broker_url`), and how a connection that cannot be made is said.

Both run paho-mqtt 2.x on its own network thread (`loop_start`), never asyncio: a player's
audio thread and a vLLM EngineCore import them, and neither should own an event loop for it.
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


def new_client(broker: Broker, *, client_id: str, clean_session: bool) -> mqtt.Client:
    """A paho client (MQTT 3.1.1) for `broker`, not yet connected.

    An exception in a callback is logged (as an error) rather than ending the network thread;
    paho's other messages are debug lines (its "not connected" at a normal stop is no error).
    """
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=client_id,
        clean_session=clean_session,
        protocol=mqtt.MQTTv311,
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


def start(client: mqtt.Client, broker: Broker) -> None:
    """Start the network thread; it connects (and reconnects) in the background."""
    client.connect_async(broker.host, broker.port, keepalive=KEEPALIVE_S)
    client.loop_start()


def stop(client: mqtt.Client, timeout: float) -> None:
    """Disconnect and end the network thread, waiting at most `timeout` s (a connect attempt
    under way can take up to `CONNECT_TIMEOUT_S` to give up; the thread is a daemon)."""

    def end() -> None:
        client.disconnect()
        client.loop_stop()
        # The thread is gone: `reinitialise` closes the wake-up socket pair paho made for it,
        # now rather than whenever the garbage collector reaches the client.
        client.reinitialise()

    stopper = threading.Thread(target=end, name="edgemon-client-stop", daemon=True)
    stopper.start()
    stopper.join(max(0.0, timeout))
