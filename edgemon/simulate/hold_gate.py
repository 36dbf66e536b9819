"""The `ThrottleGate`'s decision rule on an injected clock, for the virtual loop.

Throttle only while edgemon says so and the hold is younger than `max_hold_ms`, then release:
for one step (the seed's rule, `gate:`), or until a step admits (`lasting:`, what
`ThrottleGate` does since `admitted()`).
"""

from __future__ import annotations


class HoldGate:
    """The ThrottleGate's decision rule on an injected clock (milliseconds).

    `lasting`: the release after `max_hold_ms` lasts until `admitted()` says a step admitted
    a waiting request (or the queue emptied), instead of one step only.
    """

    __slots__ = ("_released", "_since", "held_ms", "holds", "lasting", "max_hold_ms", "throttle")

    def __init__(self, max_hold_ms: float, *, lasting: bool = False) -> None:
        self.max_hold_ms = max_hold_ms
        self.lasting = lasting
        self.throttle = False
        self.holds = 0
        self.held_ms = 0.0
        self._since: float | None = None
        self._released = False

    def set(self, throttle: bool, now_ms: float) -> None:
        """edgemon's throttle object changed (as seen at `now_ms`)."""
        self.throttle = throttle
        if not throttle:
            self._end(now_ms)
            self._released = False

    @property
    def releasing(self) -> bool:
        """A lasting release is under way (the gate lets steps through until one admits)."""
        return self._released

    def admitted(self) -> None:
        """A step admitted a waiting request, or none is waiting: a lasting release ends."""
        self._released = False

    def should_throttle(self, now_ms: float) -> bool:
        """True while throttled and the current hold is younger than `max_hold_ms`."""
        if not self.throttle or self._released:
            return False
        if self._since is None:
            self._since = now_ms
            self.holds += 1
        if now_ms - self._since >= self.max_hold_ms:
            self._end(now_ms)  # one step goes through; the next call starts a new hold
            self._released = self.lasting
            return False
        return True

    def _end(self, now_ms: float) -> None:
        if self._since is not None:
            self.held_ms += now_ms - self._since
            self._since = None
