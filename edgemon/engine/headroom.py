"""Closed forms of slack and headroom between two events of a stream (SPEC §2.2, §2.4).

Between events a live stream is fixed by three numbers: `buffered` (B, audio applied),
`start` (S, player start) and `expected` (E, when the next chunk is due). Then

    slack(t)    = B − max(0, t − S)                 (rebuffer: never below 0)
    headroom(t) = slack(t) − max(0, E − t)
                = min(t + B − E,  B − max(0, E − S),  B + S − t)   (conceal)

a concave function that rises, stays flat, then falls 1 ms per ms. So every threshold
crossing is known in advance and costs a few arithmetic operations.
"""

from __future__ import annotations

INF = float("inf")


def slack(t: float, buffered: float, start: float, *, rebuffer: bool) -> float:
    """Audio buffered ahead of the player at `t`."""
    value = buffered - max(0.0, t - start)
    return max(0.0, value) if rebuffer else value


def headroom(t: float, buffered: float, start: float, expected: float, *, rebuffer: bool) -> float:
    """Slack at `t` minus the wait for the next chunk."""
    return slack(t, buffered, start, rebuffer=rebuffer) - max(0.0, expected - t)


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
    plateau = buffered - max(0.0, expected - start)
    rises_above = expected + threshold - buffered
    falls_below = buffered + start - threshold
    if plateau < threshold or rises_above >= falls_below:
        return True, INF  # never at or above the threshold for a whole instant
    if now < rises_above:
        return True, rises_above
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
