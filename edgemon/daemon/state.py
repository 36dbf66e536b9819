"""The snapshot file in the state directory: written atomically, read once at start."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

SNAPSHOT_NAME = "snapshot.json"


class StateStore:
    """`<dir>/snapshot.json`: a crash mid-write leaves the previous snapshot whole.

    Writing goes to a temporary file in the same directory, which is flushed and fsynced,
    then renamed over the snapshot; the directory is fsynced so the rename survives power
    loss too.
    """

    __slots__ = ("path",)

    def __init__(self, directory: Path) -> None:
        self.path = directory / SNAPSHOT_NAME

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
        body = json.dumps(data, separators=(",", ":"), allow_nan=False).encode()
        temporary = self.path.with_name(f".{SNAPSHOT_NAME}.{os.getpid()}.tmp")
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
