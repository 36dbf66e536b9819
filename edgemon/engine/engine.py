"""The engine: all devices, driven by messages and by the clock (pure, clock-injected).

The caller hands in validated events with the wall time they were received and asks the
engine to advance to a wall time; the engine returns what happened, each output stamped with
its exact device-clock instant. `next_deadline()` says when to call `advance` next, so the
daemon sleeps until exactly then and `replay` jumps there on its virtual clock.
"""

from __future__ import annotations

import math
from heapq import heappop, heappush
from itertools import count
from typing import TYPE_CHECKING, Any

from edgemon.engine import snapshot
from edgemon.engine.device import Device
from edgemon.engine.headroom import INF
from edgemon.engine.outputs import DeviceForgotten

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from edgemon.engine.config import EngineConfig
    from edgemon.engine.events import Event
    from edgemon.engine.outputs import Output, ThrottleChanged
    from edgemon.engine.tts import TtsEngineInfo


class Engine:
    """Devices by id, and a queue of when each device's next timer falls due on the wall clock.

    Each device keeps its own timer heap on its own clock; the engine's queue holds one entry
    per device with a pending timer, so a device's clock offset can change without touching
    the timers of its streams.
    """

    __slots__ = (
        "_config",
        "_devices",
        "_idle",
        "_input_down",
        "_patient_wall",
        "_pending",
        "_queue",
        "_sample_every_ms",
        "_tiebreak",
    )

    def __init__(self, config: EngineConfig, *, sample_every_ms: float | None = None) -> None:
        self._config = config
        self._devices: dict[str, Device] = {}
        self._queue: list[tuple[float, int, Device]] = []
        #: When idle devices are forgotten (reliability.md device lifecycle), on the wall clock.
        self._idle: list[tuple[float, int, Device]] = []
        #: Input interrupted now; and until when (wall) late chunks may still come after it.
        self._input_down = False
        self._patient_wall = -INF
        #: Devices changed by messages whose throttle decision waits for `advance`.
        self._pending: list[Device] = []
        self._tiebreak = count()
        self._sample_every_ms = sample_every_ms

    @property
    def config(self) -> EngineConfig:
        """The configuration in force."""
        return self._config

    def devices(self) -> Iterator[Device]:
        """Every device known now (read-only use: views and metrics)."""
        return iter(self._devices.values())

    def device(self, device_id: str) -> Device | None:
        """One device, if known now."""
        return self._devices.get(device_id)

    def _device_for(self, device_id: str) -> Device | None:
        device = self._devices.get(device_id)
        if device is None:
            if len(self._devices) >= self._config.limits.max_devices:
                return None
            device = Device(device_id, self._config, sample_every_ms=self._sample_every_ms)
            device.confirm_held = self._input_down
            device.patient_wall = self._patient_wall
            self._devices[device_id] = device
        return device

    # ------------------------------------------------------------------ input
    def apply(  # noqa: C901 - the hot path, inlined on purpose
        self, device_id: str, events: Sequence[Event], recv_ms: float, out: list[Output]
    ) -> list[str]:
        """Apply one message's valid events, received at wall time `recv_ms`.

        Returns each event's `result` label. The events take effect at one device instant:
        the device's clock at receipt, after every timer due strictly before it.
        """
        device = self._devices.get(device_id) or self._device_for(device_id)
        if device is None:
            return ["device_limit"] * len(events)
        device.last_message_wall_ms = recv_ms
        clock = device.clock
        if not all(clock.admits(recv_ms, event.t_ms) for event in events):
            return self._apply_admitted(device, events, recv_ms, out)
        at = clock.floor_ms
        latest = device.event_time
        for event in events:
            clock.observe(recv_ms, event.t_ms)
            if event.t_ms > latest:
                latest = event.t_ms
        if latest > at:
            at = latest  # a device's clock is never behind what it reported
        now = clock.now(recv_ms)
        if now > at:
            at = now
        if device.timers and device.timers[0][0] < at:
            device.catch_up(at, out)
        clock.reach(at, recv_ms)
        if len(events) == 1:
            results = [device.apply(events[0], at, out)]
        else:
            results = [device.apply(event, at, out) for event in events]
        if latest > device.event_time:
            device.event_time = latest
            if device.provisional:
                device.pass_event_time(at, out)
        device.advance_horizon(at, recv_ms)  # after the events: they ended under the old one
        if device.dirty and not device.decision_pending:
            device.decision_pending = True
            self._pending.append(device)
        self._schedule(device)
        return results

    def _apply_admitted(
        self, device: Device, events: Sequence[Event], recv_ms: float, out: list[Output]
    ) -> list[str]:
        """The rare path: some events claim a time far ahead of the device's clock."""
        admitted = [e for e in events if device.clock.admits(recv_ms, e.t_ms)]
        results = iter(self.apply(device.id, admitted, recv_ms, out) if admitted else [])
        kept = {id(e) for e in admitted}
        return [next(results) if id(e) in kept else "clock_jump" for e in events]

    def apply_engine_info(
        self, device_id: str, info: TtsEngineInfo, recv_ms: float, out: list[Output]
    ) -> str:
        """Take a device's engine object; its margin applies from the device's current instant."""
        device = self._device_for(device_id)
        if device is None:
            return "device_limit"
        device.last_message_wall_ms = recv_ms
        at = device.clock.now(recv_ms)
        device.catch_up(at, out)
        device.clock.reach(at, recv_ms)
        device.set_engine_info(info, at)
        self._settle_later(device)
        self._schedule(device)
        return "accepted"

    def reconfigure(self, config: EngineConfig, wall_ms: float, out: list[Output]) -> None:
        """Adopt a reloaded configuration (margins, overrides, policy) keeping all streams."""
        self._config = config
        for device in self._devices.values():
            at = device.clock.now(wall_ms)
            device.catch_up(at, out)
            device.clock.reach(at, wall_ms)
            device.reconfigure(config, at)
            self._settle_later(device)
            self._schedule(device)

    def input_lost(self) -> None:
        """edgemon's input is interrupted (broker unreachable): no late chunk can arrive, so
        no provisional underrun is confirmed for want of one until `input_restored`."""
        self._input_down = True
        for device in self._devices.values():
            device.hold_confirmations()

    def input_restored(self, wall_ms: float) -> None:
        """Input flows again at wall time `wall_ms`: the waits for late chunks start afresh,
        for devices known and for devices first heard of in the backlog."""
        self._input_down = False
        self._patient_wall = wall_ms + self._config.slack.allowed_lateness_ms
        for device in self._devices.values():
            device.resume_confirmations(device.clock.now(wall_ms), wall_ms)
            self._schedule(device)

    def release_all(self, wall_ms: float, out: list[Output]) -> None:
        """Turn every device's throttle off now (a clean stop must leave no engine held back)."""
        for device in self._devices.values():
            device.release(device.clock.now(wall_ms), out)

    def throttle_states(self, wall_ms: float) -> list[ThrottleChanged]:
        """Every known device's throttle as it stands at wall time `wall_ms`, stamped with the
        device's clock then (call `advance(wall_ms)` first: the decisions due by then)."""
        return [
            device.throttle_state(device.clock.now(wall_ms)) for device in self._devices.values()
        ]

    # ------------------------------------------------------------------ snapshots
    def snapshot(self, wall_ms: float) -> dict[str, Any]:
        """The state at wall time `wall_ms` as JSON values (see `edgemon.engine.snapshot`)."""
        return snapshot.take(self, wall_ms)

    @classmethod
    def restore(
        cls,
        data: dict[str, Any],
        config: EngineConfig,
        wall_ms: float,
        *,
        sample_every_ms: float | None = None,
    ) -> Engine:
        """An engine continuing from a snapshot, at wall time `wall_ms` (SnapshotError if bad);
        with `sample_every_ms`, its devices sample again from their next event."""
        engine = cls(config, sample_every_ms=sample_every_ms)
        for device in snapshot.restore_devices(data, config, wall_ms):
            device.sample_every_ms = sample_every_ms
            engine._devices[device.id] = device
            engine._settle_later(device)
            engine._schedule(device)
        return engine

    # ------------------------------------------------------------------ time
    def advance(self, wall_ms: float, out: list[Output], *, inclusive: bool = True) -> None:
        """Fire, in time order, every timer due by wall time `wall_ms`.

        `inclusive=False` stops short of timers due exactly at `wall_ms`, for a caller that
        still has messages received at `wall_ms` to apply first.
        """
        if self._pending:
            self._settle(wall_ms, out, inclusive=inclusive)
        queue = self._queue
        while queue and (queue[0][0] <= wall_ms if inclusive else queue[0][0] < wall_ms):
            due, _, device = heappop(queue)
            if due != device.wall_due:
                continue  # superseded by an earlier entry
            device.wall_due = INF
            instant = device.next_timer()
            if instant != INF:
                top = device.clock.to_wall(instant)
                if top <= wall_ms if inclusive else top < wall_ms:
                    device.fire(out)
            self._schedule(device)
        idle = self._idle
        while idle and (idle[0][0] <= wall_ms if inclusive else idle[0][0] < wall_ms):
            due, _, device = heappop(idle)
            if due == device.forget_due:
                device.forget_due = INF  # `_schedule` arms it again if it stays known
                if self._idle_device(device):
                    self._forget(device, wall_ms, out)

    def _settle_later(self, device: Device) -> None:
        if device.dirty and not device.decision_pending:
            device.decision_pending = True
            self._pending.append(device)

    def _settle(self, wall_ms: float, out: list[Output], *, inclusive: bool) -> None:
        """Throttle decisions for the instants of messages applied by now."""
        waiting: list[Device] = []
        for device in self._pending:
            when = device.clock.floor_wall_ms
            if when <= wall_ms if inclusive else when < wall_ms:
                device.decision_pending = False
                device.settle(out)
                self._schedule(device)
            else:
                waiting.append(device)
        self._pending = waiting

    def next_deadline(self) -> float | None:
        """Wall time of the earliest pending timer (−inf: due now), or None if there is none."""
        if self._pending:
            return min(device.clock.floor_wall_ms for device in self._pending)
        queue = self._queue
        while queue and queue[0][0] != queue[0][2].wall_due:
            heappop(queue)
        idle = self._idle
        while idle and not (idle[0][0] == idle[0][2].forget_due and self._idle_device(idle[0][2])):
            due, _, device = heappop(idle)
            if device.forget_due == due:
                device.forget_due = INF  # busy again: `_schedule` arms it when idle
        if queue and idle:
            return min(queue[0][0], idle[0][0])
        if queue or idle:
            return (queue or idle)[0][0]
        return None

    def deadline_floor(self) -> float:
        """At most `next_deadline()` (inf for none), in O(1): the heads of the timer heaps as
        they are, without dropping superseded entries first. For a caller that only needs to
        know whether the next deadline may have come earlier than one it already knows."""
        if self._pending:
            return -INF
        queue, idle = self._queue, self._idle
        due = queue[0][0] if queue else INF
        if idle and idle[0][0] < due:
            return idle[0][0]
        return due

    def _schedule(self, device: Device) -> None:
        instant = device.next_timer()
        if instant != INF:
            due = device.clock.to_wall(instant)
            if due < device.wall_due:
                device.wall_due = due
                heappush(self._queue, (due, next(self._tiebreak), device))
        if not device.streams and not device.throttle_on:
            forget = device.last_message_wall_ms + self._config.limits.device_idle_ms
            if forget != device.forget_due:
                device.forget_due = forget
                heappush(self._idle, (forget, next(self._tiebreak), device))

    def _idle_device(self, device: Device) -> bool:
        """Known, and with no stream, no throttle, no decision pending: forgettable once idle."""
        return (
            self._devices.get(device.id) is device
            and not device.streams
            and not device.throttle_on
            and not device.decision_pending
        )

    def _forget(self, device: Device, wall_ms: float, out: list[Output]) -> None:
        """Drop an idle device: its state, hence its series and its snapshot entry
        (docs/reliability.md)."""
        del self._devices[device.id]
        device.wall_due = math.nan  # its entries in the timer queue are stale from now on
        out.append(DeviceForgotten(device.id, device.clock.now(wall_ms), wall_ms, device.stats))
