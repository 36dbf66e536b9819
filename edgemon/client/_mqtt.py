"""What the Reporter and the ThrottleGate share: broker URLs, credentials and TLS files,
names, the paho client, and how a connection that cannot be made is said.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from edgemon.protocol import DEVICE_ID_PATTERN, RESERVED_DEVICE, valid_device_id

_CLIENT_ID_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_URL_FORM = "mqtt://[user[:password]@]host[:port] or mqtts://..."

#: Reconnect backoff (seconds): paho doubles the delay from the first to the second.
RECONNECT_MIN_S = 1
RECONNECT_MAX_S = 5
#: How long one connection attempt may take before paho gives up on it.
CONNECT_TIMEOUT_S = 3.0
KEEPALIVE_S = 30

log = logging.getLogger("edgemon.client")


@dataclass(frozen=True, slots=True)
class Broker:
    """Where to connect, and as whom."""

    host: str
    port: int
    tls: bool = False
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    #: TLS: a private CA bundle (else the system's CAs), a client certificate and its key.
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None


def parse_broker_url(
    url: str,
    *,
    username: str | None = None,
    password: str | None = None,
    password_file: str | os.PathLike[str] | None = None,
    ca_file: str | os.PathLike[str] | None = None,
    cert_file: str | os.PathLike[str] | None = None,
    key_file: str | os.PathLike[str] | None = None,
) -> Broker:
    """`mqtt://[user[:password]@]host[:port]` (1883) or `mqtts://...` (8883, TLS).

    Credentials come from the URL (percent-encoded) or from the keyword arguments, not both;
    `password_file` is read now (one trailing newline stripped). The TLS files need `mqtts://`
    and must be readable now; `cert_file` and `key_file` go together (a key inside the
    certificate's file: give that file as both).
    """
    if password_file is not None:
        password = _read_secret(password_file, password)
    if not isinstance(url, str):
        raise ValueError(f"broker URL must be {_URL_FORM}")  # noqa: TRY004 - as every bad value
    parts = urlsplit(url)
    if parts.scheme not in {"mqtt", "mqtts"} or not parts.hostname:
        raise ValueError(f"broker URL {_redact(url)!r} must be {_URL_FORM}")
    if parts.path not in {"", "/"} or parts.query or parts.fragment:
        raise ValueError(f"broker URL {_redact(url)!r} must be {_URL_FORM}")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise ValueError(f"broker URL {_redact(url)!r} has an invalid port")
    url_user = unquote(parts.username) if parts.username is not None else None
    url_password = unquote(parts.password) if parts.password is not None else None
    if url_user is not None and username is not None:
        raise ValueError("give the username in the broker URL or as username=, not both")
    if url_password is not None and password is not None:
        raise ValueError("give the password in the broker URL or as password=, not both")
    user = url_user if url_user is not None else username
    secret = url_password if url_password is not None else password
    if secret is not None and user is None:
        raise ValueError("a broker password needs a username")
    tls = parts.scheme == "mqtts"
    given = _tls_files(tls, ca_file=ca_file, cert_file=cert_file, key_file=key_file)
    return Broker(
        parts.hostname,
        port or (8883 if tls else 1883),
        tls,
        user,
        secret,
        given.get("ca_file"),
        given.get("cert_file"),
        given.get("key_file"),
    )


def _tls_files(
    tls: bool,
    **files: str | os.PathLike[str] | None,
) -> dict[str, str]:
    """The TLS files given, each checked readable; only with TLS, a certificate with its key."""
    given = {name: _readable(name, value) for name, value in files.items() if value is not None}
    if given and not tls:
        raise ValueError(f"{', '.join(given)} need an mqtts:// broker URL")
    if ("cert_file" in given) != ("key_file" in given):
        raise ValueError("give cert_file= and key_file= together (a client certificate)")
    return given


def _readable(name: str, path: str | os.PathLike[str]) -> str:
    """`path` as a string, if it names a readable file."""
    text = os.fspath(path)
    if not os.access(text, os.R_OK) or not Path(text).is_file():
        raise ValueError(f"{name} {text!r} is not a readable file")
    return text


def _read_secret(path: str | os.PathLike[str], password: str | None) -> str:
    """A password from a file: its text, one trailing newline stripped; never empty."""
    if password is not None:
        raise ValueError("give password= or password_file=, not both")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"password_file {os.fspath(path)!r} cannot be read: {exc}") from None
    text = text.removesuffix("\n").removesuffix("\r")
    if not text:
        raise ValueError(f"password_file {os.fspath(path)!r} is empty")
    return text


def _redact(url: str) -> str:
    """The URL with any password masked (for error messages)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return url.replace(f":{parts.password}@", ":***@", 1)


def check_device(device: str) -> str:
    """A device id as a topic level: `[A-Za-z0-9._-]{1,64}`, not the reserved `_edgemon`."""
    if device == RESERVED_DEVICE:
        raise ValueError(f"device {device!r} is reserved: it names edgemon's own topics")
    if not valid_device_id(device):
        raise ValueError(f"device {device!r} must match {DEVICE_ID_PATTERN}")
    return device


def check_devices(devices: str) -> tuple[str, ...]:
    """`+` (every device), one device id, or a comma-separated list of them: `("+",)` or the
    ids, sorted, without repeats (blanks around a comma are ignored)."""
    if not isinstance(devices, str):
        raise ValueError(f"device {devices!r} must be an id, a comma-separated list or '+'")  # noqa: TRY004
    if devices.strip() == "+":
        return ("+",)
    ids = [part.strip() for part in devices.split(",")]
    for part in ids:
        if part == "+":
            raise ValueError(f"device {devices!r}: '+' stands alone, not in a list")
        check_device(part)
    return tuple(sorted(set(ids)))


def check_topic_prefix(prefix: str) -> str:
    """Topic levels separated by '/', none empty, no wildcard, not starting with '$'."""
    if not isinstance(prefix, str) or not prefix or "" in prefix.split("/"):
        raise ValueError(f"topic prefix {prefix!r} must be non-empty levels separated by '/'")
    if "+" in prefix or "#" in prefix or "\x00" in prefix or prefix.startswith("$"):
        raise ValueError(f"topic prefix {prefix!r} must not hold '+', '#' or start with '$'")
    return prefix


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
    waited for the broker's delayed ACK (tens of ms on Linux), one published while the last
    is in flight for a network round trip."""
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
