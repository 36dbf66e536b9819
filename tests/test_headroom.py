"""The closed forms of slack and headroom, and the exact threshold-crossing instants."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from edgemon.engine.headroom import INF, below, headroom, slack

from properties import examples

ints = st.integers(min_value=-500, max_value=3000)


def test_slack_counts_down_from_the_player_start() -> None:
    """Slack is the buffer while the player waits, then falls 1 ms per ms (conceal)."""
    assert slack(50, 300, 100, rebuffer=False) == 300
    assert slack(250, 300, 100, rebuffer=False) == 150
    assert slack(500, 300, 100, rebuffer=False) == -100


def test_rebuffer_slack_never_goes_below_zero() -> None:
    """A rebuffering player stalls instead of playing silence: its slack floors at 0."""
    assert slack(500, 300, 100, rebuffer=True) == 0


def test_headroom_is_slack_minus_eta() -> None:
    """Headroom subtracts the wait for the next chunk, and only while it is in the future."""
    assert headroom(100, 400, 0, 250, rebuffer=False) == 300 - 150
    assert headroom(300, 400, 0, 250, rebuffer=False) == 100


def test_below_reports_the_falling_crossing_instant() -> None:
    """With B=400, S=0, E=250 and threshold 80 the plateau is 150; it falls below 80 at 320."""
    assert below(0, 80, 400, 0, 250, rebuffer=False) == (False, 320)
    assert below(320, 80, 400, 0, 250, rebuffer=False) == (True, INF)


def test_a_player_that_has_not_started_consumes_nothing() -> None:
    """Before the player starts, the buffer lasts until start + B: a prebuffering stream whose
    next chunk comes before that is safe (the spec's bare slack − eta would say −100 here)."""
    # B=100, S=1000 (player starts late), E=200: the buffer lasts until 1100, next chunk at 200.
    assert headroom(0, 100, 1000, 200, rebuffer=False) == 900
    assert below(0, 80, 100, 1000, 200, rebuffer=False) == (False, 1020)


def test_headroom_equals_the_spec_formula_once_the_player_has_started() -> None:
    """From the player's start on, headroom is exactly the spec's slack − eta."""
    for t in (1000, 1050, 1100, 1300):
        spec = slack(t, 100, 1000, rebuffer=False) - max(0, 1200 - t)
        assert headroom(t, 100, 1000, 1200, rebuffer=False) == spec


def _right_limit_below(
    t: float, threshold: float, b: float, s: float, e: float, *, rebuffer: bool
) -> bool:
    return headroom(t + 0.25, b, s, e, rebuffer=rebuffer) < threshold


@settings(max_examples=examples(400), deadline=None)
@given(
    now=ints,
    threshold=st.integers(min_value=0, max_value=400),
    buffered=st.integers(min_value=1, max_value=2000),
    start=ints,
    expected=ints,
    rebuffer=st.booleans(),
)
def test_below_agrees_with_brute_force(
    now: int, threshold: int, buffered: int, start: int, expected: int, rebuffer: bool
) -> None:
    """The flag and its next change equal a scan of headroom on a quarter-millisecond grid.

    With integer inputs every crossing is at an integer, so the state on (k, k+1) is the
    state at k + 0.25, and a change between k − 1 + 0.25 and k + 0.25 happens at k.
    """
    flag, change = below(now, threshold, buffered, start, expected, rebuffer=rebuffer)
    assert flag == _right_limit_below(now, threshold, buffered, start, expected, rebuffer=rebuffer)
    horizon = max(now, start, expected, start + buffered) + threshold + 10
    k = now + 1
    while (
        k <= horizon
        and _right_limit_below(k, threshold, buffered, start, expected, rebuffer=rebuffer) == flag
    ):
        k += 1
    assert change == (k if k <= horizon else INF)
