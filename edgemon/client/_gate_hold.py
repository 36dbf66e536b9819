"""A `ThrottleGate`'s holds: when an answer of True begins one, when `max_hold_ms` ends it,
and what they add up to.

`Holds` is read and written by the caller of `should_throttle_prefills()` alone (the
scheduler's thread); it reads the flag `Heard` keeps (`active`, `activations`,
`inactive_at`) without a lock. A hold begins at the first True answer. Once it has lasted
`max_hold_ms`, the answer is False until the scheduler reports, with `admitted()`, a step that
admitted a waiting request or found none waiting, so new requests cannot starve; the next True
answer begins a new hold. A hold of an activation that has ended ended when the flag went
False (as the network thread saw it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from edgemon.client._gate_heard import Heard


class Holds:
    """The hold state machine of one gate, and its counts."""

    __slots__ = (
        "_clock",
        "_heard",
        "_hold_of",
        "_max_hold_s",
        "_release_of",
        "_releasing",
        "held_s",
        "hold_start",
        "holds",
        "max_hold_releases",
    )

    def __init__(self, heard: Heard, *, max_hold_s: float, clock: Callable[[], float]) -> None:
        self._heard = heard
        self._max_hold_s = max_hold_s
        self._clock = clock
        #: When the current hold began (None: no hold), and the activation it belongs to.
        self.hold_start: float | None = None
        self._hold_of = 0
        #: Released by `max_hold_ms` until a step admits, and the activation released.
        self._releasing = False
        self._release_of = 0
        #: Holds begun, time held in ended holds (s), releases by `max_hold_ms`.
        self.holds = 0
        self.held_s = 0.0
        self.max_hold_releases = 0

    def answer(self) -> bool:
        """Whether this scheduler step should admit no new prefill."""
        heard = self._heard
        start = self.hold_start
        if not heard.active:
            if start is not None:
                self._end(start)
            return False
        activations = heard.activations
        if self._releasing:
            if self._release_of == activations:
                return False  # released by max_hold_ms: until a step admits
            self._releasing = False  # the throttle went off and on again since
        now = self._clock()
        if start is not None and self._hold_of != activations:
            self._end(start)  # the gate went inactive and active again since
            start = None
        if start is None:
            self.hold_start = now
            self._hold_of = activations
            self.holds += 1
            return True
        if now - start >= self._max_hold_s:
            self.held_s += now - start
            self.hold_start = None
            self.max_hold_releases += 1
            self._releasing = True
            self._release_of = activations
            return False
        return True

    def admitted(self) -> None:
        """A step admitted a waiting request, or none was waiting: a release ends."""
        self._releasing = False

    @property
    def releasing(self) -> bool:
        """Whether a `max_hold_ms` release waits for a step that admits."""
        heard = self._heard
        return self._releasing and heard.active and self._release_of == heard.activations

    def held_now(self) -> float:
        """Time held (s), the current hold counted up to now."""
        held = self.held_s
        start = self.hold_start
        if start is not None:
            heard = self._heard
            current = heard.active and self._hold_of == heard.activations
            end = self._clock() if current else heard.inactive_at
            held += max(0.0, end - start)
        return held

    def _end(self, start: float) -> None:
        """The hold ended when the gate last went inactive (as the network thread saw it)."""
        self.held_s += max(0.0, self._heard.inactive_at - start)
        self.hold_start = None
