"""`edgemon.policy.announced`: the step estimate behind a server's `eta_ms` hints."""

from __future__ import annotations

import pytest

from edgemon.policy.announced import ALPHA, next_estimate


def test_the_first_step_that_decodes_is_the_estimate() -> None:
    """Nothing announced yet: a prefill-only step leaves nothing to announce; the first step
    that decodes is the estimate as it is."""
    assert next_estimate(None, 900.0, 0) is None
    assert next_estimate(None, 60.0, 3) == 60.0


def test_only_steps_that_decode_move_the_estimate() -> None:
    """A 900 ms prefill on an idle box leaves a 50 ms estimate alone; a 70 ms step of two
    streams moves it by `ALPHA` of the difference."""
    assert next_estimate(50.0, 900.0, 0) == 50.0
    assert next_estimate(50.0, 70.0, 2) == pytest.approx(50.0 + ALPHA * 20.0)
