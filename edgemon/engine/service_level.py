"""An ended stream judged against the service-level objectives (docs/semantics.md, "Service
level"): did its listener hear it start soon enough and play without a long gap?

The outcome is decided once, at the stream's removal, from what the stream recorded on the
device's clock: its start silence (fixed by its first chunk) and its longest confirmed gap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Literal

if TYPE_CHECKING:
    from edgemon.engine.config import SloPolicy
    from edgemon.engine.stream import Stream

Outcome = Literal["good", "late", "gappy", "unfinished"]
#: Every outcome, in the order the metrics list them.
OUTCOMES: Final[tuple[Outcome, ...]] = ("good", "late", "gappy", "unfinished")


def outcome(stream: Stream, reason: str, ended_ms: float, policy: SloPolicy) -> Outcome:
    """The outcome of `stream`, removed for `reason`; `ended_ms` is when it ended on the
    device's clock (an `end` event's `t_ms`).

    - `unfinished`: it expired, it never played (no chunk), or an end other than `completed`
      came before its audio had played out;
    - `late`: its start silence exceeded `start_ms` (a stream begun by its first chunk has
      no start event to measure from, so it is never late);
    - `gappy`: its longest gap exceeded `gap_ms`;
    - `good`: neither.
    """
    if (
        reason == "expired"
        or stream.chunks == 0
        or (reason != "completed" and ended_ms < stream.start + stream.buffered)
    ):
        return "unfinished"
    silence = stream.start_silence_ms
    if silence is not None and silence > policy.start_ms:
        return "late"
    if stream.longest_gap_ms > policy.gap_ms:
        return "gappy"
    return "good"
