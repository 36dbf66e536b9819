"""The systemd notify protocol (sd_notify(3)) over `$NOTIFY_SOCKET`, without libsystemd.

`READY=1` once subscribed, `WATCHDOG=1` while the event loop is healthy, `STATUS=...`, and
`STOPPING=1`. Abstract sockets (`@name`) are supported. Without `NOTIFY_SOCKET` every call is
a no-op. The environment is passed in, never read at import.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping


class Notifier:
    """Sends notify datagrams to the service manager, if there is one."""

    __slots__ = ("_address", "_socket", "watchdog_interval_s")

    def __init__(self, environ: Mapping[str, str]) -> None:
        path = environ.get("NOTIFY_SOCKET", "")
        self._address: str | bytes | None = None
        if path.startswith("@"):
            self._address = b"\0" + path[1:].encode()
        elif path.startswith("/"):
            self._address = path
        self._socket: socket.socket | None = None
        #: Half of `WATCHDOG_USEC` in seconds, or None when no watchdog is asked for.
        self.watchdog_interval_s = _watchdog_interval(environ)

    @property
    def enabled(self) -> bool:
        """Whether a service manager listens."""
        return self._address is not None

    def notify(self, *fields: str) -> bool:
        """Send `KEY=VALUE` lines in one datagram; False if there is nobody or sending failed."""
        if self._address is None:
            return False
        if self._socket is None:
            kind = socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
            self._socket = socket.socket(socket.AF_UNIX, kind)
        try:
            self._socket.sendto("\n".join(fields).encode(), self._address)
        except OSError:
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        """`READY=1` (with a status line)."""
        return self.notify("READY=1", *_status(status))

    def watchdog(self) -> bool:
        """`WATCHDOG=1`: the loop is alive."""
        return self.notify("WATCHDOG=1")

    def status(self, status: str) -> bool:
        """`STATUS=...`, shown by `systemctl status`."""
        return self.notify(*_status(status))

    def stopping(self) -> bool:
        """`STOPPING=1`."""
        return self.notify("STOPPING=1")

    def close(self) -> None:
        """Close the socket (idempotent)."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def _status(status: str | None) -> tuple[str, ...]:
    if status is None:
        return ()
    return ("STATUS=" + status.replace("\n", " "),)


def _watchdog_interval(environ: Mapping[str, str]) -> float | None:
    usec = environ.get("WATCHDOG_USEC", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    pid = environ.get("WATCHDOG_PID", "")
    if pid.isdigit() and int(pid) != os.getpid():
        return None  # the watchdog is meant for another process
    return int(usec) / 2e6
