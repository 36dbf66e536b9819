"""`ThrottleGate`: the engine asks, every scheduler step, whether to hold back new prefills.

The gate follows two retained topics on paho's network thread: the device's throttle object
(`P/{device}/throttle`) and every edgemon instance's status (`P/_edgemon/+/status`).

- **Online rule.** The gate does not know edgemon's instance id, so it keeps each instance's
  latest retained status; edgemon counts as online while at least one instance says `online`.
  An emptied retained status forgets that instance.
- **Order.** Within one connection, a throttle object whose `seq` is not above the last one
  applied is ignored (a late duplicate or redelivery; edgemon's `seq` increases strictly, also
  across its restarts). On every (re)connect the gate forgets throttle and status and takes
  the broker's retained objects afresh; after an `online` status the next throttle object is
  taken whatever its `seq`, so an edgemon restarted with its clock stepped back is not ignored.
- **Fail-open.** Disconnected, no `online` instance, no throttle object yet, or one that cannot
  be read: `should_throttle_prefills()` is False.
- **Holds.** A hold begins at the first True answer. Once it has lasted `max_hold_ms`, one call
  answers False (one admission step goes through, so new requests cannot starve) and the next
  True answer begins a new hold. Holds, held time and these releases are counted (`stats`);
  call `should_throttle_prefills()` from one thread (the scheduler's).
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Self

from edgemon.client import _mqtt

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from types import TracebackType

    import paho.mqtt.client as mqtt

_ENV = "EDGEMON_GATE_"


@dataclass(frozen=True, slots=True)
class GateState:
    """What the gate knows (a snapshot, replaced on every change)."""

    #: Whether the gate is connected to the broker.
    connected: bool = False
    #: Whether at least one edgemon instance's retained status is `online`.
    edgemon_online: bool = False
    #: The throttle object's `throttle`; None while no object was received.
    throttle: bool | None = None
    #: The throttle object's `seq`, `t_ms` (edgemon's device-clock instant of the change),
    #: `streams` and `min_headroom_ms`.
    seq: int | None = None
    t_ms: float | None = None
    streams: tuple[str, ...] = ()
    min_headroom_ms: float | None = None
    #: Each known instance's latest status (`online` / `offline`).
    instances: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: The gate's clock when this state began.
    changed_at: float = 0.0

    @property
    def active(self) -> bool:
        """Throttle, edgemon online and connected (before the `max_hold_ms` rule)."""
        return self.connected and self.edgemon_online and self.throttle is True


@dataclass(frozen=True, slots=True)
class GateStats:
    """What the gate did (a snapshot)."""

    #: Holds begun (a True answer after a False one).
    holds: int
    #: Seconds spent holding, the current hold included.
    held_s: float
    #: Holds ended by `max_hold_ms` (one step let through).
    max_hold_releases: int
    #: Throttle objects ignored as out of order, and messages that could not be read.
    stale_ignored: int
    unreadable: int


class ThrottleGate:
    """Holds back prefills while edgemon says the device's streams are at risk."""

    __slots__ = (
        "_activations",
        "_active",
        "_broker",
        "_client",
        "_client_id",
        "_clock",
        "_cond",
        "_held_s",
        "_hold_of",
        "_hold_start",
        "_holds",
        "_inactive_at",
        "_max_hold_releases",
        "_max_hold_s",
        "_reset_seq",
        "_stale",
        "_state",
        "_status_prefix",
        "_throttle_topic",
        "_unreadable",
        "device",
        "max_hold_ms",
    )

    def __init__(
        self,
        broker_url: str,
        device: str,
        *,
        max_hold_ms: float = 2000.0,
        topic_prefix: str = "edgemon/v1",
        client_id: str | None = None,
        clock: Callable[[], float] | None = None,
        username: str | None = None,
        password: str | None = None,
    ) -> None:
        self.device = _mqtt.check_device(device)
        prefix = _mqtt.check_topic_prefix(topic_prefix)
        self._broker = _mqtt.parse_broker_url(broker_url, username=username, password=password)
        if (
            isinstance(max_hold_ms, bool)
            or not isinstance(max_hold_ms, int | float)
            or not 0 < max_hold_ms <= 3_600_000
        ):
            raise ValueError(f"max_hold_ms must be 0 < x ≤ 3600000, not {max_hold_ms!r}")
        self.max_hold_ms = float(max_hold_ms)
        self._max_hold_s = self.max_hold_ms / 1000
        self._throttle_topic = f"{prefix}/{device}/throttle"
        self._status_prefix = f"{prefix}/_edgemon/"
        self._client_id = client_id or _mqtt.default_client_id("gate", device, unique=True)
        self._clock = clock or time.monotonic
        self._cond = threading.Condition(threading.Lock())
        self._state = GateState(changed_at=self._clock())
        self._active = False  # the one attribute the hot path reads
        self._inactive_at = 0.0  # when the gate last went inactive
        self._activations = 0  # how often it went active
        self._reset_seq = True
        self._client: mqtt.Client | None = None
        # Written by the caller of should_throttle_prefills() only.
        self._hold_start: float | None = None
        self._hold_of = 0  # the activation the current hold belongs to
        self._holds = 0
        self._held_s = 0.0
        self._max_hold_releases = 0
        self._stale = 0
        self._unreadable = 0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> ThrottleGate | None:
        """A gate (not opened) from `EDGEMON_GATE_*`; None without `EDGEMON_GATE_DEVICE`.

        Bad values raise ValueError naming the variable.
        """
        device = environ.get(f"{_ENV}DEVICE", "").strip()
        if not device:
            return None
        kwargs: dict[str, Any] = {}
        hold = environ.get(f"{_ENV}MAX_HOLD_MS", "").strip()
        if hold:
            try:
                kwargs["max_hold_ms"] = float(hold)
            except ValueError:
                raise ValueError(f"{_ENV}MAX_HOLD_MS: {hold!r} is not a number") from None
            if not math.isfinite(kwargs["max_hold_ms"]):
                raise ValueError(f"{_ENV}MAX_HOLD_MS: {hold!r} is not a finite number")
        prefix = environ.get(f"{_ENV}TOPIC_PREFIX", "").strip()
        if prefix:
            kwargs["topic_prefix"] = prefix
        broker = environ.get(f"{_ENV}BROKER", "").strip() or "mqtt://127.0.0.1:1883"
        for name, check in (
            ("DEVICE", lambda: _mqtt.check_device(device)),
            ("BROKER", lambda: _mqtt.parse_broker_url(broker)),
            ("TOPIC_PREFIX", lambda: _mqtt.check_topic_prefix(prefix or "edgemon/v1")),
        ):
            try:
                check()
            except ValueError as exc:
                raise ValueError(f"{_ENV}{name}: {exc}") from None
        try:
            return cls(broker, device, **kwargs)
        except ValueError as exc:
            raise ValueError(f"{_ENV}MAX_HOLD_MS: {exc}") from None

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> Self:
        """Start the network thread (never waits for the broker); idempotent."""
        with self._cond:
            if self._client is not None:
                return self
            client = _mqtt.new_client(self._broker, client_id=self._client_id, clean_session=True)
            client.on_connect = self._on_connect
            client.on_disconnect = self._on_disconnect
            client.on_message = self._on_message
            self._client = client
        _mqtt.start(client, self._broker)
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Disconnect and stop the network thread (waiting at most `timeout` s); the gate
        answers False from then on."""
        with self._cond:
            client, self._client = self._client, None
            self._set(replace(self._state, connected=False))
        if client is not None:
            _mqtt.stop(client, timeout)

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ the hot path
    def should_throttle_prefills(self) -> bool:
        """Whether this scheduler step should admit no new prefill (see the module doc)."""
        start = self._hold_start
        if not self._active:
            if start is not None:
                self._end_hold(start)
            return False
        now = self._clock()
        if start is not None and self._hold_of != self._activations:
            self._end_hold(start)  # the gate went inactive and active again since the last call
            start = None
        if start is None:
            self._hold_start = now
            self._hold_of = self._activations
            self._holds += 1
            return True
        if now - start >= self._max_hold_s:
            self._held_s += now - start
            self._hold_start = None
            self._max_hold_releases += 1
            return False
        return True

    def _end_hold(self, start: float) -> None:
        """The hold ended when the gate last went inactive (as the network thread saw it)."""
        self._held_s += max(0.0, self._inactive_at - start)
        self._hold_start = None

    # ------------------------------------------------------------------ views
    @property
    def state(self) -> GateState:
        """What the gate knows now."""
        return self._state

    @property
    def stats(self) -> GateStats:
        """Holds, held time and releases so far (the current hold counted up to now)."""
        held = self._held_s
        start = self._hold_start
        if start is not None:
            current = self._active and self._hold_of == self._activations
            end = self._clock() if current else self._inactive_at
            held += max(0.0, end - start)
        return GateStats(
            holds=self._holds,
            held_s=held,
            max_hold_releases=self._max_hold_releases,
            stale_ignored=self._stale,
            unreadable=self._unreadable,
        )

    def wait_until(self, predicate: Callable[[GateState], bool], timeout: float) -> bool:
        """Wait until `predicate(state)` holds (checked on every change); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self._state), timeout)

    # ------------------------------------------------------------------ network thread
    def _set(self, state: GateState) -> None:
        """Publish a new state (under the lock) and wake waiters."""
        was_active = self._active
        # The hot path reads these without the lock: the bookkeeping goes first, the flag last.
        if was_active and not state.active:
            self._inactive_at = state.changed_at
        elif state.active and not was_active:
            self._activations += 1
        self._state = state
        self._active = state.active
        self._cond.notify_all()

    def _on_connect(
        self, client: mqtt.Client, _userdata: Any, _flags: Any, reason_code: Any, _properties: Any
    ) -> None:
        if client is not self._client:  # closed meanwhile
            return
        if reason_code.is_failure:
            _mqtt.log.warning("edgemon gate: broker refused the connection: %s", reason_code)
            return
        _mqtt.log.info("edgemon gate %s: connected to the broker", self.device)
        with self._cond:
            self._reset_seq = True
            self._set(GateState(connected=True, changed_at=self._clock()))
        client.subscribe([(self._throttle_topic, 1), (f"{self._status_prefix}+/status", 1)])

    def _on_disconnect(
        self, client: mqtt.Client, _userdata: Any, _flags: Any, reason_code: Any, _properties: Any
    ) -> None:
        if client is self._client:  # not a close()
            _mqtt.log.warning(
                "edgemon gate %s: lost the broker (%s); not holding until it is back",
                self.device,
                reason_code,
            )
        with self._cond:
            self._set(replace(self._state, connected=False, changed_at=self._clock()))

    def _on_message(self, _client: mqtt.Client, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        topic = message.topic
        if topic == self._throttle_topic:
            self._on_throttle(bytes(message.payload))
        elif topic.startswith(self._status_prefix) and topic.endswith("/status"):
            instance = topic[len(self._status_prefix) : -len("/status")]
            self._on_status(instance, bytes(message.payload))

    def _on_throttle(self, payload: bytes) -> None:
        value = _json(payload) if payload else None
        with self._cond:
            state = self._state
            if not payload:  # the retained object was removed
                self._set(replace(state, throttle=None, seq=None, changed_at=self._clock()))
                return
            throttle = value.get("throttle") if isinstance(value, dict) else None
            seq = value.get("seq") if isinstance(value, dict) else None
            if type(throttle) is not bool or type(seq) is not int:
                self._unreadable += 1
                self._cond.notify_all()
                return
            assert isinstance(value, dict)
            if not self._reset_seq and state.seq is not None and seq <= state.seq:
                self._stale += 1
                self._cond.notify_all()
                return
            self._reset_seq = False
            t_ms = value.get("t_ms")
            headroom = value.get("min_headroom_ms")
            streams = value.get("streams")
            self._set(
                replace(
                    state,
                    throttle=throttle,
                    seq=seq,
                    t_ms=_finite_or_none(t_ms),
                    min_headroom_ms=_finite_or_none(headroom),
                    streams=tuple(s for s in streams if isinstance(s, str))
                    if isinstance(streams, list)
                    else (),
                    changed_at=self._clock(),
                )
            )

    def _on_status(self, instance: str, payload: bytes) -> None:
        value = _json(payload) if payload else None
        with self._cond:
            instances = dict(self._state.instances)
            if not payload:
                instances.pop(instance, None)
            else:
                status = value.get("state") if isinstance(value, dict) else None
                if status not in {"online", "offline"}:
                    self._unreadable += 1
                    self._cond.notify_all()
                    return
                assert isinstance(status, str)
                instances[instance] = status
                if status == "online":
                    self._reset_seq = True
            online = "online" in instances.values()
            self._set(
                replace(
                    self._state,
                    instances=MappingProxyType(instances),
                    edgemon_online=online,
                    changed_at=self._clock(),
                )
            )


def _json(payload: bytes) -> Any:
    try:
        return json.loads(payload.decode("utf-8"))
    except (ValueError, RecursionError):
        return None


def _finite_or_none(value: object) -> float | None:
    """A finite JSON number as a float, else None."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None
