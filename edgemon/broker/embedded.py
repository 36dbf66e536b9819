"""The embedded broker: amqtt (MQTT 3.1.1) in the running event loop, anonymous, no plugins.

amqtt is an optional extra (`pip install edgemon[embedded]`) and imported only when a broker
is started, so edgemon works without it. amqtt speaks MQTT 3.1.1 only: clients of the
embedded broker must not ask for MQTT 5.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
from typing import TYPE_CHECKING, Any

from edgemon.errors import EdgemonError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

EXTRA_HINT = "the embedded broker needs `pip install edgemon[embedded]`"

#: Tries when port 0 asks for a free port and another program takes it before amqtt binds.
_FREE_PORT_TRIES = 3


class EmbeddedBrokerError(EdgemonError, RuntimeError):
    """The embedded broker cannot run (the extra is missing, or the address is unusable)."""


@contextlib.asynccontextmanager
async def embedded_broker(
    host: str = "127.0.0.1", port: int = 1883
) -> AsyncIterator[tuple[str, int]]:
    """Run a broker on `host:port` (port 0: a free port) while the block runs.

    Yields the `(host, port)` it listens on. Retained messages live as long as the broker;
    nothing is persisted. Raises `EmbeddedBrokerError` with one clear line when amqtt is not
    installed or the address cannot be bound.
    """
    try:
        # amqtt has no type information; with the extra missing mypy sees no module at all.
        from amqtt.broker import (  # type: ignore[import-untyped,import-not-found,unused-ignore]  # noqa: PLC0415 - optional extra, imported on use
            Broker,
        )
        from amqtt.errors import (  # type: ignore[import-untyped,import-not-found,unused-ignore]  # noqa: PLC0415
            BrokerError,
        )
    except ImportError:
        raise EmbeddedBrokerError(EXTRA_HINT) from None
    # amqtt logs through `logging`; without a handler of the application, Python's last-resort
    # handler would print its warnings and tracebacks to stderr. An application that configures
    # logging still gets them.
    amqtt_log = logging.getLogger("amqtt")
    if not any(isinstance(h, logging.NullHandler) for h in amqtt_log.handlers):
        amqtt_log.addHandler(logging.NullHandler())
    tries = _FREE_PORT_TRIES if port == 0 else 1
    for attempt in range(1, tries + 1):
        bound = _check_bindable(host, port)
        broker = Broker(_config(host, bound))
        try:
            await broker.start()
        except BrokerError as exc:
            cause = exc.__cause__
            if attempt < tries and isinstance(cause, OSError) and cause.errno == errno.EADDRINUSE:
                continue
            detail = cause or exc
            raise EmbeddedBrokerError(f"embedded broker on {host}:{bound}: {detail}") from None
        break
    try:
        yield host, bound
    finally:
        await broker.shutdown()


def _check_bindable(host: str, port: int) -> int:
    """The port to use (a free one for 0); a clear error if `host:port` cannot be bound."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise EmbeddedBrokerError(f"embedded broker: cannot resolve {host!r}: {exc}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise EmbeddedBrokerError(
                f"embedded broker: cannot listen on {host}:{port}: {exc.strerror}"
            ) from None
        chosen: int = probe.getsockname()[1]
    return chosen


def _config(host: str, port: int) -> dict[str, Any]:
    bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return {
        "listeners": {"default": {"type": "tcp", "bind": bind}},
        # Only anonymous access: no $SYS publisher, no packet logging.
        "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
    }
