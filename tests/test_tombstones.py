"""The device's tombstones on their own: removed stream ids, bounded in time and in number."""

from __future__ import annotations

from edgemon.engine.tombstones import Tombstones


def test_an_id_is_kept_for_the_idle_timeout_then_dropped() -> None:
    """An id buried at 0 is still there at 1,000 ms with a 1,000 ms keep; the next burial
    after that drops it (older than the keep), and `unbury` takes an id back at once."""
    tombstones = Tombstones()
    tombstones.bury("a", 0.0, keep_ms=1_000.0, cap=10)
    tombstones.bury("b", 1_000.0, keep_ms=1_000.0, cap=10)
    assert "a" in tombstones
    tombstones.bury("c", 1_000.5, keep_ms=1_000.0, cap=10)
    assert "a" not in tombstones
    assert tombstones.as_dict() == {"b": 1_000.0, "c": 1_000.5}
    tombstones.unbury("b")
    assert tombstones.as_dict() == {"c": 1_000.5}


def test_at_most_cap_ids_the_oldest_going_first() -> None:
    """Ten ids buried with a cap of 4: the last four stay, in burial order; a copy given to
    a snapshot does not change the tombstones, and a restored one holds the same."""
    tombstones = Tombstones()
    for n in range(10):
        tombstones.bury(f"s{n}", float(n), keep_ms=1e9, cap=4)
    assert len(tombstones) == 4
    copy = tombstones.as_dict()
    assert list(copy) == ["s6", "s7", "s8", "s9"]
    copy.clear()
    assert len(tombstones) == 4
    assert Tombstones(tombstones.as_dict()).as_dict() == tombstones.as_dict()
