"""The sockets this process holds open: a leak check that needs no garbage collector."""

from __future__ import annotations

import contextlib
from pathlib import Path


def open_sockets() -> set[str]:
    """This process's open sockets, as `socket:[inode]` (an inode names one socket while it
    lives). A check compares two of these sets, so that sockets other threads close
    meanwhile do not count."""
    found = set()
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            target = fd.readlink().as_posix()
            if target.startswith("socket:"):
                found.add(target)
    return found
