"""The step estimate a server announces: the rule behind its `eta_ms` hints.

A player prebuffers for the wait the server announces for its next chunk: the frames to go
times the server's step estimate. That estimate is an EWMA (`ALPHA`) of the steps that
decoded. A step that decoded nothing (a prefill on an idle box) is no step to any player,
which times the box by the tokens it receives.

The simulated engines announce by this rule and the deadline policy predicts their
announcements by it, so the two cannot drift apart.
"""

from __future__ import annotations

from typing import overload

ALPHA = 0.2
"""Weight of the newest step that decoded in the announced estimate."""


@overload
def next_estimate(estimate_ms: float, ms: float, decodes: int) -> float: ...
@overload
def next_estimate(estimate_ms: float | None, ms: float, decodes: int) -> float | None: ...
def next_estimate(estimate_ms: float | None, ms: float, decodes: int) -> float | None:
    """The estimate after a step of `ms` that decoded `decodes` streams (None: nothing
    announced yet; the first step that decodes is the estimate)."""
    if decodes <= 0:
        return estimate_ms
    if estimate_ms is None:
        return ms
    return estimate_ms + ALPHA * (ms - estimate_ms)
