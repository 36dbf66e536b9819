"""A naive test oracle for docs/semantics.md, written without looking at the engine.

Every answer is computed by brute force: the state of a device at instant ``s`` is the fold of
all its events received at or before ``s``, started from scratch for that prefix (no state is
carried from one prefix to the next), and every stream quantity is re-summed from its list of
applied chunks. Instants are found by scanning every integer, never by prediction.

What it models, and the restrictions it asserts (the strategies in ``strategies.py`` respect
them):

- Clocks. ``trust``: device time at receipt is ``recv_ms``. ``estimate``: each device's first
  event has the smallest ``recv_ms - t_ms`` of the device (its delivery lag ``L``), so the
  offset is ``L`` from the first event on and device time at receipt is ``recv_ms - L``.
  Traces span less than the 60 s window. Either way an event's receipt instant ``at`` is
  ``>= t_ms`` and never decreases.
- Knowledge. At device time ``s`` only events with ``at <= s`` are known; messages at ``s`` are
  applied before the timers and queries at ``s``.
- A stream id is used by one stream only (no reuse after removal, no ``start`` for a stream
  that exists, no ``end`` for one that does not, nothing after a ``final`` chunk or an ``end``
  but late redeliveries of chunks with ``seq > 0``), and a stream's first chunk has ``seq 0``.
- ``throttle`` and ``throttle_*`` need integer-valued inputs (every ``expected_next`` integral).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

    from edgemon.engine.config import EngineConfig, PlayerModel

#: One event as it reaches edgemon: (recv_ms on edgemon's clock, device, event object).
TraceEvent = tuple[float, str, dict[str, Any]]

ALPHA = 0.3
#: Gaps shorter than this are pieces of one delivery, not gaps (docs/semantics.md).
BURST_GAP_MS = 20.0


class UnsupportedTraceError(ValueError):
    """The trace leaves the part of the semantics this reference models."""


@dataclass(frozen=True, slots=True)
class Received:
    """An event of one device with its receipt instant on the device's clock."""

    recv_ms: float
    at: float
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Chunk:
    """An applied chunk; ``expected_next`` is fixed when it is applied."""

    seq: int
    t: float
    at: float
    audio: float
    gap: bool
    audio_total: float | None
    play_start: float | None
    final: bool
    expected_next: float


@dataclass(slots=True)
class Stream:
    """A stream as a fold leaves it: the raw facts, nothing accumulated."""

    sid: str
    margin: float
    player: PlayerModel
    play_start: float | None
    t_last_event: float
    chunks: list[Chunk] = field(default_factory=list)
    removed: tuple[float, str] | None = None
    #: The ``start`` event's ``t_ms`` (None: begun by its first chunk), and an ``end``'s.
    start_t: float | None = None
    end_t: float | None = None


@dataclass(frozen=True, slots=True)
class View:
    """What a query needs of a stream, re-summed from its chunks for one prefix of events."""

    sid: str
    margin: float
    player: PlayerModel
    chunks: tuple[Chunk, ...]
    buffered: float
    start: float
    expected_next: float
    deadline: float
    deadline_reason: str

    @property
    def live(self) -> bool:
        """Has audio and is not draining (removal is checked against the deadline)."""
        return bool(self.chunks) and not self.chunks[-1].final


@dataclass(slots=True)
class Folded:
    """A device after a prefix of its events, as the fold leaves it."""

    streams: dict[str, Stream] = field(default_factory=dict)
    ended: dict[str, Stream] = field(default_factory=dict)
    device_gaps: list[float] = field(default_factory=list)
    rejected: list[Received] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Views of the streams present after a prefix of a device's events."""

    streams: dict[str, View]


@dataclass(frozen=True, slots=True)
class Underrun:
    """One underrun: begin instant, and end instant or ``None`` when still open at removal."""

    device: str
    stream: str
    begin: float
    end: float | None


@dataclass(frozen=True, slots=True)
class ThrottleChange:
    """A throttle transition at ``t``; ``streams`` are the at-risk ones just after ``t``."""

    t: float
    active: bool
    streams: frozenset[str]
    headrooms: dict[str, float]
    min_headroom: float | None


def ewma(gaps: Sequence[float]) -> float:
    """The gap EWMA: the first gap seeds it, then ``e <- 0.3 * gap + 0.7 * e``."""
    e = gaps[0]
    for g in gaps[1:]:
        e = ALPHA * g + (1 - ALPHA) * e
    return e


def buffer_and_start(
    chunks: Sequence[Chunk], play_start: float | None, player: PlayerModel
) -> tuple[float, float]:
    """``B`` and the player start after ``chunks``, re-summed from the first chunk."""
    b = 0.0
    start = play_start
    for c in chunks:
        if c.play_start is not None:
            start = c.play_start
        if start is None:
            start = c.t
        if player == "rebuffer":
            start += max(0.0, c.t - (start + b))  # a stalled player resumes at this chunk
        b = c.audio_total if c.gap and c.audio_total is not None else b + c.audio
    return b, math.nan if start is None else start  # no chunk yet: the player has not started


def slack_of(v: View, s: float) -> float:
    """docs/semantics.md for ``s`` at or after the view's last event."""
    slack = v.buffered - max(0.0, s - v.start)
    return max(0.0, slack) if v.player == "rebuffer" else slack


def eta_of(v: View, s: float) -> float:
    """docs/semantics.md: time until the next chunk is expected, never negative."""
    return max(0.0, v.expected_next - s)


def headroom_of(v: View, s: float) -> float:
    """docs/semantics.md, slack minus eta, where slack counts the wait before the player starts
    (docs/semantics.md): how long the buffer lasts from ``s`` minus the wait for the next chunk.
    From the player's start on this is exactly the spec's ``slack − eta``."""
    lasts = slack_of(v, s) + max(0.0, v.start - s)
    return lasts - eta_of(v, s)


def falls_after(v: View, s: float) -> bool:
    """Whether headroom falls (slope -1) just after ``s``: slack drains while eta is zero."""
    lasts_less = v.player == "conceal" or s < v.start + v.buffered
    return lasts_less and s >= v.expected_next


def at_risk_after(v: View, s: float) -> bool:
    """At risk just after ``s``: ``headroom < margin``, or equal to it and falling."""
    h = headroom_of(v, s)
    return h < v.margin or (h == v.margin and falls_after(v, s))


class Reference:
    """Brute-force answers about one whole trace under one engine configuration."""

    def __init__(self, events: Sequence[TraceEvent], config: EngineConfig) -> None:
        self.config = config
        self.policy = config.slack
        self._events: dict[str, list[Received]] = {}
        lag: dict[str, float] = {}
        last_recv = -math.inf
        for recv, device, body in events:
            if recv < last_recv:
                raise UnsupportedTraceError("trace not in receipt order")
            last_recv = recv
            if self.policy.clock == "trust":
                lag.setdefault(device, 0.0)
            else:
                lag.setdefault(device, recv - body["t_ms"])
            at = recv - lag[device]
            if at < body["t_ms"]:
                raise UnsupportedTraceError(
                    "event applied before its t_ms: with the estimate clock a device's "
                    "first event must have its smallest lag"
                )
            self._events.setdefault(device, []).append(Received(recv, at, body))
        if events and events[-1][0] - events[0][0] >= self.policy.clock_window_ms:
            raise UnsupportedTraceError("trace longer than the clock window")
        self._ats = {d: [e.at for e in evs] for d, evs in self._events.items()}
        self._snapshots: dict[tuple[str, int], Snapshot] = {}
        self._removals: dict[tuple[str, str], Stream] | None = None
        self._underruns: list[Underrun] | None = None

    @property
    def devices(self) -> list[str]:
        """Devices in order of first appearance."""
        return list(self._events)

    # ------------------------------------------------------------------ the fold
    def _margin(self, device: str, start: dict[str, Any] | None) -> float:
        override = self.config.devices.get(device)
        if override is not None and override.margin_ms is not None:
            return override.margin_ms
        if start is not None and "margin_ms" in start:
            return float(start["margin_ms"])
        return self.policy.default_margin_ms

    def _player(self, device: str, start: dict[str, Any] | None) -> PlayerModel:
        override = self.config.devices.get(device)
        if override is not None and override.player is not None:
            return override.player
        if start is not None and "player" in start:
            player: PlayerModel = start["player"]
            return player
        return self.policy.player

    def _deadline(self, st: Stream) -> tuple[float, str]:
        """When the stream is removed if nothing else arrives (semantics.md, semantics 'Ends')."""
        timeout = self.policy.stream_idle_timeout_ms
        if not st.chunks:
            return st.t_last_event + timeout, "expired"
        b, start = buffer_and_start(st.chunks, st.play_start, st.player)
        if st.chunks[-1].final:
            return max(start + b, st.chunks[-1].at), "completed"
        return max(st.t_last_event, start + b) + timeout, "expired"

    def _fold_raw(self, device: str, n: int) -> Folded:
        """The device after its first ``n`` events, computed from nothing."""
        out = Folded()
        for ev in self._events[device][:n]:
            for sid, st in list(out.streams.items()):  # timers strictly before this message
                when, reason = self._deadline(st)
                if when < ev.at:
                    st.removed = (when, reason)
                    out.ended[sid] = out.streams.pop(sid)
            if not self._apply(device, ev, out):
                out.rejected.append(ev)
        return out

    def _fold(self, device: str, n: int) -> Snapshot:
        """The device after its first ``n`` events, as views for queries."""
        raw = self._fold_raw(device, n)
        views = {}
        for sid, st in raw.streams.items():
            b, start = buffer_and_start(st.chunks, st.play_start, st.player)
            when, reason = self._deadline(st)
            views[sid] = View(
                sid=sid,
                margin=st.margin,
                player=st.player,
                chunks=tuple(st.chunks),
                buffered=b,
                start=start,
                expected_next=st.chunks[-1].expected_next if st.chunks else math.nan,
                deadline=when,
                deadline_reason=reason,
            )
        return Snapshot(views)

    def _apply(self, device: str, ev: Received, out: Folded) -> bool:
        """Apply one event; ``False`` when it is rejected (here: only as a duplicate)."""
        body = ev.body
        sid = body["stream"]
        st = out.streams.get(sid)
        kind = body["type"]
        if kind == "start":
            if st is not None or sid in out.ended:
                raise UnsupportedTraceError(f"start of existing stream {sid}")
            out.streams[sid] = Stream(
                sid=sid,
                margin=self._margin(device, body),
                player=self._player(device, body),
                play_start=body.get("play_start_ms"),
                t_last_event=body["t_ms"],
                start_t=body["t_ms"],
            )
            return True
        if kind == "end":
            if st is None:
                raise UnsupportedTraceError(f"end of unknown stream {sid}")
            st.removed = (ev.at, body["reason"])
            st.end_t = body["t_ms"]
            out.ended[sid] = out.streams.pop(sid)
            return True
        assert kind == "chunk"
        seq = body["seq"]
        if st is None:
            gone = out.ended.get(sid)
            if gone is not None and gone.removed is not None:
                if seq > 0 and ev.at <= gone.removed[0] + self.policy.stream_idle_timeout_ms:
                    return False  # a late redelivery must not resurrect the stream
                raise UnsupportedTraceError(f"stream id {sid} reused")
            if seq != 0:
                raise UnsupportedTraceError(f"stream {sid} begins with seq {seq}")
            st = out.streams[sid] = Stream(
                sid=sid,
                margin=self._margin(device, None),
                player=self._player(device, None),
                play_start=None,
                t_last_event=body["t_ms"],
            )
        last_seq = st.chunks[-1].seq if st.chunks else -1
        if seq <= last_seq:
            return False
        if st.chunks and st.chunks[-1].final:
            raise UnsupportedTraceError(f"chunk after the final chunk of {sid}")
        t = body["t_ms"]
        if st.chunks and t - st.chunks[-1].t >= BURST_GAP_MS:
            out.device_gaps.append(t - st.chunks[-1].t)
        times = [c.t for c in st.chunks] + [t]
        stream_gaps = [b - a for a, b in pairwise(times) if b - a >= BURST_GAP_MS]
        if "eta_ms" in body:
            expected_next = t + body["eta_ms"]
        elif stream_gaps:
            expected_next = t + ewma(stream_gaps)
        elif out.device_gaps:
            expected_next = t + ewma(out.device_gaps)
        else:
            expected_next = t + self.policy.default_chunk_gap_ms
        st.chunks.append(
            Chunk(
                seq=seq,
                t=t,
                at=ev.at,
                audio=body["audio_ms"],
                gap=seq > last_seq + 1,
                audio_total=body.get("audio_total_ms"),
                play_start=body.get("play_start_ms"),
                final=bool(body.get("final", False)),
                expected_next=expected_next,
            )
        )
        st.t_last_event = max(st.t_last_event, t)  # the latest event time, not the last one's
        return True

    def snapshot(self, device: str, s: float) -> Snapshot:
        """The device after every event received at or before ``s`` (cached per prefix)."""
        n = bisect.bisect_right(self._ats[device], s)
        key = (device, n)
        if key not in self._snapshots:
            self._snapshots[key] = self._fold(device, n)
        return self._snapshots[key]

    def live_views(self, device: str, s: float) -> dict[str, View]:
        """Live streams at ``s``: have audio, not final, not removed at or before ``s``."""
        return {
            sid: v
            for sid, v in self.snapshot(device, s).streams.items()
            if v.live and v.deadline > s
        }

    def live_streams(self, device: str, s: float) -> list[str]:
        """Ids of the live streams of ``device`` at ``s``."""
        return sorted(self.live_views(device, s))

    def _view(self, device: str, stream: str, s: float) -> View:
        v = self.snapshot(device, s).streams.get(stream)
        if v is None or not v.chunks or v.deadline <= s:
            raise KeyError(f"{device}/{stream} has no audio at {s}")
        return v

    # ------------------------------------------------------------------ point queries
    def slack(self, device: str, stream: str, s: float) -> float:
        """Slack at ``s`` of a stream that has audio and is not removed."""
        return slack_of(self._view(device, stream, s), s)

    def eta(self, device: str, stream: str, s: float) -> float:
        """Eta at ``s``."""
        return eta_of(self._view(device, stream, s), s)

    def headroom(self, device: str, stream: str, s: float) -> float:
        """Headroom at ``s``."""
        return headroom_of(self._view(device, stream, s), s)

    def at_risk(self, device: str, stream: str, s: float) -> bool:
        """At risk at ``s`` as the engine reports it: live and at risk just after ``s``."""
        v = self._view(device, stream, s)
        return v.live and at_risk_after(v, s)

    def headroom_just_after(self, device: str, stream: str, k: int) -> float:
        """Headroom on ``(k, k + 1)``, i.e. at ``k + 0.5`` (valid for integer-valued inputs)."""
        return headroom_of(self._view(device, stream, k), k + 0.5)

    def margin(self, device: str, stream: str, s: float) -> float:
        """The stream's margin."""
        return self._view(device, stream, s).margin

    # ------------------------------------------------------------------ whole-trace answers
    def removals(self) -> dict[tuple[str, str], Stream]:
        """Every stream ever seen, with its removal (instant, reason) once all timers fired."""
        if self._removals is None:
            self._removals = {}
            for device, evs in self._events.items():
                raw = self._fold_raw(device, len(evs))
                for st in raw.streams.values():
                    st.removed = self._deadline(st)
                for sid, st in {**raw.ended, **raw.streams}.items():
                    self._removals[device, sid] = st
        return self._removals

    def horizon(self, device: str) -> float:
        """The last removal instant of the device."""
        return max(
            st.removed[0] for (d, _), st in self.removals().items() if d == device and st.removed
        )

    def _instants(self, device: str, extra: float = 0.0) -> range:
        """Every integer from just before the device's first event to past its horizon."""
        first = math.floor(self._ats[device][0]) - 1
        return range(first, math.ceil(self.horizon(device) + extra) + 2)

    def samples(self, sample_ms: float) -> dict[tuple[float, str, str], dict[str, Any]]:
        """Expected sample lines keyed by (t_ms, device, stream): live streams at multiples."""
        out: dict[tuple[float, str, str], dict[str, Any]] = {}
        for device in self.devices:
            k = 0
            while k * sample_ms <= self.horizon(device):
                s = k * sample_ms
                for sid, v in self.live_views(device, s).items():
                    out[s, device, sid] = {
                        "slack_ms": slack_of(v, s),
                        "eta_ms": eta_of(v, s),
                        "headroom_ms": headroom_of(v, s),
                        "at_risk": headroom_of(v, s) < v.margin,  # docs/semantics.md, at s
                        "margin": v.margin,
                    }
                k += 1
        return out

    def underruns(self) -> list[Underrun]:
        """Every underrun: the edges of 'live and start + B <= t', scanned at every integer.

        With integer-valued inputs the predicate on ``(k - 1, k)`` is its value at
        ``k - 0.5`` (state as of ``k - 1``), so an edge at ``k`` is a change between the two.
        """
        if self._underruns is not None:
            return self._underruns
        out: list[Underrun] = []
        removals = self.removals()
        for device in self.devices:
            begins: dict[str, float] = {}
            before: dict[str, View] = {}
            for k in self._instants(device):
                now = self.live_views(device, k)
                for sid in now.keys() | before.keys():
                    v_now, v_before = now.get(sid), before.get(sid)
                    is_now = v_now is not None and v_now.start + v_now.buffered <= k
                    was = v_before is not None and v_before.start + v_before.buffered <= k - 0.5
                    if is_now and not was:
                        begins[sid] = k
                    elif was and not is_now:
                        removed = removals[device, sid].removed
                        closed = removed is None or removed[0] != k
                        out.append(Underrun(device, sid, begins.pop(sid), k if closed else None))
                before = now
            assert not begins
        self._underruns = out
        return out

    def throttle(self, device: str) -> list[ThrottleChange]:
        """Throttle transitions of ``device``: the ON/OFF machine run over every integer.

        ON at ``k`` if off and some live stream is at risk at ``k + 0.5``; OFF at ``k`` if on,
        ``k >= T_on + min_on_ms`` and no live stream has ``headroom < margin + hysteresis`` at
        ``k + 0.5``. With integer-valued inputs the state on ``(k, k + 1)`` is the state at
        ``k + 0.5``, so these are the docs' "just after" instants.
        """
        hysteresis = self.policy.hysteresis_ms
        min_on = self.policy.min_on_ms
        out: list[ThrottleChange] = []
        on_since: float | None = None
        for k in self._instants(device, extra=min_on):
            live = self.live_views(device, k)
            if any(not float(v.expected_next).is_integer() for v in live.values()):
                raise UnsupportedTraceError("throttle instants need integer-valued inputs")
            after = {sid: headroom_of(v, k + 0.5) for sid, v in live.items()}
            at = {sid: headroom_of(v, k) for sid, v in live.items()}
            lowest = min(at.values(), default=None)
            if on_since is None:
                risky = frozenset(sid for sid, h in after.items() if h < live[sid].margin)
                if risky:
                    on_since = k
                    out.append(ThrottleChange(k, True, risky, at, lowest))
            elif k >= on_since + min_on and all(
                h >= live[sid].margin + hysteresis for sid, h in after.items()
            ):
                on_since = None
                out.append(ThrottleChange(k, False, frozenset(), at, lowest))
        assert on_since is None
        return out

    def stream_ends(self) -> dict[tuple[str, str], dict[str, Any]]:
        """Expected ``stream_end`` lines keyed by (device, stream).

        ``underrun_ms`` is ``None`` when an underrun was still open at removal (the docs define
        a duration only for an underrun ended by a chunk); ``open_at_removal`` says so. The
        service level (docs/semantics.md): ``longest_gap_ms`` counts an underrun open at
        removal up to the removal instant, and ``outcome`` judges the stream by ``[slo]``.
        """
        runs = self.underruns()
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for (device, sid), st in self.removals().items():
            assert st.removed is not None
            when, reason = st.removed
            mine = [u for u in runs if (u.device, u.stream) == (device, sid)]
            closed = [u.end - u.begin for u in mine if u.end is not None]
            longest = max(((when if u.end is None else u.end) - u.begin for u in mine), default=0.0)
            before = [_slack_before(st, i) for i in range(1, len(st.chunks))]
            audio, start = (
                buffer_and_start(st.chunks, st.play_start, st.player)
                if st.chunks
                else (0.0, math.inf)
            )
            out[device, sid] = {
                "t_ms": when,
                "reason": reason,
                "chunks": len(st.chunks),
                "audio_ms": audio,
                "underruns": len(mine),
                "underrun_ms": sum(closed) if len(closed) == len(mine) else None,
                "open_at_removal": len(closed) != len(mine),
                "min_slack_ms": min(before) if before else None,
                "start_silence_ms": _start_silence(st),
                "longest_gap_ms": longest,
                "outcome": self._outcome(st, start + audio, longest),
            }
        return out

    def _outcome(self, st: Stream, played_out: float, longest_gap: float) -> str:
        """docs/semantics.md, "Service level", from the stream's raw facts."""
        assert st.removed is not None
        reason = st.removed[1]
        ended = st.end_t if st.end_t is not None else st.removed[0]
        if not st.chunks or reason == "expired" or (reason != "completed" and ended < played_out):
            return "unfinished"
        silence = _start_silence(st)
        if silence is not None and silence > self.config.slo.start_ms:
            return "late"
        return "gappy" if longest_gap > self.config.slo.gap_ms else "good"

    def rejected(self) -> list[tuple[float, str, str]]:
        """Events not applied, as (recv_ms, device, reason): here only duplicates."""
        return [
            (ev.recv_ms, device, "duplicate")
            for device, evs in self._events.items()
            for ev in self._fold_raw(device, len(evs)).rejected
        ]


def _start_silence(st: Stream) -> float | None:
    """The start event to playback start as the first chunk that knows it set it: the first
    chunk's, unless its player had not started yet (play start 2^53), then the first later
    one's that gives its start (None: no start event, or no chunk knew it)."""
    if st.start_t is None:
        return None
    begins = st.play_start
    for chunk in st.chunks:
        if chunk.play_start is not None:
            begins = chunk.play_start
        at = st.chunks[0].t if begins is None else begins
        if at < 2.0**53:
            return max(0.0, at - st.start_t)
    return None


def _slack_before(st: Stream, i: int) -> float:
    """Slack at chunk ``i``'s receipt, before its audio was added."""
    b, start = buffer_and_start(st.chunks[:i], st.play_start, st.player)
    slack = b - max(0.0, st.chunks[i].at - start)
    return max(0.0, slack) if st.player == "rebuffer" else slack
