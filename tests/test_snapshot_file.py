"""The snapshot file: atomic writes, a bad file set aside, nothing left half-written."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from edgemon.daemon.snapshot_file import SNAPSHOT_NAME, StateStore, encode
from edgemon.engine import EngineConfig
from edgemon.monitor import Monitor

if TYPE_CHECKING:
    from pathlib import Path


def test_a_saved_snapshot_loads_back(tmp_path: Path) -> None:
    """What is saved is what loads; no temporary file is left behind."""
    store = StateStore(tmp_path)
    assert store.load() is None
    written = store.save({"format": 1, "devices": [{"id": "d"}]})
    assert store.load() == {"format": 1, "devices": [{"id": "d"}]}
    assert written == (tmp_path / SNAPSHOT_NAME).stat().st_size
    assert [p.name for p in tmp_path.iterdir()] == [SNAPSHOT_NAME]


def test_a_new_snapshot_replaces_the_old_one_whole(tmp_path: Path) -> None:
    """The rename is atomic: the file is always one complete snapshot, never a mix."""
    store = StateStore(tmp_path)
    store.save({"n": 1, "pad": "x" * 100_000})
    store.save({"n": 2})
    assert json.loads((tmp_path / SNAPSHOT_NAME).read_text()) == {"n": 2}


@pytest.mark.parametrize("content", ["{not json", "[1, 2]"])
def test_a_bad_snapshot_is_set_aside(tmp_path: Path, content: str) -> None:
    """A file that is not a JSON object raises ValueError and is renamed `.bad`, so the next
    start begins clean and the file stays for inspection."""
    (tmp_path / SNAPSHOT_NAME).write_text(content)
    store = StateStore(tmp_path)
    with pytest.raises(ValueError, match=r".+"):
        store.load()
    assert (tmp_path / (SNAPSHOT_NAME + ".bad")).read_text() == content
    assert store.load() is None


def test_a_snapshot_that_cannot_be_written_raises_os_error(tmp_path: Path) -> None:
    """A missing directory is an OSError for the daemon to log, not a crash elsewhere."""
    store = StateStore(tmp_path / "gone")
    with pytest.raises(OSError, match=r".+"):
        store.save({"n": 1})


@pytest.mark.parametrize("devices", [0, 1, 3])
def test_snapshots_are_encoded_to_the_compact_json_of_the_standard_library(devices: int) -> None:
    """`encode` (msgspec, on the event loop) writes the compact JSON `json.dumps` writes for
    a snapshot, with no device, one or many, and any other object as it is; what it writes
    reads back as the same snapshot."""
    monitor = Monitor(EngineConfig())
    for d in range(devices):
        events = [
            {"type": "chunk", "stream": f"s{s}", "t_ms": 1000.0, "seq": 0, "audio_ms": 500.0}
            for s in range(4)
        ]
        monitor.receive(f"edgemon/v1/dev{d}/events", json.dumps(events).encode(), 1000.0, [])
    data = monitor.snapshot(1100.0) | {"wal_generation": 3}
    whole = json.dumps(data, separators=(",", ":"), allow_nan=False).encode()
    assert encode(data) == whole
    assert json.loads(encode(data)) == data
    assert len(json.loads(encode(data))["engine"]["devices"]) == devices
    other = {"engine": {"devices": "not a list"}, "x": [1, 2]}
    assert encode(other) == json.dumps(other, separators=(",", ":")).encode()
