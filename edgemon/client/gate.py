"""`ThrottleGate`: the engine asks, every scheduler step, whether to hold back new prefills.

The gate follows, on paho's network thread, the retained throttle objects of the devices it
serves (`P/{device}/throttle` for each, or `P/+/throttle` for every device) and every
edgemon instance's status (`P/_edgemon/+/status`).

- **Devices.** `device` is one id, a comma-separated list, or `+` (every device on the broker,
  including devices that appear later). The gate holds while any followed device is
  throttled, with one hold clock. It keeps a count of the devices throttled, so the answer
  stays one attribute read however many devices it follows.
- **Online rule.** The gate does not know edgemon's instance id, so it keeps each instance's
  latest retained status and when it received it; edgemon counts as online while at least one
  instance says `online` and was heard from within 3 of its heartbeats (the `heartbeat_s` its
  status announces; edgemon republishes `online` every `heartbeat_s`). A stopped edgemon, a
  lost will or a broker restarted while edgemon was away therefore cannot hold the engine
  longer than 3 heartbeats. An emptied retained status forgets that instance.
- **Owners.** A throttle object that names its `owner` (the instance that owns the device,
  when devices are split across instances) counts only while that instance is online by the
  same rule: a crashed instance's retained `throttle: true` is void while the others run on
  (`GateState.voided`). An object without `owner` counts while any instance is online.
- **Subscriptions.** A topic filter the broker refuses (its ACL, say) is logged once as an
  error and shown in `GateState.refused`: the gate cannot hold for what it would bring.
- **Order.** Within one connection, a device's throttle object whose `seq` is not above the
  last one applied is ignored (a late duplicate or redelivery; edgemon's `seq` increases
  strictly, also across its restarts). On every (re)connect the gate forgets throttles and
  statuses and takes the broker's retained objects afresh; after a status of a new process
  (another `started_ms`), or an `online` of an instance that was not, the next object of each
  device is taken whatever its `seq`, so an edgemon restarted with its clock stepped back is
  not ignored. (A heartbeat, an `online` from the same process, changes nothing.)
- **Fail-open.** Disconnected, no `online` instance, no throttle object yet, one that cannot
  be read (which ends that device's throttle), or an exception inside the gate:
  `should_throttle_prefills()` is False.
- **Holds.** A hold begins at the first True answer. Once it has lasted `max_hold_ms`, the
  gate answers False until the scheduler reports, with `admitted()`, a step that admitted a
  waiting request or found none waiting (so new requests cannot starve, even when the first
  step after the release could not admit anything); the next True answer begins a new hold.
  Holds, held time and these releases are counted (`stats`); call
  `should_throttle_prefills()` and `admitted()` from one thread (the scheduler's).
"""

from __future__ import annotations

import math
import threading
import time
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Self

from edgemon.broker_url import parse_broker_url
from edgemon.client import _mqtt
from edgemon.client._gate_book import ThrottleBook
from edgemon.client._gate_env import ENV as _ENV
from edgemon.client._gate_env import environment_warnings
from edgemon.client._gate_views import (
    ALL_DEVICES,
    DeviceThrottle,
    GateState,
    GateStats,
    read_status,
    read_throttle,
)
from edgemon.protocol import check_topic_prefix

if TYPE_CHECKING:
    import os
    from collections.abc import Callable, Mapping
    from types import TracebackType

    import paho.mqtt.client as mqtt

__all__ = ["ALL_DEVICES", "DeviceThrottle", "GateState", "GateStats", "ThrottleGate"]


class ThrottleGate:
    """Holds back prefills while edgemon says a followed device's streams are at risk."""

    __slots__ = (
        "_activations",
        "_active",
        "_book",
        "_broker",
        "_changed_at",
        "_client",
        "_client_id",
        "_clock",
        "_cond",
        "_connected",
        "_errors",
        "_held_s",
        "_hold_of",
        "_hold_start",
        "_holds",
        "_inactive_at",
        "_last_seq",
        "_last_t_ms",
        "_max_hold_releases",
        "_max_hold_s",
        "_prefix",
        "_refused",
        "_release_of",
        "_releasing",
        "_stale",
        "_status_prefix",
        "_stop",
        "_subscribing",
        "_trusted",
        "_unreachable",
        "_unreadable",
        "_watcher",
        "device",
        "following",
        "max_hold_ms",
    )

    def __init__(  # noqa: PLR0913 - the contract's keywords plus the connection's options
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
        password_file: str | os.PathLike[str] | None = None,
        ca_file: str | os.PathLike[str] | None = None,
        cert_file: str | os.PathLike[str] | None = None,
        key_file: str | os.PathLike[str] | None = None,
    ) -> None:
        #: The devices followed: `("+",)` for every device, else the ids, sorted.
        self.following = _mqtt.check_devices(device)
        #: The same as one string (`"+"`, `"a"`, `"a,b"`).
        self.device = ",".join(self.following)
        self._prefix = check_topic_prefix(topic_prefix)
        self._broker = parse_broker_url(
            broker_url,
            username=username,
            password=password,
            password_file=password_file,
            ca_file=ca_file,
            cert_file=cert_file,
            key_file=key_file,
        )
        self._unreachable = _mqtt.Unreachable(f"edgemon gate {self.device}", self._broker)
        if (
            isinstance(max_hold_ms, bool)
            or not isinstance(max_hold_ms, int | float)
            or not 0 < max_hold_ms <= 3_600_000
        ):
            raise ValueError(f"max_hold_ms must be 0 < x ≤ 3600000, not {max_hold_ms!r}")
        self.max_hold_ms = float(max_hold_ms)
        self._max_hold_s = self.max_hold_ms / 1000
        self._status_prefix = f"{self._prefix}/_edgemon/"
        name = "all" if self.following == (ALL_DEVICES,) else "_".join(self.following)[:64]
        self._client_id = client_id or _mqtt.default_client_id("gate", name)
        self._clock = clock or time.monotonic
        self._cond = threading.Condition(threading.RLock())  # `stats` in a predicate
        # Written by the network thread (and the watcher) under the lock.
        self._connected = False
        self._book = ThrottleBook()  # throttle objects and statuses: the answer rests on them
        self._trusted: set[str] = set()  # devices whose next object is taken whatever its seq
        self._subscribing: dict[int, list[str]] = {}  # the filters of a SUBSCRIBE, by its id
        self._refused: tuple[str, ...] = ()  # filters the broker refused (`GateState.refused`)
        self._last_seq: int | None = None
        self._last_t_ms: float | None = None
        self._changed_at = self._clock()
        self._active = False  # the one attribute the hot path reads
        self._inactive_at = 0.0  # when the gate last went inactive
        self._activations = 0  # how often it went active
        self._client: mqtt.Client | None = None
        self._watcher: threading.Thread | None = None
        self._stop = False
        # Written by the caller of should_throttle_prefills() only.
        self._hold_start: float | None = None
        self._hold_of = 0  # the activation the current hold belongs to
        self._releasing = False  # released by max_hold_ms, until a step admits
        self._release_of = 0  # the activation that release belongs to
        self._holds = 0
        self._held_s = 0.0
        self._max_hold_releases = 0
        self._stale = 0
        self._unreadable = 0
        self._errors = 0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> ThrottleGate | None:
        """A gate (not opened) from `EDGEMON_GATE_*`; None without `EDGEMON_GATE_DEVICE`.

        Connection: `BROKER`, and `USERNAME`, `PASSWORD_FILE` and `CA_FILE` (docs/client.md).
        Bad values raise ValueError naming the variable; a variable no gate reads (a
        misspelling) is logged as a warning.
        """
        for problem in environment_warnings(environ):
            _mqtt.log.warning("edgemon gate: %s", problem)
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
        kwargs |= _connection_from_environ(environ, broker)
        for name, check in (
            ("DEVICE", lambda: _mqtt.check_devices(device)),
            ("BROKER", lambda: parse_broker_url(broker)),
            ("TOPIC_PREFIX", lambda: check_topic_prefix(prefix or "edgemon/v1")),
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
            client.on_connect_fail = self._on_connect_fail
            client.on_disconnect = self._on_disconnect
            client.on_message = self._on_message
            client.on_subscribe = self._on_subscribe
            self._client = client
            self._stop = False
            self._watcher = threading.Thread(
                target=self._watch, name="edgemon-gate-heartbeats", daemon=True
            )
            self._watcher.start()
        _mqtt.start(client, self._broker)
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Disconnect and stop the network thread (waiting at most `timeout` s); the gate
        answers False from then on."""
        with self._cond:
            client, self._client = self._client, None
            watcher, self._watcher = self._watcher, None
            self._stop = True
            self._connected = False
            self._refresh()
        if watcher is not None:
            watcher.join(max(0.0, timeout))
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
        try:
            start = self._hold_start
            if not self._active:
                if start is not None:
                    self._end_hold(start)
                return False
            if self._releasing:
                if self._release_of == self._activations:
                    return False  # released by max_hold_ms: until a step admits
                self._releasing = False  # the throttle went off and on again since
            now = self._clock()
            if start is not None and self._hold_of != self._activations:
                self._end_hold(start)  # the gate went inactive and active again since
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
                self._releasing = True
                self._release_of = self._activations
                return False
        except Exception:  # noqa: BLE001 - whatever it is, the engine must not stop
            self._failed("should_throttle_prefills")
            return False
        return True

    def admitted(self) -> None:
        """The scheduler's report: a step admitted a waiting request, or none was waiting.
        Ends a release by `max_hold_ms` (the next True answer begins a new hold)."""
        self._releasing = False

    @property
    def releasing(self) -> bool:
        """Whether a `max_hold_ms` release waits for a step that admits (see `admitted`)."""
        return self._releasing and self._active and self._release_of == self._activations

    def _end_hold(self, start: float) -> None:
        """The hold ended when the gate last went inactive (as the network thread saw it)."""
        self._held_s += max(0.0, self._inactive_at - start)
        self._hold_start = None

    def _failed(self, where: str) -> None:
        """Count an exception caught inside the gate; log the first one with its traceback."""
        self._errors += 1
        if self._errors == 1:
            _mqtt.log.exception(
                "edgemon gate %s: an error in %s; answering 'do not hold' (further errors "
                "are counted in stats.errors, not logged)",
                self.device,
                where,
            )

    # ------------------------------------------------------------------ views
    @property
    def state(self) -> GateState:
        """What the gate knows now."""
        with self._cond:
            return self._snapshot()

    @property
    def stats(self) -> GateStats:
        """Holds, held time and releases so far (the current hold counted up to now)."""
        held = self._held_s
        start = self._hold_start
        if start is not None:
            current = self._active and self._hold_of == self._activations
            end = self._clock() if current else self._inactive_at
            held += max(0.0, end - start)
        with self._cond:
            holding = self._book.holding()
        return GateStats(
            holds=self._holds,
            held_s=held,
            max_hold_releases=self._max_hold_releases,
            stale_ignored=self._stale,
            unreadable=self._unreadable,
            following=self.following,
            holding=holding,
            errors=self._errors,
        )

    def wait_connected(self, timeout: float) -> bool:
        """Wait until the gate is connected to the broker; False if `timeout` s pass first."""
        return self.wait_until(lambda state: state.connected, timeout)

    def wait_until(self, predicate: Callable[[GateState], bool], timeout: float) -> bool:
        """Wait until `predicate(state)` holds (checked on every change); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self._snapshot()), timeout)

    def _snapshot(self) -> GateState:
        """The state (under the lock)."""
        book = self._book
        devices = book.devices
        holding = book.holding()
        shown = [devices[d] for d in holding] or list(devices.values())
        throttle: bool | None = True if holding else None
        if not holding and any(t.throttle is False for t in devices.values()):
            throttle = False
        headrooms = [t.min_headroom_ms for t in shown if t.min_headroom_ms is not None]
        now = self._clock()
        return GateState(
            connected=self._connected,
            edgemon_online=book.online,
            throttle=throttle,
            seq=self._last_seq,
            t_ms=self._last_t_ms,
            streams=tuple(s for t in shown for s in t.streams),
            min_headroom_ms=min(headrooms) if headrooms else None,
            instances=MappingProxyType({name: i.shown(now) for name, i in book.instances.items()}),
            following=self.following,
            holding=holding,
            devices=MappingProxyType(dict(devices)),
            changed_at=self._changed_at,
            voided=book.voided(),
            refused=self._refused,
        )

    # ------------------------------------------------------------------ network thread
    def _refresh(self) -> None:
        """After a change (under the lock): the answer's flag, last, and wake waiters."""
        now = self._clock()
        self._changed_at = now
        active = self._connected and self._book.holds()
        # The hot path reads these without the lock: the bookkeeping goes first, the flag last.
        if self._active and not active:
            self._inactive_at = now
        elif active and not self._active:
            self._activations += 1
        self._active = active
        self._cond.notify_all()

    def _watch(self) -> None:
        """The heartbeat watcher: an `online` instance not heard from for 3 of its
        heartbeats stops counting, at that moment (the network thread may be quiet)."""
        with self._cond:
            while not self._stop:
                try:
                    due = self._check_heartbeats()
                except Exception:  # noqa: BLE001 - the watcher must go on watching
                    self._failed("the heartbeat watcher")
                    due = 1.0
                self._cond.wait(None if due == math.inf else max(0.001, due))

    def _check_heartbeats(self) -> float:
        """Whether edgemon is online now (under the lock); seconds until that may change."""
        now = self._clock()
        book = self._book
        was, live = book.online, book.live
        self._voided(book.recheck(now))
        if book.online != was or book.live != live:
            if was and not book.online:
                _mqtt.log.warning(
                    "edgemon gate %s: no edgemon instance heard from within 3 heartbeats; "
                    "not holding until one is",
                    self.device,
                )
            self._refresh()
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

    def _on_connect(
        self, client: mqtt.Client, _userdata: Any, _flags: Any, reason_code: Any, _properties: Any
    ) -> None:
        if client is not self._client:  # closed meanwhile
            return
        if reason_code.is_failure:
            self._unreachable.failed(f"the broker refused the connection: {reason_code}")
            return
        self._unreachable.connected()
        _mqtt.log.info("edgemon gate %s: connected to the broker", self.device)
        with self._cond:
            self._connected = True
            self._book = ThrottleBook()
            self._trusted.clear()
            self._subscribing.clear()  # a SUBACK lost with the last connection never comes
            self._last_seq = self._last_t_ms = None
            self._refresh()
        prefix = self._prefix
        filters = [f"{prefix}/{device}/throttle" for device in self.following]
        filters.append(f"{self._status_prefix}+/status")
        _, mid = client.subscribe([(topic, 1) for topic in filters])
        if mid is not None:  # None: not sent (the connection is already gone)
            with self._cond:
                self._subscribing[mid] = filters

    def _on_subscribe(
        self, client: mqtt.Client, _userdata: Any, mid: int, reason_codes: Any, _properties: Any
    ) -> None:
        """The SUBACK: a filter the broker refused (reason 0x80 or above) is one error in the
        log and shows in `state.refused`; the gate cannot hold for it."""
        if client is not self._client:
            return
        try:
            with self._cond:
                filters = self._subscribing.pop(mid, None)
                if filters is None:
                    return
                codes = [int(getattr(code, "value", code)) for code in reason_codes]
                refused = tuple(
                    topic
                    for topic, code in zip(filters, codes + [0x80] * len(filters), strict=False)
                    if code >= 0x80  # a SUBACK with fewer codes than filters refused the rest
                )
                said, self._refused = self._refused, refused
                self._refresh()
        except Exception:  # noqa: BLE001 - a SUBACK it cannot read must not stop the gate
            self._failed("the SUBACK's handling")
            return
        if refused and refused != said:
            _mqtt.log.error(
                "edgemon gate %s: the broker refused the subscription to %s (its ACL?); the "
                "gate cannot hold for what these topics would bring",
                self.device,
                ", ".join(refused),
            )

    def _on_connect_fail(self, client: mqtt.Client, _userdata: Any) -> None:
        if client is self._client:  # not closed meanwhile
            self._unreachable.failed("no connection")

    def _on_disconnect(
        self, client: mqtt.Client, _userdata: Any, _flags: Any, reason_code: Any, _properties: Any
    ) -> None:
        with self._cond:
            was_connected = self._connected
            self._connected = False
            self._refresh()
        if client is self._client and was_connected:  # not a close(), nor a refused attempt
            _mqtt.log.warning(
                "edgemon gate %s: lost the broker (%s); not holding until it is back",
                self.device,
                reason_code,
            )

    def _on_message(self, _client: mqtt.Client, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        try:
            topic = message.topic
            if topic.startswith(self._status_prefix) and topic.endswith("/status"):
                instance = topic[len(self._status_prefix) : -len("/status")]
                self._on_status(instance, bytes(message.payload))
                return
            device = topic[len(self._prefix) + 1 : -len("/throttle")]
            if (
                topic.startswith(self._prefix + "/")
                and topic.endswith("/throttle")
                and "/" not in device
                and (self.following == (ALL_DEVICES,) or device in self.following)
            ):
                self._on_throttle(device, bytes(message.payload))
        except Exception:  # noqa: BLE001 - a bad message must not end up holding anything
            with self._cond:
                self._book.drop(None)
                self._refresh()
            self._failed("a message's handling (every throttle forgotten)")

    def _on_throttle(self, device: str, payload: bytes) -> None:
        now = self._clock()
        value = read_throttle(payload, now) if payload else None
        with self._cond:
            book = self._book
            old = book.devices.get(device)
            if not payload:  # the retained object was removed
                book.drop(device)
            elif value is None:  # unreadable: that device's throttle ends (fail-open)
                self._unreadable += 1
                if old is not None:
                    book.put(device, DeviceThrottle(None, old.seq, changed_at=now))
            elif (
                device not in self._trusted
                and old is not None
                and old.seq is not None
                and value.seq is not None
                and value.seq <= old.seq
            ):
                self._stale += 1
                self._cond.notify_all()
                return
            else:
                self._trusted.discard(device)
                book.put(device, value)
                self._last_seq, self._last_t_ms = value.seq, value.t_ms
            self._refresh()

    def _on_status(self, instance: str, payload: bytes) -> None:
        now = self._clock()
        value = read_status(payload, now) if payload else None
        with self._cond:
            book = self._book
            if not payload:
                book.instances.pop(instance, None)
            elif value is None:
                self._unreadable += 1
                self._cond.notify_all()
                return
            else:
                was = book.instances.get(instance)
                book.instances[instance] = value
                if (
                    was is None
                    or was.started_ms != value.started_ms
                    or (value.state == "online" and not was.online(now))
                ):
                    self._trusted = set(book.devices)  # perhaps a restart: see Order
            self._voided(book.recheck(now))
            self._refresh()


def _connection_from_environ(environ: Mapping[str, str], broker: str) -> dict[str, Any]:
    """`username`, `password_file` and `ca_file` from `EDGEMON_GATE_*`, each checked against
    `broker` (ValueError naming the variable)."""
    kwargs: dict[str, Any] = {}
    for name, key in (
        ("USERNAME", "username"),
        ("PASSWORD_FILE", "password_file"),
        ("CA_FILE", "ca_file"),
    ):
        value = environ.get(f"{_ENV}{name}", "").strip()
        if not value:
            continue
        try:
            parse_broker_url(broker, **(kwargs | {key: value}))
        except ValueError as exc:
            raise ValueError(f"{_ENV}{name}: {exc}") from None
        kwargs[key] = value
    return kwargs
