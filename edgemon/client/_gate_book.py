"""What a `ThrottleGate` holds on: the followed devices' throttle objects, the edgemon
instances' statuses, and whether, together, they say hold.

A throttle object that names its `owner` (the client id of the edgemon instance that owns
the device) counts only while that instance is `online` and heard from within 3 of its
heartbeats: when devices are split across instances and one dies, its retained
`throttle: true` holds no engine while the others run on. An object without `owner` (an
older edgemon) counts while any instance is online. The book keeps a count of the devices
throttled per owner, so the answer costs a look at each owner, not at each device.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgemon.client._gate_views import DeviceThrottle, Instance


class ThrottleBook:
    """Throttle objects by device, statuses by instance, and the instances online now."""

    __slots__ = ("_on", "devices", "instances", "live", "online")

    def __init__(self) -> None:
        #: The latest object of every device heard from.
        self.devices: dict[str, DeviceThrottle] = {}
        #: The latest status of every instance heard from.
        self.instances: dict[str, Instance] = {}
        #: The instances online now (as of the last `recheck`), and whether any is.
        self.live: frozenset[str] = frozenset()
        self.online = False
        self._on: dict[str | None, int] = {}  # devices whose throttle is on, by owner

    # ------------------------------------------------------------------ throttle objects
    def put(self, device: str, throttle: DeviceThrottle) -> None:
        """Replace a device's object, keeping the counts of devices throttled."""
        self._count(self.devices.get(device), -1)
        self._count(throttle, +1)
        self.devices[device] = throttle

    def drop(self, device: str | None) -> None:
        """Forget one device's object (None: every device's)."""
        if device is None:
            self.devices.clear()
            self._on.clear()
            return
        self._count(self.devices.pop(device, None), -1)

    def _count(self, throttle: DeviceThrottle | None, step: int) -> None:
        if throttle is not None and throttle.throttle is True:
            owner = throttle.owner
            count = self._on.get(owner, 0) + step
            if count:
                self._on[owner] = count
            else:
                self._on.pop(owner, None)

    # ------------------------------------------------------------------ instances
    def recheck(self, now: float) -> frozenset[str]:
        """Which instances are online at `now`; the owners that stopped being online since
        the last check while devices they own are throttled (their throttles are void now)."""
        live = frozenset(name for name, i in self.instances.items() if i.online(now))
        voided = frozenset(
            owner
            for owner in self._on
            if owner is not None and owner in self.live and owner not in live
        )
        self.live = live
        self.online = bool(live)
        return voided

    def silent_at(self) -> float:
        """When an instance that is online now stops counting (inf: never)."""
        return min((i.silent_at() for i in self.instances.values()), default=math.inf)

    # ------------------------------------------------------------------ the answer
    def holds(self) -> bool:
        """Whether a throttle object on counts: its owner online (without one: any instance)."""
        live = self.live
        return any(self.online if owner is None else owner in live for owner in self._on)

    def holding(self) -> tuple[str, ...]:
        """The devices whose object says `throttle: true`, sorted."""
        return tuple(sorted(d for d, t in self.devices.items() if t.throttle is True))

    def voided(self) -> tuple[str, ...]:
        """The devices whose object says `throttle: true` but whose owner is offline or
        silent, sorted."""
        live = self.live
        return tuple(
            sorted(
                d
                for d, t in self.devices.items()
                if t.throttle is True and t.owner is not None and t.owner not in live
            )
        )
