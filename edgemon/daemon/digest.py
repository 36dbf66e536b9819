"""Per-device summaries of stream transitions: one info line per device every few seconds.

Underruns begun, confirmed and retracted, gaps declared and streams ended happen per stream,
and a struggling device has many of them (a stream at zero slack begins an underrun with
every chunk). Each one is logged at debug only; at info, `DeviceDigest` counts them per device
and writes one `device_summary` line per device at most every `every_ms` (5 s): the counts by
kind over the interval, and its worst stream (the most confirmed underruns, then the most
begun). At most `per_flush` devices are summarised per `flush` (the daemon calls it every
second), the longest waiting first; the others keep counting, so with many devices in
trouble each one's lines come less often, never more, and no count is lost. Metrics,
`/api/v1/streams` and `--record` keep every transition.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final, cast

from edgemon.engine.outputs import (
    GapDeclared,
    StreamEnded,
    UnderrunBegan,
    UnderrunConfirmed,
    UnderrunRetracted,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from edgemon.engine.outputs import Output

Transition = UnderrunBegan | UnderrunRetracted | UnderrunConfirmed | GapDeclared | StreamEnded

#: What is counted, in a summary's field order.
KINDS: Final = (
    "underruns_began",
    "underruns_confirmed",
    "underruns_retracted",
    "gaps_declared",
    "streams_ended",
)
BEGAN, CONFIRMED, RETRACTED, GAP, ENDED = range(len(KINDS))
#: The outputs counted, by type: their kind and their debug line's event.
_COUNTED: Final[dict[type, tuple[int, str]]] = {
    UnderrunBegan: (BEGAN, "underrun_began"),
    UnderrunRetracted: (RETRACTED, "underrun_retracted"),
    UnderrunConfirmed: (CONFIRMED, "underrun_confirmed"),
    GapDeclared: (GAP, "gap_declared"),
    StreamEnded: (ENDED, "stream_ended"),
}
EVERY_MS: Final = 5000.0
PER_FLUSH: Final = 2


class _Tally:
    """One device's counts since `since_ms`; per stream, [confirmed, began]."""

    __slots__ = ("counts", "since_ms", "streams")

    def __init__(self, since_ms: float) -> None:
        self.since_ms = since_ms
        self.counts = [0] * len(KINDS)
        self.streams: dict[str, list[int]] = {}


class DeviceDigest:
    """Counts transitions per device (`note`, `count`) and summarises them (`flush`); `log`
    has `enabled(level)` (a `LogBudget`): each transition is a debug line too when enabled."""

    __slots__ = ("_detail", "_every_ms", "_log", "_now_ms", "_per_flush", "_tallies")

    def __init__(
        self,
        log: Any,
        *,
        now_ms: Callable[[], float],
        every_ms: float = EVERY_MS,
        per_flush: int = PER_FLUSH,
    ) -> None:
        self._log = log
        self._now_ms = now_ms
        self._every_ms = every_ms
        self._per_flush = per_flush
        #: Devices with counts since their last summary, longest waiting first.
        self._tallies: dict[str, _Tally] = {}
        self._detail: bool = log.enabled(logging.DEBUG)

    def note(self, output: Output) -> bool:
        """Count `output` if it is a stream transition (and log it at debug); False if not."""
        counted = _COUNTED.get(type(output))
        if counted is None:
            return False
        transition = cast("Transition", output)  # a key of `_COUNTED`
        self.count(transition.device, transition.stream, counted[0])
        if self._detail:
            self._log.debug(counted[1], **_detail(transition))
        return True

    def count(self, device: str, stream: str, kind: int) -> None:
        """One transition of `kind` (`BEGAN`, …) of `stream` on `device`."""
        tally = self._tallies.get(device)
        if tally is None:
            tally = self._tallies[device] = _Tally(self._now_ms())
        tally.counts[kind] += 1
        if kind <= CONFIRMED:  # the worst stream: the most confirmed, then the most begun
            per_stream = tally.streams.get(stream)
            if per_stream is None:
                per_stream = tally.streams[stream] = [0, 0]
            per_stream[0 if kind == CONFIRMED else 1] += 1

    def flush(self, now: float | None = None) -> None:
        """Summarise the devices whose counts are at least `every_ms` old, the longest
        waiting first, at most `per_flush` of them."""
        now = self._now_ms() if now is None else now
        due: list[str] = []
        for device, tally in self._tallies.items():  # oldest first: insertion order
            if now - tally.since_ms < self._every_ms or len(due) == self._per_flush:
                break
            due.append(device)
        for device in due:
            self._summarise(device, self._tallies.pop(device), now)

    def close(self, now: float | None = None) -> None:
        """Summarise every device with counts, whatever their age (at a clean stop)."""
        now = self._now_ms() if now is None else now
        tallies, self._tallies = self._tallies, {}
        for device, tally in tallies.items():
            self._summarise(device, tally, now)

    def _summarise(self, device: str, tally: _Tally, now: float) -> None:
        fields: dict[str, Any] = dict(zip(KINDS, tally.counts, strict=True))
        worst = max(tally.streams.items(), key=lambda item: item[1], default=None)
        if worst is not None:
            fields["worst_stream"] = worst[0]
            fields["worst_stream_underruns"] = worst[1][0]
            fields["worst_stream_began"] = worst[1][1]
        self._log.info(
            "device_summary",
            device=device,
            interval_s=round((now - tally.since_ms) / 1000.0, 3),
            **fields,
        )


def _detail(
    output: UnderrunBegan | UnderrunRetracted | UnderrunConfirmed | GapDeclared | StreamEnded,
) -> dict[str, Any]:
    """The fields of a transition's debug line."""
    fields: dict[str, Any] = {"device": output.device, "stream": output.stream}
    if isinstance(output, GapDeclared):
        fields["seqs"] = [output.missing_from, output.missing_to]
    elif isinstance(output, StreamEnded):
        fields["reason"] = output.reason
        fields["underruns"] = output.underruns
        fields["outcome"] = output.outcome
    else:
        fields["t_ms"] = output.t_ms
        if isinstance(output, UnderrunConfirmed):
            fields["published"] = output.published
        elif isinstance(output, UnderrunRetracted):
            fields["retracted_ms"] = output.retracted_ms
    return fields
