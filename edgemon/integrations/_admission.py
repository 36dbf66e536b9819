"""What a gated scheduler needs around its gate: ownership, counters, the idle back-off.

Kept free of vLLM so that the vLLM and vLLM-Omni schedulers share it and so that it imports
anywhere. The gate itself is anything with `should_throttle_prefills()` (in production
`edgemon.client.ThrottleGate`, built from the environment inside the engine process).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from edgemon.client import ThrottleGate

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

#: How long a held step that scheduled nothing, with nothing running, waits before it returns.
#: vLLM's engine loop then sleeps 1 ms and steps again; without this back-off a held, idle
#: engine would run about a thousand empty steps a second. A step that has work never waits.
IDLE_SLEEP_S = 0.005


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


class AdmissionControl:
    """Owns a scheduler's gate (or none) and counts what the scheduler held.

    A gate built from the environment belongs to this object: it is opened here and closed by
    `close()`. A gate handed in by the caller stays the caller's (neither opened nor closed).
    """

    __slots__ = ("_gate", "_held_steps", "_idle_sleep_s", "_idle_sleeps", "_owned", "_sleep")

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

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> AdmissionControl:
        """The gate client.md's variables describe, opened; no gate without `EDGEMON_GATE_DEVICE`.

        Bad values raise `ValueError` naming the variable, so a misconfigured engine fails at
        start-up instead of silently never throttling.
        """
        gate = ThrottleGate.from_environ(environ)
        control = cls(gate)
        if gate is not None:
            gate.open()
            control._owned = gate
        return control

    @property
    def gate(self) -> PrefillGate | None:
        """The gate asked every step, or None (the scheduler then behaves exactly as vLLM's)."""
        return self._gate

    def should_hold(self) -> bool:
        """Whether this step must admit no new prefill."""
        gate = self._gate
        return gate is not None and gate.should_throttle_prefills()

    def held(self, *, scheduled_tokens: int, running: int) -> None:
        """Record a step that held waiting requests; back off if it had nothing else to do."""
        self._held_steps += 1
        if scheduled_tokens == 0 and running == 0:
            self._idle_sleeps += 1
            self._sleep(self._idle_sleep_s)

    @property
    def stats(self) -> AdmissionStats:
        """A snapshot of the counters."""
        return AdmissionStats(held_steps=self._held_steps, idle_sleeps=self._idle_sleeps)

    def close(self) -> None:
        """Close the gate if this object opened it; idempotent."""
        owned, self._owned = self._owned, None
        if owned is not None:
            owned.close()


class GatedScheduler:
    """The gate plumbing the vLLM and vLLM-Omni schedulers share (a mixin put before vLLM's
    class): `_attach_gate` in `__init__`, then `edgemon_gate` and `edgemon_stats`."""

    _edgemon: AdmissionControl

    def _attach_gate(self, gate: PrefillGate | None) -> None:
        """Use `gate` (the caller's), or by default the one this process's environment
        describes (then this scheduler owns it and closes it at shutdown)."""
        self._edgemon = (
            AdmissionControl.from_environ(os.environ) if gate is None else AdmissionControl(gate)
        )

    @property
    def edgemon_gate(self) -> PrefillGate | None:
        """The gate asked every step (its `stats` count holds and held seconds), or None."""
        return self._edgemon.gate

    @property
    def edgemon_stats(self) -> AdmissionStats:
        """Steps that held waiting requests, and idle back-offs, so far."""
        return self._edgemon.stats

    def shutdown(self) -> None:
        """Shut vLLM's scheduler down (next in the MRO), then close the gate if this
        scheduler opened it."""
        try:
            super().shutdown()  # type: ignore[misc]  # vLLM's scheduler, after this mixin
        finally:
            self._edgemon.close()
