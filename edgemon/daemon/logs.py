"""Logging: structlog configured once from `[log]`, a budget for every line the daemon
writes, and a rate limiter for bad input.

JSON lines when stdout is not a terminal (journald collects them), a readable console
otherwise. The daemon writes every line through one `LogBudget`, a token bucket: at most
`LINES_PER_S` (10) lines a second on average and `BURST` (20) at once, whatever happens, so
a box in distress never gets a louder edgemon; what it holds back is counted, by event, in
one `log_lines_suppressed` line a second at most. Warnings and errors may use the whole
bucket, lines at info less and lines at debug less still, so a storm of lines at one level
cannot crowd out one at a higher level. Rejected messages are also logged at most once per
second per (device, reason), with the number suppressed since the last line, so a
misbehaving device cannot fill the budget either, and at most `max_lines` per second in
all, then one summary line per second counts what was suppressed, by reason.
"""

from __future__ import annotations

import logging
import sys
from collections import Counter
from typing import TYPE_CHECKING, Any, Final, TextIO

import structlog

if TYPE_CHECKING:
    from collections.abc import Callable

    from edgemon.engine.outputs import Rejected
    from edgemon.settings import LogSettings

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}
_LEVELS["error"] = logging.ERROR

#: Lines the daemon writes at most, in all (the summaries of what was held back included):
#: on average per second, and at once (a start, a reload). Tokens that lines at info leave
#: for warnings and errors, and lines at debug for info.
LINES_PER_S: Final = 10.0
BURST: Final = 20
RESERVE: Final = 3
#: Events a `log_lines_suppressed` line names at most (the most frequent; `total` has all).
SUPPRESSED_KINDS: Final = 20


def configure_logging(settings: LogSettings, *, stream: TextIO | None = None) -> None:
    """Set structlog up for the daemon; `stream` defaults to stdout (read now, not at import)."""
    out = sys.stdout if stream is None else stream
    use_json = settings.format == "json" or (settings.format == "auto" and not out.isatty())
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=out.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[settings.level]),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=True,  # a logger resolves its configuration once
    )


class LogBudget:
    """The daemon's logger: what `log` (a structlog logger) would write, at `level` and
    above, within a token bucket of `burst` lines refilled at `per_s` lines a second. A line
    takes a token; one that finds too few is counted, by event, and the next `flush` (or line)
    at least `interval_ms` after the last summary writes one `log_lines_suppressed` line
    saying so (it takes a token too).

    Each level leaves tokens for those above it: the summary may take the last token,
    warnings and errors all but one, info lines all but `1 + reserve`, debug lines all but
    `1 + 2 * reserve`. Lines below `level` cost one comparison.
    """

    __slots__ = (
        "_burst",
        "_keep_debug",
        "_keep_info",
        "_level",
        "_log",
        "_now_ms",
        "_per_ms",
        "_refilled_ms",
        "_summary_every_ms",
        "_summary_ms",
        "_suppressed",
        "_tokens",
    )

    def __init__(
        self,
        log: Any,
        *,
        now_ms: Callable[[], float],
        level: str = "info",
        per_s: float = LINES_PER_S,
        burst: int = BURST,
        reserve: int = RESERVE,
        interval_ms: float = 1000.0,
    ) -> None:
        self._log = log
        self._now_ms = now_ms
        self._level = _LEVELS[level]
        self._per_ms = per_s / 1000.0
        self._burst = float(burst)
        self._keep_info = 1.0 + reserve
        self._keep_debug = 1.0 + 2 * reserve
        self._summary_every_ms = interval_ms
        self._tokens = float(burst)
        self._refilled_ms: float | None = None
        self._summary_ms = -float("inf")
        self._suppressed: Counter[str] = Counter()

    def enabled(self, level: int) -> bool:
        """Whether lines at `level` (`logging.DEBUG`, …) are written at all (budget aside)."""
        return level >= self._level

    def debug(self, event: str, **fields: Any) -> None:
        """A line at debug."""
        if self._level <= logging.DEBUG and self._take(event, self._keep_debug):
            self._log.debug(event, **fields)

    def info(self, event: str, **fields: Any) -> None:
        """A line at info."""
        if self._level <= logging.INFO and self._take(event, self._keep_info):
            self._log.info(event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        """A line at warning."""
        if self._level <= logging.WARNING and self._take(event, 1.0):
            self._log.warning(event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        """A line at error."""
        if self._take(event, 1.0):
            self._log.error(event, **fields)

    def exception(self, event: str, **fields: Any) -> None:
        """A line at error with the exception being handled."""
        if self._take(event, 1.0):
            self._log.exception(event, **fields)

    def _refill(self, now: float) -> float:
        last = self._refilled_ms
        if last is None or now > last:  # a clock that steps back refills nothing
            self._refilled_ms = now
            if last is not None:
                tokens = self._tokens + (now - last) * self._per_ms
                self._tokens = tokens if tokens < self._burst else self._burst
        return self._tokens

    def _take(self, event: str, keep: float) -> bool:
        """Take a token for a line of `event`, leaving `keep`; else count it as held back."""
        now = self._now_ms()
        if self._suppressed:
            self.flush(now)
        if self._refill(now) - 1.0 >= keep:
            self._tokens -= 1.0
            return True
        self._suppressed[event] += 1
        return False

    def flush(self, now: float | None = None) -> None:
        """Write what was held back since the last summary, if that was `interval_ms` ago
        (called with each line while lines are held back, and every second by the daemon, so
        the summary of a storm that has stopped comes out too)."""
        now = self._now_ms() if now is None else now
        if not self._suppressed or now - self._summary_ms < self._summary_every_ms:
            return
        if self._refill(now) < 1.0:
            return
        self._tokens -= 1.0
        self._summary_ms = now
        suppressed = self._suppressed
        self._suppressed = Counter()
        self._log.warning(
            "log_lines_suppressed",
            suppressed=dict(suppressed.most_common(SUPPRESSED_KINDS)),
            total=suppressed.total(),
        )


class RejectionLog:
    """Logs a rejected message at most once per `interval_ms` per (device, reason), and at
    most `max_lines` lines per `interval_ms` in all, then one summary line per interval."""

    __slots__ = (
        "_interval_ms",
        "_last",
        "_lines",
        "_log",
        "_max_keys",
        "_max_lines",
        "_now_ms",
        "_over",
        "_suppressed",
        "_window_ms",
    )

    def __init__(
        self,
        log: Any,
        *,
        now_ms: Callable[[], float],
        interval_ms: float = 1000.0,
        max_keys: int = 10_000,
        max_lines: int = 10,
    ) -> None:
        self._log = log
        self._now_ms = now_ms
        self._interval_ms = interval_ms
        self._last: dict[tuple[str | None, str], float] = {}
        self._suppressed: dict[tuple[str | None, str], int] = {}
        self._max_keys = max_keys
        self._max_lines = max_lines
        #: The current interval of the global bound: when it began, lines written in it,
        #: and what the bound suppressed in it, by reason.
        self._window_ms = -float("inf")
        self._lines = 0
        self._over: Counter[str] = Counter()

    def __call__(self, rejected: Rejected) -> None:
        """Log `rejected` now, or count it as suppressed."""
        key = (rejected.device, rejected.reason)
        now = self._now_ms()
        last = self._last.get(key)
        if last is not None and now - last < self._interval_ms:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return
        self.flush(now)
        if self._lines >= self._max_lines:
            self._over[rejected.reason] += 1
            return
        self._lines += 1
        if last is None and len(self._last) >= self._max_keys:
            self._forget(now)
        self._last[key] = now
        self._log.warning(
            "message_rejected",
            device=rejected.device,
            reason=rejected.reason,
            detail=rejected.detail,
            topic=rejected.topic,
            suppressed=self._suppressed.pop(key, 0),
        )

    def flush(self, now: float | None = None) -> None:
        """Once the interval is over: the summary of what the global bound suppressed in it
        (called with each rejection, and every second by the daemon so the last one of a
        flood is not held back until the next rejection)."""
        now = self._now_ms() if now is None else now
        if now - self._window_ms < self._interval_ms:
            return
        if self._over:
            self._log.warning(
                "message_rejections_suppressed",
                interval_s=self._interval_ms / 1000.0,
                suppressed=dict(sorted(self._over.items())),
                total=sum(self._over.values()),
                logged=self._lines,
            )
            self._over.clear()
        self._window_ms = now
        self._lines = 0

    def _forget(self, now: float) -> None:
        """Drop keys idle for longer than the interval, so memory stays bounded."""
        stale = [key for key, when in self._last.items() if now - when >= self._interval_ms]
        for key in stale or list(self._last):
            del self._last[key]
            self._suppressed.pop(key, None)
