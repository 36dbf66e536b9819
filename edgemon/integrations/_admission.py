"""The gate's part in edgemon's vLLM driver: ownership of the gate, the counters, the idle
back-off, and the guards that keep edgemon's part of a step from ever stopping the engine.

Kept free of vLLM so that the vLLM and vLLM-Omni schedulers share it and so that it imports
anywhere. The gate itself is anything with `should_throttle_prefills()` (in production
`edgemon.client.ThrottleGate`, built from the environment inside the engine process).

- **Errors.** An exception inside the gate or inside edgemon's part of a step is answered
  "do not hold": it is counted (`AdmissionStats.errors`), the first one is logged with its
  traceback, and vLLM never sees it.
- **Drift.** A step that held the waiting requests must admit none of them. If one was
  admitted anyway (a vLLM whose queue handling changed under the scheduler), the gate is
  disabled for good with one error in the log: the engine runs as vLLM's own, loudly, rather
  than half-gated.
- **A release that admits.** A gate with `admitted()` (the ThrottleGate) is told of every
  step that admitted a waiting request or had none waiting, which ends a `max_hold_ms` release.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from edgemon.client import ThrottleGate
from edgemon.errors import CaughtErrors

if TYPE_CHECKING:
    from collections.abc import Callable

    from edgemon.environ import GateEnviron

#: How long a held step that scheduled nothing, with nothing running, waits before it returns.
#: vLLM's engine loop then sleeps 1 ms and steps again; without this back-off a held, idle
#: engine would run about a thousand empty steps a second. A step that has work never waits.
IDLE_SLEEP_S = 0.005

_log = logging.getLogger("edgemon.integrations")


class PrefillGate(Protocol):
    """The one question a scheduler asks every step."""

    def should_throttle_prefills(self) -> bool:
        """Whether new prefills must wait this step (cheap, lock-free)."""
        ...


class _OwnedGate(PrefillGate, Protocol):
    def close(self, timeout: float = ...) -> None: ...


@dataclass(frozen=True, slots=True)
class AdmissionStats:
    """What a gated scheduler did, for the engine's own metrics.

    `held_steps` counts scheduling steps that kept at least one waiting request out because of
    the gate; `idle_sleeps` counts the back-offs of held steps that had nothing else to do.
    The gate's own counters (holds, held seconds, forced releases) are on `gate.stats` when the
    gate is an `edgemon.client.ThrottleGate`.
    """

    held_steps: int
    idle_sleeps: int
    #: Exceptions caught in the gate or in edgemon's part of a step (each: "do not hold").
    errors: int = 0
    #: Whether the drift guard disabled the gate (a held step admitted a held request).
    disabled: bool = False


class AdmissionControl:
    """Owns a scheduler's gate (or none) and counts what the scheduler held.

    A gate built from the environment belongs to this object: it is opened here and closed by
    `close()`. A gate handed in by the caller stays the caller's (neither opened nor closed).
    """

    __slots__ = (
        "_admitted",
        "_disabled",
        "_errors",
        "_gate",
        "_held_steps",
        "_idle_sleep_s",
        "_idle_sleeps",
        "_owned",
        "_sleep",
    )

    def __init__(
        self,
        gate: PrefillGate | None,
        *,
        idle_sleep_s: float = IDLE_SLEEP_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._gate = gate
        self._owned: _OwnedGate | None = None
        self._idle_sleep_s = idle_sleep_s
        self._sleep = sleep
        self._held_steps = 0
        self._idle_sleeps = 0
        self._errors = CaughtErrors(
            _log,
            "edgemon",
            ", caught: the step goes on as vLLM's own would (further errors are counted in "
            "edgemon_stats.errors, not logged)",
        )
        self._disabled = False
        admitted = getattr(gate, "admitted", None)
        self._admitted: Callable[[], None] | None = admitted if callable(admitted) else None

    @classmethod
    def from_gate(cls, gate: GateEnviron | None) -> AdmissionControl:
        """The gate the engine's variables describe, opened and owned; no gate without
        ``EDGEMON_GATE_DEVICE``."""
        throttle = None if gate is None else ThrottleGate.from_gate_environ(gate)
        control = cls(throttle)
        if throttle is not None:
            throttle.open()
            control._owned = throttle
        return control

    @property
    def gate(self) -> PrefillGate | None:
        """The gate asked every step, or None (the scheduler then behaves exactly as vLLM's)."""
        return self._gate

    def should_hold(self) -> bool:
        """Whether this step must admit no new prefill (False on any error in the gate)."""
        gate = self._gate
        if gate is None or self._disabled:
            return False
        try:
            return bool(gate.should_throttle_prefills())
        except Exception:  # noqa: BLE001 - the engine must not stop for the gate
            self.failed("the gate's should_throttle_prefills()")
            return False

    @property
    def releasing(self) -> bool:
        """Whether the gate waits for a step that admits (a `max_hold_ms` release)."""
        gate = self._gate
        return gate is not None and bool(getattr(gate, "releasing", False))

    def stepped(self, *, admitted: bool) -> None:
        """After a step that was not held: `admitted` if it admitted a waiting request or
        none was waiting, which ends a gate's `max_hold_ms` release."""
        if admitted and self._admitted is not None:
            try:
                self._admitted()
            except Exception:  # noqa: BLE001 - the engine must not stop for the gate
                self.failed("the gate's admitted()")

    def failed(self, where: str) -> None:
        """Count an exception caught in edgemon's part of a step; log the first one (call
        from an `except` block: the traceback goes with it)."""
        self._errors.caught(where)

    def check_drift(self, held: set[str], admitted: set[str]) -> None:
        """The drift guard: `admitted` (this held step's newly scheduled request ids) must
        not meet `held` (the ids it held back); if they do, disable the gate, with one error."""
        leaked = held & admitted
        if leaked and not self._disabled:
            self._disabled = True
            _log.error(
                "edgemon: a step that held the waiting requests admitted %s anyway: this "
                "vLLM's scheduler no longer works as edgemon's scheduler expects; the gate is "
                "disabled (requests are admitted as vLLM's own scheduler would)",
                sorted(leaked),
            )

    def held(self, *, scheduled_tokens: int, running: int) -> None:
        """Record a step that held waiting requests; back off if it had nothing else to do."""
        self._held_steps += 1
        if scheduled_tokens == 0 and running == 0:
            self._idle_sleeps += 1
            self._sleep(self._idle_sleep_s)

    @property
    def stats(self) -> AdmissionStats:
        """A snapshot of the counters."""
        return AdmissionStats(
            held_steps=self._held_steps,
            idle_sleeps=self._idle_sleeps,
            errors=self._errors.count,
            disabled=self._disabled,
        )

    def close(self) -> None:
        """Close the gate if this object opened it; idempotent."""
        owned, self._owned = self._owned, None
        if owned is not None:
            owned.close()
