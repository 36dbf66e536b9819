"""The daemon (`edgemon run`): MQTT in and out, the deadline timer, HTTP, systemd, logs."""

from __future__ import annotations

from edgemon.daemon.app import SHUTDOWN_TIMEOUT_S, Daemon
from edgemon.daemon.wall_clock import Clock, MonotonicWallClock

__all__ = ["SHUTDOWN_TIMEOUT_S", "Clock", "Daemon", "MonotonicWallClock"]
