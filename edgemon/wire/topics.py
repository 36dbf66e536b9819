"""Topic names of SPEC §1: `P/{device}/events`, `P/{device}/engine`, throttle and status."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

_DEVICE_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")

Kind = Literal["events", "engine"]


@dataclass(frozen=True, slots=True)
class Topics:
    """Topic names under one prefix."""

    prefix: str = "edgemon/v1"

    @property
    def subscriptions(self) -> tuple[str, str]:
        """What edgemon subscribes to."""
        return (f"{self.prefix}/+/events", f"{self.prefix}/+/engine")

    def throttle(self, device: str) -> str:
        """Where a device's throttle object is published."""
        return f"{self.prefix}/{device}/throttle"

    def status(self, instance: str) -> str:
        """Where an edgemon instance announces itself."""
        return f"{self.prefix}/_edgemon/{instance}/status"

    def parse(self, topic: str) -> tuple[str, Kind] | None:
        """`(device, kind)` of an inbound topic, or None if it is not one of ours."""
        prefix = self.prefix
        if not topic.startswith(prefix) or topic[len(prefix) : len(prefix) + 1] != "/":
            return None
        device, _, kind = topic[len(prefix) + 1 :].partition("/")
        if _DEVICE_ID.fullmatch(device) is None:
            return None
        if kind == "events":
            return device, "events"
        if kind == "engine":
            return device, "engine"
        return None


def valid_device_id(device: str) -> bool:
    """Whether `device` is a valid topic-level device name."""
    return _DEVICE_ID.fullmatch(device) is not None
