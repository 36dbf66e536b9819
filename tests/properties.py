"""How hard the property tests search.

`make test` (and a bare `pytest`) runs each Hypothesis property with a quarter of the examples
it names (at least `LEAST`), so the suite stays fast; `make test-deep` sets
`EDGEMON_TEST_DEEP=1` and runs every property with all of them. A property names its full
count as `max_examples=examples(N)`; one that names none gets the profile's
(`conftest.py`: 25, or Hypothesis's 100 when deep).
"""

from __future__ import annotations

import os

#: Set by `make test-deep`.
DEEP_ENV = "EDGEMON_TEST_DEEP"
DEEP = os.environ.get(DEEP_ENV) == "1"
#: The share of its examples a property runs in the fast suite, and the fewest it runs.
SHARE = 4
LEAST = 20


def examples(count: int) -> int:
    """`count` when deep, else a quarter of it (at least `LEAST`, never more than `count`)."""
    return count if DEEP else min(count, max(LEAST, count // SHARE))
