"""How many sockets this process holds open: a leak check that needs no garbage collector."""

from __future__ import annotations

import contextlib
from pathlib import Path


def open_sockets() -> int:
    """How many of this process's file descriptors are sockets now."""
    count = 0
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            count += fd.readlink().as_posix().startswith("socket:")
    return count
