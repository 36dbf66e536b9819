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
from edgemon.engine.capacity import CapacityRecord
from edgemon.engine.device import Device
from edgemon.engine.headroom import INF
from edgemon.engine.outputs import DeviceForgotten

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from edgemon.capacity_object import Capacity
    from edgemon.engine.config import EngineConfig
    from edgemon.engine.events import Event
    from edgemon.engine.outputs import Output, ThrottleChanged
    from edgemon.engine.tts import TtsEngineInfo


class _Booking:
    """The engine's own bookkeeping of one device: its entries in the engine's queues."""

    __slots__ = ("decision_pending", "device", "forget_due", "wall_due")

    def __init__(self, device: Device) -> None:
        self.device = device
        #: When its next timer falls due (wall ms): the live entry of the timer queue.
        self.wall_due = INF
        #: When it is forgotten if it stays idle (wall ms): the live entry of the idle queue.
        self.forget_due = INF
        #: Changed by messages: its throttle decision waits for `advance`.
        self.decision_pending = False


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
        self._devices: dict[str, _Booking] = {}
        self._queue: list[tuple[float, int, _Booking]] = []
        #: When idle devices are forgotten (reliability.md device lifecycle), on the wall clock.
        self._idle: list[tuple[float, int, _Booking]] = []
        #: Input interrupted now; and until when (wall) late chunks may still come after it.
        self._input_down = False
        self._patient_wall = -INF
        #: Devices changed by messages whose throttle decision waits for `advance`.
        self._pending: list[_Booking] = []
        self._tiebreak = count()
        self._sample_every_ms = sample_every_ms

    @property
    def config(self) -> EngineConfig:
        """The configuration in force."""
        return self._config

    def devices(self) -> Iterator[Device]:
        """Every device known now (read-only use: views and metrics)."""
        return (book.device for book in self._devices.values())

    def device(self, device_id: str) -> Device | None:
        """One device, if known now."""
        book = self._devices.get(device_id)
        return None if book is None else book.device

    def _device_for(self, device_id: str) -> _Booking | None:
        book = self._devices.get(device_id)
        if book is None:
            if len(self._devices) >= self._config.limits.max_devices:
                return None
            device = Device(device_id, self._config, sample_every_ms=self._sample_every_ms)
            device.lateness.confirm_held = self._input_down
            device.lateness.patient_wall = self._patient_wall
            book = self._devices[device_id] = _Booking(device)
        return book

    # ------------------------------------------------------------------ input
    def apply(
        self, device_id: str, events: Sequence[Event], recv_ms: float, out: list[Output]
    ) -> list[str]:
        """Apply one message's valid events, received at wall time `recv_ms`.

        Returns each event's `result` label. The events take effect at one device instant:
        the device's clock at receipt, after every timer due strictly before it
        (`Device.receive`).
        """
        book = self._devices.get(device_id) or self._device_for(device_id)
        if book is None:
            return ["device_limit"] * len(events)
        device = book.device
        device.last_message_wall_ms = recv_ms
        results = device.receive(events, recv_ms, out)
        if device.throttle.dirty and not book.decision_pending:
            book.decision_pending = True
            self._pending.append(book)
        self._schedule(book)
        return results

    def apply_engine_info(
        self, device_id: str, info: TtsEngineInfo, recv_ms: float, out: list[Output]
    ) -> str:
        """Take a device's engine object; its margin applies from the device's current instant."""
        book = self._device_for(device_id)
        if book is None:
            return "device_limit"
        device = book.device
        device.last_message_wall_ms = recv_ms
        at = device.clock.now(recv_ms)
        device.catch_up(at, out)
        device.clock.reach(at, recv_ms)
        device.set_engine_info(info, at)
        self._decide_later(book)
        self._schedule(book)
        return "accepted"

    def apply_capacity(self, device_id: str, capacity: Capacity, recv_ms: float) -> str:
        """Take a device's capacity object, received at wall time `recv_ms`: it is kept for the
        adapters and changes nothing of the device's streams or throttle."""
        book = self._device_for(device_id)
        if book is None:
            return "device_limit"
        device = book.device
        device.last_message_wall_ms = recv_ms
        record = device.capacity
        if record is None:
            device.capacity = CapacityRecord(capacity, recv_ms)
        else:
            record.update(capacity, recv_ms)
        self._schedule(book)
        return "accepted"

    def void_capacity(self, device_id: str, recv_ms: float) -> None:
        """A device's capacity object was unreadable, or its topic emptied: its last one is
        void (nothing is known until the next). A device not known is not made for it."""
        device = self.device(device_id)
        if device is not None and device.capacity is not None:
            device.capacity.void(recv_ms)

    def forget_engine_info(self, device_id: str, recv_ms: float, out: list[Output]) -> None:
        """A device's engine topic was emptied: its engine object no longer applies (margins
        fall back to the configuration's). A device not known is not made for it."""
        book = self._devices.get(device_id)
        if book is None or book.device.engine_info is None:
            return
        device = book.device
        at = device.clock.now(recv_ms)
        device.catch_up(at, out)
        device.clock.reach(at, recv_ms)
        device.set_engine_info(None, at)
        self._decide_later(book)
        self._schedule(book)

    def reconfigure(self, config: EngineConfig, wall_ms: float, out: list[Output]) -> None:
        """Adopt a reloaded configuration (margins, overrides, policy) keeping all streams."""
        self._config = config
        for book in self._devices.values():
            device = book.device
            at = device.clock.now(wall_ms)
            device.catch_up(at, out)
            device.clock.reach(at, wall_ms)
            device.reconfigure(config, at)
            self._decide_later(book)
            self._schedule(book)

    def input_lost(self) -> None:
        """edgemon's input is interrupted (broker unreachable): no late chunk can arrive, so
        no provisional underrun is confirmed for want of one until `input_restored`."""
        self._input_down = True
        for device in self.devices():
            device.lateness.hold_confirmations()

    def input_restored(self, wall_ms: float) -> None:
        """Input flows again at wall time `wall_ms`: the waits for late chunks start afresh,
        for devices known and for devices first heard of in the backlog."""
        self._input_down = False
        self._patient_wall = wall_ms + self._config.slack.allowed_lateness_ms
        for book in self._devices.values():
            device = book.device
            now = device.clock.now(wall_ms)
            device.lateness.resume_confirmations(now, wall_ms, device.streams.values())
            self._schedule(book)

    def release_all(self, wall_ms: float, out: list[Output]) -> None:
        """Turn every device's throttle off now (a clean stop must leave no engine held back)."""
        for device in self.devices():
            device.release(device.clock.now(wall_ms), out)

    def throttle_states(self, wall_ms: float) -> list[ThrottleChanged]:
        """Every known device's throttle as it stands at wall time `wall_ms`, stamped with the
        device's clock then (call `advance(wall_ms)` first: the decisions due by then)."""
        return [device.throttle_state(device.clock.now(wall_ms)) for device in self.devices()]

    # ------------------------------------------------------------------ snapshots
    def snapshot(self, wall_ms: float) -> dict[str, Any]:
        """The state at wall time `wall_ms` as JSON values (see `edgemon.engine.snapshot`)."""
        return snapshot.take(self.devices(), wall_ms)

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
            device.sampler.every_ms = sample_every_ms
            book = engine._devices[device.id] = _Booking(device)
            engine._decide_later(book)
            engine._schedule(book)
        return engine

    # ------------------------------------------------------------------ time
    def advance(self, wall_ms: float, out: list[Output], *, inclusive: bool = True) -> None:
        """Fire, in time order, every timer due by wall time `wall_ms`.

        `inclusive=False` stops short of timers due exactly at `wall_ms`, for a caller that
        still has messages received at `wall_ms` to apply first.
        """
        if self._pending:
            self._decide_pending(wall_ms, out, inclusive=inclusive)
        queue = self._queue
        while queue and (queue[0][0] <= wall_ms if inclusive else queue[0][0] < wall_ms):
            due, _, book = heappop(queue)
            if due != book.wall_due:
                continue  # superseded by an earlier entry
            book.wall_due = INF
            device = book.device
            instant = device.timers.next_due()
            # Fired only if the device's earliest timer is still due when its entry said: a
            # message at the entry's instant may have moved it later, and then another
            # device's earlier timer must fire first (outputs come in wall-time order).
            if instant != INF and device.clock.to_wall(instant) <= due:
                device.fire(out)
            self._schedule(book)
        idle = self._idle
        while idle and (idle[0][0] <= wall_ms if inclusive else idle[0][0] < wall_ms):
            due, _, book = heappop(idle)
            if due == book.forget_due:
                book.forget_due = INF  # `_schedule` arms it again if it stays known
                if self._idle_device(book):
                    self._forget(book, wall_ms, out)

    def _decide_later(self, book: _Booking) -> None:
        if book.device.throttle.dirty and not book.decision_pending:
            book.decision_pending = True
            self._pending.append(book)

    def _decide_pending(self, wall_ms: float, out: list[Output], *, inclusive: bool) -> None:
        """Throttle decisions for the instants of messages applied by now."""
        waiting: list[_Booking] = []
        for book in self._pending:
            when = book.device.clock.floor_wall_ms
            if when <= wall_ms if inclusive else when < wall_ms:
                book.decision_pending = False
                book.device.decide_now(out)
                self._schedule(book)
            else:
                waiting.append(book)
        self._pending = waiting

    def next_deadline(self) -> float | None:
        """Wall time of the earliest pending timer (−inf: due now), or None if there is none."""
        if self._pending:
            return min(book.device.clock.floor_wall_ms for book in self._pending)
        queue = self._queue
        while queue and queue[0][0] != queue[0][2].wall_due:
            heappop(queue)
        idle = self._idle
        while idle and not (idle[0][0] == idle[0][2].forget_due and self._idle_device(idle[0][2])):
            due, _, book = heappop(idle)
            if book.forget_due == due:
                book.forget_due = INF  # busy again: `_schedule` arms it when idle
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

    def _schedule(self, book: _Booking) -> None:
        device = book.device
        instant = device.timers.next_due()
        if instant != INF:
            due = device.clock.to_wall(instant)
            if due < book.wall_due:
                book.wall_due = due
                heappush(self._queue, (due, next(self._tiebreak), book))
        if not device.streams and not device.throttle_on:
            forget = device.last_message_wall_ms + self._config.limits.device_idle_ms
            if forget != book.forget_due:
                book.forget_due = forget
                heappush(self._idle, (forget, next(self._tiebreak), book))

    def _idle_device(self, book: _Booking) -> bool:
        """Known, and with no stream, no throttle, no decision pending: forgettable once idle."""
        device = book.device
        return (
            self._devices.get(device.id) is book
            and not device.streams
            and not device.throttle_on
            and not book.decision_pending
        )

    def _forget(self, book: _Booking, wall_ms: float, out: list[Output]) -> None:
        """Drop an idle device: its state, hence its series and its snapshot entry
        (docs/reliability.md)."""
        device = book.device
        del self._devices[device.id]
        book.wall_due = math.nan  # its entries in the timer queue are stale from now on
        out.append(DeviceForgotten(device.id, device.clock.now(wall_ms), wall_ms, device.stats))
