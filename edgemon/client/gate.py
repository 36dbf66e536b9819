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

import time
from typing import TYPE_CHECKING, Self

from edgemon.broker_url import parse_broker_url
from edgemon.client import _mqtt
from edgemon.client._gate_heard import Heard
from edgemon.client._gate_hold import Holds
from edgemon.client._gate_link import GateLink
from edgemon.client._gate_views import ALL_DEVICES, DeviceThrottle, GateState, GateStats
from edgemon.environ import MAX_HOLD_MS, read_gate_environ
from edgemon.errors import CaughtErrors
from edgemon.protocol import check_devices, check_topic_prefix

if TYPE_CHECKING:
    import os
    from collections.abc import Callable, Mapping
    from types import TracebackType

    from edgemon.environ import GateEnviron

__all__ = ["ALL_DEVICES", "DeviceThrottle", "GateState", "GateStats", "ThrottleGate"]


class ThrottleGate:
    """Holds back prefills while edgemon says a followed device's streams are at risk.

    Its parts each own their state: `Heard` (what the broker sent, and the answer flag),
    `GateLink` (the paho client and the heartbeat watcher), `Holds` (the hold state machine,
    on the scheduler's thread) and `CaughtErrors` (exceptions caught)."""

    __slots__ = ("_errors", "_heard", "_holds", "_link", "device", "following", "max_hold_ms")

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
        self.following = check_devices(device)
        #: The same as one string (`"+"`, `"a"`, `"a,b"`).
        self.device = ",".join(self.following)
        prefix = check_topic_prefix(topic_prefix)
        broker = parse_broker_url(
            broker_url,
            username=username,
            password=password,
            password_file=password_file,
            ca_file=ca_file,
            cert_file=cert_file,
            key_file=key_file,
        )
        if (
            isinstance(max_hold_ms, bool)
            or not isinstance(max_hold_ms, int | float)
            or not 0 < max_hold_ms <= MAX_HOLD_MS
        ):
            raise ValueError(f"max_hold_ms must be 0 < x ≤ {MAX_HOLD_MS:.0f}, not {max_hold_ms!r}")
        self.max_hold_ms = float(max_hold_ms)
        name = "all" if self.following == (ALL_DEVICES,) else "_".join(self.following)[:64]
        clock = clock or time.monotonic
        self._errors = CaughtErrors(
            _mqtt.log,
            f"edgemon gate {self.device}",
            "; answering 'do not hold' (further errors are counted in stats.errors, not logged)",
        )
        self._heard = Heard(device=self.device, following=self.following, clock=clock)
        self._holds = Holds(self._heard, max_hold_s=self.max_hold_ms / 1000, clock=clock)
        self._link = GateLink(
            self._heard,
            self._errors,
            broker=broker,
            prefix=prefix,
            client_id=client_id or _mqtt.default_client_id("gate", name),
        )

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> ThrottleGate | None:
        """A gate (not opened) from `EDGEMON_GATE_*`; None without `EDGEMON_GATE_DEVICE`.

        Connection: `BROKER`, and `USERNAME`, `PASSWORD_FILE`, `CA_FILE`, `CERT_FILE` and
        `KEY_FILE` (docs/client.md). Bad values raise `edgemon.environ.EnvironError`
        (a ValueError) naming each variable; a variable no gate reads (a misspelling) is
        logged as a warning.
        """
        gate = read_gate_environ(environ)
        return None if gate is None else cls.from_gate_environ(gate)

    @classmethod
    def from_gate_environ(cls, gate: GateEnviron) -> ThrottleGate:
        """A gate (not opened) from the gate's variables as `edgemon.environ` read them."""
        return cls(gate.broker_url, gate.device, **gate.gate_keywords())

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> Self:
        """Start the network thread (never waits for the broker); idempotent."""
        self._link.open()
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Disconnect and stop the network thread (waiting at most `timeout` s); the gate
        answers False from then on."""
        self._link.close(timeout)

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
            holds = self._holds
            if holds.hold_start is None and not self._heard.active:
                return False  # the common case, without a call
            return holds.answer()
        except Exception:  # noqa: BLE001 - whatever it is, the engine must not stop
            self._errors.caught("should_throttle_prefills")
            return False

    def admitted(self) -> None:
        """The scheduler's report: a step admitted a waiting request, or none was waiting.
        Ends a release by `max_hold_ms` (the next True answer begins a new hold)."""
        self._holds.admitted()

    @property
    def releasing(self) -> bool:
        """Whether a `max_hold_ms` release waits for a step that admits (see `admitted`)."""
        return self._holds.releasing

    # ------------------------------------------------------------------ views
    @property
    def state(self) -> GateState:
        """What the gate knows now."""
        with self._heard.cond:
            return self._heard.snapshot()

    @property
    def stats(self) -> GateStats:
        """Holds, held time and releases so far (the current hold counted up to now)."""
        holds, heard = self._holds, self._heard
        held = holds.held_now()
        with heard.cond:
            holding = heard.book.holding()
        return GateStats(
            holds=holds.holds,
            held_s=held,
            max_hold_releases=holds.max_hold_releases,
            stale_ignored=heard.stale,
            unreadable=heard.unreadable,
            following=self.following,
            holding=holding,
            errors=self._errors.count,
            subscriptions_refused=heard.refusals,
        )

    def wait_connected(self, timeout: float) -> bool:
        """Wait until the gate is connected to the broker; False if `timeout` s pass first."""
        return self.wait_until(lambda state: state.connected, timeout)

    def wait_until(self, predicate: Callable[[GateState], bool], timeout: float) -> bool:
        """Wait until `predicate(state)` holds (checked on every change); False on timeout."""
        heard = self._heard
        with heard.cond:
            return heard.cond.wait_for(lambda: predicate(heard.snapshot()), timeout)
