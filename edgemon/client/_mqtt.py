"""What the Reporter and the ThrottleGate share: broker URLs, names, and the paho client.

Both run paho-mqtt 2.x on its own network thread (`loop_start`), never asyncio: a player's
audio thread and a vLLM EngineCore import them, and neither should own an event loop for it.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

_DEVICE_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
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


def parse_broker_url(
    url: str, *, username: str | None = None, password: str | None = None
) -> Broker:
    """`mqtt://[user[:password]@]host[:port]` (1883) or `mqtts://...` (8883, TLS).

    Credentials come from the URL (percent-encoded) or from the keyword arguments, not both.
    """
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
    return Broker(parts.hostname, port or (8883 if tls else 1883), tls, user, secret)


def _redact(url: str) -> str:
    """The URL with any password masked (for error messages)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return url.replace(f":{parts.password}@", ":***@", 1)


def check_device(device: str) -> str:
    """A device id as a topic level: `[A-Za-z0-9._-]{1,64}`."""
    if not isinstance(device, str) or _DEVICE_ID.fullmatch(device) is None:
        raise ValueError(f"device {device!r} must match [A-Za-z0-9._-]{{1,64}}")
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


def default_client_id(role: str, device: str, *, unique: bool) -> str:
    """`edgemon-{role}-{device}-{host}` (plus the process id when `unique`)."""
    host = _CLIENT_ID_UNSAFE.sub("_", socket.gethostname())[:64] or "host"
    suffix = f"-{os.getpid()}" if unique else ""
    return f"edgemon-{role}-{device}-{host}{suffix}"


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
    client.reconnect_delay_set(RECONNECT_MIN_S, RECONNECT_MAX_S)
    client.connect_timeout = CONNECT_TIMEOUT_S
    if broker.username is not None:
        client.username_pw_set(broker.username, broker.password)
    if broker.tls:
        client.tls_set()
    return client


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

    stopper = threading.Thread(target=end, name="edgemon-client-stop", daemon=True)
    stopper.start()
    stopper.join(max(0.0, timeout))
