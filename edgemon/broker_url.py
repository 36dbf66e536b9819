"""Where the MQTT broker is, and as whom: the one parser of broker URLs.

The daemon's settings (`mqtt.url`) and the clients (`Reporter`, `ThrottleGate`, the vLLM
integrations) parse their URLs here, with the same rules for scheme, host, port and path.
Two things differ by caller, and each caller says which it takes:

- `embedded=True`: the word `embedded` (the daemon's in-process broker) is accepted too;
- `url_credentials=False`: a user or password in the URL is refused (the daemon's settings
  keep the password out of the config file and out of URLs, docs/reliability.md); the
  clients accept them percent-encoded (docs/client.md).

Standard library only: a player or a vLLM process imports it without the daemon's
dependencies, and the settings import it without paho.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final
from urllib.parse import SplitResult, unquote, urlsplit

from edgemon.errors import EdgemonError

#: The daemon's in-process broker, named instead of a URL.
EMBEDDED: Final = "embedded"
#: Default ports: MQTT over TCP, and over TLS.
MQTT_PORT: Final = 1883
MQTTS_PORT: Final = 8883


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
    #: The daemon's in-process broker (`embedded`), on `host:port`.
    embedded: bool = False


class BrokerUrlError(EdgemonError, ValueError):
    """A broker URL refused. `str()` names the URL (its password masked); `reason` alone says
    what is wrong with it, for callers that name the URL themselves (a settings key)."""

    def __init__(self, url: object, reason: str) -> None:
        shown = _redact(url) if isinstance(url, str) else url
        super().__init__(f"broker URL {shown!r} {reason}")
        self.reason = reason


def parse_broker_url(  # noqa: PLR0913 - the connection's parts, each a keyword
    url: str,
    *,
    username: str | None = None,
    password: str | None = None,
    password_file: str | os.PathLike[str] | None = None,
    ca_file: str | os.PathLike[str] | None = None,
    cert_file: str | os.PathLike[str] | None = None,
    key_file: str | os.PathLike[str] | None = None,
    url_credentials: bool = True,
    embedded: bool = False,
) -> Broker:
    """`mqtt://[user[:password]@]host[:port]` (1883) or `mqtts://...` (8883, TLS); with
    `embedded`, also the word `embedded` (127.0.0.1:1883).

    Credentials come from the URL (percent-encoded; refused unless `url_credentials`) or from
    the keyword arguments, not both; `password_file` is read now (one trailing newline
    stripped). The TLS files need `mqtts://` and must be readable now; `cert_file` and
    `key_file` go together (a key inside the certificate's file: give that file as both).
    A bad URL raises `BrokerUrlError`, a bad keyword ValueError.
    """
    if password_file is not None:
        password = _read_secret(password_file, password)
    if embedded and url == EMBEDDED:
        return Broker("127.0.0.1", MQTT_PORT, embedded=True)
    parts, port = _split(url, url_credentials=url_credentials, embedded=embedded)
    user, secret = _credentials(parts, username, password)
    tls = parts.scheme == "mqtts"
    given = _tls_files(tls, ca_file=ca_file, cert_file=cert_file, key_file=key_file)
    return Broker(
        parts.hostname or "",
        port or (MQTTS_PORT if tls else MQTT_PORT),
        tls=tls,
        username=user,
        password=secret,
        ca_file=given.get("ca_file"),
        cert_file=given.get("cert_file"),
        key_file=given.get("key_file"),
    )


def _split(url: str, *, url_credentials: bool, embedded: bool) -> tuple[SplitResult, int | None]:
    """The URL's parts and its port (None: the scheme's default); `BrokerUrlError` for
    anything but an `mqtt://` or `mqtts://` URL with a host, at most a `/` after it."""
    expected = _expected(url_credentials=url_credentials, embedded=embedded)
    if not isinstance(url, str):
        raise BrokerUrlError(url, expected)
    try:
        parts = urlsplit(url)
    except ValueError:  # a bracketed host that is no IPv6 address
        raise BrokerUrlError(url, expected) from None
    if parts.scheme not in {"mqtt", "mqtts"} or not parts.hostname:
        raise BrokerUrlError(url, expected)
    if not url_credentials and (parts.username is not None or parts.password is not None):
        raise BrokerUrlError(url, "must not hold credentials; give them apart from the URL")
    if parts.path not in {"", "/"} or parts.query or parts.fragment:
        raise BrokerUrlError(url, expected)
    try:
        port = parts.port
    except ValueError:  # not a number, or out of range
        port = 0
    if port == 0:
        raise BrokerUrlError(url, "has an invalid port")
    return parts, port


def _credentials(
    parts: SplitResult, username: str | None, password: str | None
) -> tuple[str | None, str | None]:
    """(user, password) from the URL (percent-encoded) or from the arguments, not both."""
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
    return user, secret


def _expected(*, url_credentials: bool, embedded: bool) -> str:
    """What a refused URL must be, in the forms this caller accepts."""
    auth = "[user[:password]@]" if url_credentials else ""
    forms = f"mqtt://{auth}host[:port], mqtts://{auth}host[:port]"
    if embedded:
        return f"must be {forms} or {EMBEDDED}"
    return f"must be {forms.replace(', ', ' or ')}"


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
    try:
        password = urlsplit(url).password
    except ValueError:
        return url
    if password is None:
        return url
    return url.replace(f":{password}@", ":***@", 1)
