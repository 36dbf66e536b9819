"""The state directory (where it is) and the snapshot file in it (written atomically, read
once at start)."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import msgspec

from edgemon.settings import DEFAULT_STATE_DIR

if TYPE_CHECKING:
    from collections.abc import Mapping

SNAPSHOT_NAME = "snapshot.json"


class StateStore:
    """`<dir>/snapshot.json`: a crash mid-write leaves the previous snapshot whole.

    Writing goes to a temporary file in the same directory, which is flushed and fsynced,
    then renamed over the snapshot; the directory is fsynced so the rename survives power
    loss too. Each write has a temporary file of its own, so two writes at once (the periodic
    snapshot and the final one) cannot write into each other's file.
    """

    __slots__ = ("_writes", "path")

    def __init__(self, directory: Path) -> None:
        self.path = directory / SNAPSHOT_NAME
        self._writes = itertools.count()

    def load(self) -> dict[str, Any] | None:
        """The last snapshot, or None if there is none. A file that is not JSON raises
        ValueError; it is moved aside (`snapshot.json.bad`) so the next start is clean."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        try:
            data = json.loads(text)
        except ValueError:
            self.path.replace(self.path.with_name(SNAPSHOT_NAME + ".bad"))
            raise
        if not isinstance(data, dict):
            self.path.replace(self.path.with_name(SNAPSHOT_NAME + ".bad"))
            raise ValueError("a snapshot must be a JSON object")  # noqa: TRY004 - bad content
        return data

    def save(self, data: dict[str, Any]) -> int:
        """Write `data` atomically; the number of bytes written."""
        return self.write(encode(data))

    def write(self, body: bytes) -> int:
        """Write an encoded snapshot (`encode`) atomically; the number of bytes written. File
        work only: it lets the GIL go, so a worker thread may do it beside the event loop."""
        temporary = self.path.with_name(f".{SNAPSHOT_NAME}.{os.getpid()}.{next(self._writes)}.tmp")
        with temporary.open("wb") as file:
            file.write(body)
            file.flush()
            os.fsync(file.fileno())
        temporary.replace(self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        return len(body)


_ENCODE: Final = msgspec.json.Encoder().encode


def encode(data: dict[str, Any]) -> bytes:
    """`data` as compact JSON, in one msgspec call.

    A snapshot of 10,000 streams (4.4 MB) takes about 5 ms, short enough for the daemon to
    encode on the event loop right after the capture, within the capture's clearance; the
    worker only writes (`StateStore.write`). Encoding on the worker instead would hold the
    GIL that the event loop must win back (a switch interval at a time) while deadlines come
    due, and the standard library's encoder takes about 80 ms. Text for text it
    is the JSON `json.dumps` writes, but for the spelling of exponents (`1e-05`, `1.5e-7`:
    the same numbers); a snapshot holds no NaN or infinity (`edgemon.engine.snapshot`
    writes None for an infinite time).
    """
    return _ENCODE(data)


def resolve_state_dir(configured: Path, environ: Mapping[str, str]) -> tuple[Path | None, str]:
    """The state directory to use, created if needed, and how it was chosen (or why none).

    `configured` as it is when it exists. The default `/var/lib/edgemon` (systemd's
    `StateDirectory=`) missing means a hand-started daemon: `$XDG_STATE_HOME/edgemon`, else
    `$HOME/.local/state/edgemon` (reliability.md), from the environment given, never the process's.
    """
    if configured.is_dir():
        return configured, "configured"
    path, chosen = configured, "configured, created"
    if configured == DEFAULT_STATE_DIR:
        xdg = Path(environ.get("XDG_STATE_HOME", ""))
        home = Path(environ.get("HOME", ""))
        if xdg.is_absolute():
            path, chosen = xdg / "edgemon", "XDG_STATE_HOME"
        elif home.is_absolute():
            path, chosen = home / ".local" / "state" / "edgemon", "HOME"
        else:
            return None, f"no {DEFAULT_STATE_DIR}, and neither XDG_STATE_HOME nor HOME is set"
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        return None, f"cannot create {path}: {exc.strerror}"
    return path, chosen
