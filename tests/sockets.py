"""The sockets this process holds open: a leak check that needs no garbage collector."""

from __future__ import annotations

import contextlib
import gc
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


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


@contextlib.contextmanager
def left_open() -> Iterator[Callable[[], set[str]]]:
    """Within the block the garbage collector is off (a collection would close what was left
    open); the callable yielded gives the sockets opened since the block began and still
    open."""
    gc.collect()
    before = open_sockets()
    gc.disable()
    try:
        yield lambda: open_sockets() - before
    finally:
        gc.enable()
