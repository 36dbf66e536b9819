"""Topic names (docs/protocol.md, "Topics"): `P/{device}/events`, `P/{device}/engine`,
`P/{device}/capacity`, throttle and status."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from edgemon import protocol

Kind = Literal["events", "engine", "capacity"]

#: Routes remembered by default: three topics per device at the default `max_devices` (1,000),
#: with room to spare.
CACHED_ROUTES = 4096


@dataclass(frozen=True, slots=True)
class Topics:
    """Topic names under one prefix.

    `parse` remembers the routes of up to `cached` topics (a dict lookup instead of a regex
    per message); when that many are known it starts over, so memory stays bounded whatever
    topics arrive. Topics that are not ours are never remembered.
    """

    prefix: str = protocol.TOPIC_PREFIX
    cached: int = CACHED_ROUTES
    _routes: dict[str, tuple[str, Kind]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def remembered(self) -> int:
        """How many routes `parse` holds now (at most `cached`)."""
        return len(self._routes)

    @property
    def subscriptions(self) -> tuple[str, ...]:
        """What edgemon subscribes to."""
        return (f"{self.prefix}/+/events", f"{self.prefix}/+/engine", f"{self.prefix}/+/capacity")

    def throttle(self, device: str) -> str:
        """Where a device's throttle object is published."""
        return f"{self.prefix}/{device}/throttle"

    def slack(self, device: str) -> str:
        """Where a device's slack feed is published."""
        return f"{self.prefix}/{device}/slack"

    def status(self, instance: str) -> str:
        """Where an edgemon instance announces itself."""
        return f"{self.prefix}/_edgemon/{instance}/status"

    def parse(self, topic: str) -> tuple[str, Kind] | None:
        """`(device, kind)` of an inbound topic, or None if it is not one of ours."""
        route = self._routes.get(topic)
        if route is None:
            route = self._parse(topic)
            if route is not None:
                routes = self._routes
                if len(routes) >= self.cached:
                    routes.clear()
                routes[topic] = route
        return route

    def _parse(self, topic: str) -> tuple[str, Kind] | None:
        prefix = self.prefix
        if not topic.startswith(prefix) or topic[len(prefix) : len(prefix) + 1] != "/":
            return None
        device, _, kind = topic[len(prefix) + 1 :].partition("/")
        if not protocol.valid_device_id(device):
            return None
        if kind == "events":
            return device, "events"
        if kind == "engine":
            return device, "engine"
        if kind == "capacity":
            return device, "capacity"
        return None


def valid_device_id(device: str) -> bool:
    """Whether `device` is a valid topic-level device name (not the reserved `_edgemon`)."""
    return protocol.valid_device_id(device)
