"""What a `ThrottleGate` has heard from the broker, and the answer flag it keeps from it.

`Heard` owns the connection's state as the gate sees it (connected, the subscriptions asked
for and refused), the `ThrottleBook` of throttle objects and statuses, the ordering rule
(a device's object whose `seq` is not above the last is stale, unless a new edgemon process
may have restarted its `seq`), and the flag the hot path reads. The network thread and the
heartbeat watcher change it under `cond`; the hot path reads `active`, `activations` and
`inactive_at` without the lock, so `refresh` writes the bookkeeping first and the flag last.
"""

from __future__ import annotations

import threading
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from edgemon.client import _mqtt
from edgemon.client._gate_book import ThrottleBook
from edgemon.client._gate_views import DeviceThrottle, GateState, read_status, read_throttle

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable


class Heard:
    """Throttle objects, statuses and the connection, as heard; the answer flag from them."""

    __slots__ = (
        "_clock",
        "_subscribing",
        "_trusted",
        "activations",
        "active",
        "book",
        "changed_at",
        "cond",
        "connected",
        "device",
        "following",
        "inactive_at",
        "last_seq",
        "last_t_ms",
        "refusals",
        "refused",
        "stale",
        "unreadable",
    )

    def __init__(
        self, *, device: str, following: tuple[str, ...], clock: Callable[[], float]
    ) -> None:
        self.device = device
        self.following = following
        self._clock = clock
        #: Guards everything here; `stats` reads under it too, so it is reentrant.
        self.cond = threading.Condition(threading.RLock())
        self.connected = False
        #: Throttle objects and statuses: the answer rests on them.
        self.book = ThrottleBook()
        self._trusted: set[str] = set()  # devices whose next object is taken whatever its seq
        self._subscribing: dict[int, list[str]] = {}  # the filters of a SUBSCRIBE, by its id
        #: Filters the broker refused (`GateState.refused`), and refusals counted.
        self.refused: tuple[str, ...] = ()
        self.refusals = 0
        self.last_seq: int | None = None
        self.last_t_ms: float | None = None
        self.changed_at = clock()
        #: The one attribute the hot path reads; when it last went False; how often it went True.
        self.active = False
        self.inactive_at = 0.0
        self.activations = 0
        #: Objects ignored as stale (`seq` not above the last), and objects not readable.
        self.stale = 0
        self.unreadable = 0

    def refresh(self) -> None:
        """After a change (under the lock): the answer's flag, last, and wake waiters."""
        now = self._clock()
        self.changed_at = now
        active = self.connected and self.book.holds()
        if self.active and not active:
            self.inactive_at = now
        elif active and not self.active:
            self.activations += 1
        self.active = active
        self.cond.notify_all()

    # ------------------------------------------------------------------ the connection
    def connected_afresh(self) -> None:
        """A new connection: throttles and statuses are taken afresh from the broker."""
        with self.cond:
            self.connected = True
            self.book = ThrottleBook()
            self._trusted.clear()
            self._subscribing.clear()  # a SUBACK lost with the last connection never comes
            self.last_seq = self.last_t_ms = None
            self.refresh()

    def disconnected(self) -> bool:
        """The connection ended (or the gate closed); whether it was up."""
        with self.cond:
            was, self.connected = self.connected, False
            self.refresh()
        return was

    def subscribing(self, mid: int, filters: list[str]) -> None:
        """A SUBSCRIBE of `filters` was sent as packet `mid`."""
        with self.cond:
            self._subscribing[mid] = filters

    def suback(self, mid: int, codes: Iterable[Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The SUBACK of `mid`: (the filters refused now, those refused before), as
        `_mqtt.refused_filters` reads its codes. A SUBACK of nothing asked for changes
        nothing."""
        with self.cond:
            filters = self._subscribing.pop(mid, None)
            if filters is None:
                return self.refused, self.refused
            refused = _mqtt.refused_filters(filters, codes)
            said, self.refused = self.refused, refused
            self.refusals += len(refused)
            self.refresh()
        return refused, said

    # ------------------------------------------------------------------ retained objects
    def throttle(self, device: str, payload: bytes) -> None:
        """A device's retained throttle object (empty: removed)."""
        now = self._clock()
        value = read_throttle(payload, now) if payload else None
        with self.cond:
            book = self.book
            old = book.devices.get(device)
            if not payload:  # the retained object was removed
                book.drop(device)
            elif value is None:  # unreadable: that device's throttle ends (fail-open)
                self.unreadable += 1
                if old is not None:
                    book.put(device, DeviceThrottle(None, old.seq, changed_at=now))
            elif (
                device not in self._trusted
                and old is not None
                and old.seq is not None
                and value.seq is not None
                and value.seq <= old.seq
            ):
                self.stale += 1
                self.cond.notify_all()
                return
            else:
                self._trusted.discard(device)
                book.put(device, value)
                self.last_seq, self.last_t_ms = value.seq, value.t_ms
            self.refresh()

    def status(self, instance: str, payload: bytes) -> None:
        """An edgemon instance's retained status (empty: removed)."""
        now = self._clock()
        value = read_status(payload, now) if payload else None
        with self.cond:
            book = self.book
            if not payload:
                book.instances.pop(instance, None)
            elif value is None:
                self.unreadable += 1
                self.cond.notify_all()
                return
            else:
                was = book.instances.get(instance)
                book.instances[instance] = value
                if (
                    was is None
                    or was.started_ms != value.started_ms
                    or (value.state == "online" and not was.online(now))
                ):
                    self._trusted = set(book.devices)  # perhaps a restart: the next is taken
            self._voided(book.recheck(now))
            self.refresh()

    def forget_throttles(self) -> None:
        """Forget every device's throttle (after a message the gate could not handle)."""
        with self.cond:
            self.book.drop(None)
            self.refresh()

    def check_heartbeats(self) -> float:
        """Whether edgemon is online now (under the lock); seconds until that may change."""
        now = self._clock()
        book = self.book
        was, live = book.online, book.live
        self._voided(book.recheck(now))
        if book.online != was or book.live != live:
            if was and not book.online:
                _mqtt.log.warning(
                    "edgemon gate %s: no edgemon instance heard from within 3 heartbeats; "
                    "not holding until one is",
                    self.device,
                )
            self.refresh()
        return book.silent_at() - now + 0.001

    def _voided(self, owners: frozenset[str]) -> None:
        """Say which instances went offline or silent while their devices were throttled."""
        for owner in sorted(owners):
            _mqtt.log.warning(
                "edgemon gate %s: edgemon instance %s is offline or silent for 3 heartbeats; "
                "its devices' throttles are void until it is back",
                self.device,
                owner,
            )

    # ------------------------------------------------------------------ views
    def snapshot(self) -> GateState:
        """What the gate knows now (under the lock)."""
        book = self.book
        devices = book.devices
        holding = book.holding()
        shown = [devices[d] for d in holding] or list(devices.values())
        throttle: bool | None = True if holding else None
        if not holding and any(t.throttle is False for t in devices.values()):
            throttle = False
        headrooms = [t.min_headroom_ms for t in shown if t.min_headroom_ms is not None]
        now = self._clock()
        return GateState(
            connected=self.connected,
            edgemon_online=book.online,
            throttle=throttle,
            seq=self.last_seq,
            t_ms=self.last_t_ms,
            streams=tuple(s for t in shown for s in t.streams),
            min_headroom_ms=min(headrooms) if headrooms else None,
            instances=MappingProxyType({name: i.shown(now) for name, i in book.instances.items()}),
            following=self.following,
            holding=holding,
            devices=MappingProxyType(dict(devices)),
            changed_at=self.changed_at,
            voided=book.voided(),
            refused=self.refused,
        )
