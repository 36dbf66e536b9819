"""Closed forms of slack and headroom between two events of a stream (docs/semantics.md).

Between events a live stream is fixed by three numbers: `buffered` (B, audio applied),
`start` (S, player start) and `expected` (E, when the next chunk is due). Then

    slack(t)    = B − max(0, t − S)                 (rebuffer: never below 0)
    lasts(t)    = slack(t) + max(0, S − t) = S + B − t   (how long the buffer lasts from t)
    headroom(t) = lasts(t) − max(0, E − t)
                = min(S + B − E,  S + B − t)            (conceal)

constant until the next chunk is due, then falling 1 ms per ms. So every threshold crossing
is known in advance and costs a few arithmetic operations.

From the player's start on, `lasts = slack` and headroom is exactly the spec's `slack − eta`.
Before it, the spec's formula would ignore that a player that has not started consumes
nothing, and call every prebuffering stream at risk (docs/semantics.md).
"""

from __future__ import annotations

INF = float("inf")


def slack(t: float, buffered: float, start: float, *, rebuffer: bool) -> float:
    """Audio buffered ahead of the player at `t`."""
    value = buffered - max(0.0, t - start)
    return max(0.0, value) if rebuffer else value


def headroom(t: float, buffered: float, start: float, expected: float, *, rebuffer: bool) -> float:
    """How long the buffer lasts from `t`, minus the wait for the next chunk."""
    lasts = start + buffered - t
    if rebuffer and lasts < 0.0:
        lasts = 0.0
    return lasts - max(0.0, expected - t)


def below(
    now: float, threshold: float, buffered: float, start: float, expected: float, *, rebuffer: bool
) -> tuple[bool, float]:
    """Whether `headroom < threshold` just after `now`, and the next instant that changes.

    "Just after" is the right limit: at a continuous downward crossing the answer turns True
    at the crossing instant itself. The instant returned is `INF` when nothing changes before
    the next event. Requires `threshold ≥ 0`.
    """
    if rebuffer and threshold <= 0.0:
        return _below_rebuffer_at_zero(now, buffered, start, expected)
    falls_below = start + buffered - threshold
    if falls_below < expected:  # the plateau S + B − E is already below the threshold
        return True, INF
    if now < falls_below:
        return False, falls_below
    return True, INF


def _below_rebuffer_at_zero(
    now: float, buffered: float, start: float, expected: float
) -> tuple[bool, float]:
    """`below` for the rebuffer player with threshold 0, where stalls make headroom non-concave.

    Until the buffer empties at `u = S + B` it is the conceal curve; after it, the player is
    stalled, slack is 0 and headroom is `−max(0, E − t)`: below 0 exactly until `E`.
    """
    empties = start + buffered
    if now >= empties:
        return (True, expected) if now < expected else (False, INF)
    flag, change = below(now, 0.0, buffered, start, expected, rebuffer=False)
    if change < empties:
        return flag, change
    after_empty = empties < expected
    if flag != after_empty:
        return flag, empties
    return flag, (expected if after_empty else INF)
