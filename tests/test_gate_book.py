"""The gate's book of throttle objects and statuses (`edgemon.client._gate_book`), without a
broker: which `throttle: true` counts, by its owner's liveness (docs/protocol.md, "Throttle
object")."""

from __future__ import annotations

from edgemon.client._gate_book import ThrottleBook
from edgemon.client._gate_views import DeviceThrottle, Instance


def on(owner: str | None, seq: int = 1) -> DeviceThrottle:
    return DeviceThrottle(throttle=True, seq=seq, owner=owner)


def test_an_owned_throttle_counts_only_while_its_owner_is_online() -> None:
    """`a` owned by e1 (heartbeat 1 s), `b` by e2 (never silent): both count while both are
    online; once e1 is silent for 3 heartbeats, `recheck` says e1 went and `a` is void while
    `b` still holds; once `b` is off, nothing holds though e2 is online."""
    book = ThrottleBook()
    book.instances["e1"] = Instance("online", heard_at=0.0, heartbeat_s=1.0)
    book.instances["e2"] = Instance("online", heard_at=0.0, heartbeat_s=None)
    book.put("a", on("e1"))
    book.put("b", on("e2"))
    assert book.recheck(1.0) == frozenset()
    assert book.holds()
    assert (book.holding(), book.voided()) == (("a", "b"), ())
    assert book.recheck(3.0) == {"e1"}  # 3 heartbeats unheard
    assert book.online
    assert book.holds()
    assert book.voided() == ("a",)
    book.put("b", DeviceThrottle(throttle=False, seq=2, owner="e2"))
    assert not book.holds()
    assert book.recheck(4.0) == frozenset()  # said once


def test_an_object_without_owner_counts_while_any_instance_is_online() -> None:
    """An object without `owner` (an older edgemon) holds while any instance is online, and
    not once none is; an owner never heard from makes its object void at once."""
    book = ThrottleBook()
    book.put("old", on(None))
    book.put("orphan", on("gone"))
    book.recheck(0.0)
    assert not book.holds()
    book.instances["e1"] = Instance("online", heard_at=0.0, heartbeat_s=None)
    book.recheck(0.0)
    assert book.holds()
    assert book.voided() == ("orphan",)
    book.drop("old")
    assert not book.holds()
    book.drop(None)
    assert book.holding() == ()
