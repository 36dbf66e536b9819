"""Event objects (docs/protocol.md, "Events") built from a player's calls, checked as edgemon
checks them (the limits are `edgemon.protocol`'s, the same module the daemon imports).

`Streams` keeps what the wire needs per stream (next `seq`, the exact audio total, a partial
PCM frame carried to the next chunk, the stream's audio format) and refuses, with a
ValueError, whatever edgemon would reject: nothing invalid is ever queued. A call that
conflicts with the stream's state (ended already, never reported, live already, one stream
too many) raises `Conflict` instead: the Reporter counts and logs it rather than raising into
the player. It holds no lock; the Reporter calls it under its own.

A PCM byte count that ends inside a frame (one sample of every channel) carries the leftover
bytes to the next chunk of the stream (in the same format), so `audio_total_ms` is exactly the
audio of all whole frames received. A chunk whose bytes complete no frame sends nothing; a
final chunk must hold audio (call `end()` when a stream ends without more).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from fractions import Fraction
from typing import Any, Literal

from edgemon.client.audio import AudioFormat
from edgemon.errors import EdgemonError
from edgemon.protocol import (
    MAX_AUDIO_MS,
    MAX_ETA_MS,
    MAX_MARGIN_MS,
    MAX_REASON,
    MAX_TIME_MS,
    PLAYERS,
    STREAM_ID_PATTERN,
    valid_stream_id,
)

#: How many ended stream ids are remembered to refuse chunks after `end()`.
ENDED_MEMORY = 4096

Event = dict[str, Any]

#: What a call can conflict with: see `Conflict`.
ConflictKind = Literal["ended", "unknown", "live", "max_streams", "closed"]


class Conflict(EdgemonError):  # noqa: N818 - not an error of the caller's arguments
    """A call that the stream's state makes moot (`kind`); nothing is queued for it.

    - `ended`: the stream has ended (a chunk, `start` or `end` after `end`);
    - `unknown`: `end()` of a stream nothing was reported for;
    - `live`: `start()` of a stream already started;
    - `max_streams`: a new stream beyond `max_streams` live ones;
    - `closed`: a call after the Reporter's `close()`.
    """

    def __init__(self, kind: ConflictKind, message: str) -> None:
        super().__init__(message)
        self.kind: ConflictKind = kind


class _Stream:
    __slots__ = (
        "base",
        "carry",
        "carry_format",
        "format",
        "frames",
        "frames_format",
        "next_seq",
        "sent",
    )

    def __init__(self, fmt: AudioFormat | None) -> None:
        self.format = fmt  # the stream's audio format (start's, else the Reporter's)
        self.sent = False  # whether edgemon has heard of it (a start or a chunk went out)
        self.next_seq = 0
        # The exact audio total: `base` ms plus `frames` whole frames of `frames_format`
        # (integers while the format stays the same: the common case is a division, no more).
        self.base = Fraction(0)
        self.frames = 0
        self.frames_format: AudioFormat | None = None
        self.carry = 0  # bytes of a partial frame, waiting for the next chunk
        self.carry_format: AudioFormat | None = None

    def add_frames(self, frames: int, fmt: AudioFormat) -> float:
        """Count `frames` whole frames of `fmt`; their milliseconds."""
        if fmt != self.frames_format:
            if self.frames_format is not None and self.frames:
                self.base += Fraction(self.frames * 1000, self.frames_format.rate)
            self.frames_format, self.frames = fmt, 0
        self.frames += frames
        return fmt.frames_ms(frames)

    def add_ms(self, ms: float) -> None:
        """Count `ms` milliseconds given as such."""
        self.base += Fraction(ms)

    def total_ms(self) -> float:
        """All audio counted so far, rounded once."""
        fmt = self.frames_format
        if fmt is None:
            return float(self.base)
        if not self.base:
            return fmt.frames_ms(self.frames)
        return float(self.base + Fraction(self.frames * 1000, fmt.rate))


def _checked_number(name: str, value: object, low: float, high: float, *, open_low: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        # ValueError, not TypeError: one error type for every bad argument (the contract's).
        raise ValueError(f"{name} must be a number, not {value!r}")  # noqa: TRY004
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be finite, not {value!r}")
    if (number <= low if open_low else number < low) or number > high:
        bound = "<" if open_low else "≤"
        raise ValueError(f"{name} must be {low:g} {bound} x ≤ {high:g}, not {value!r}")
    return number


def check_stream_id(stream: str) -> str:
    """`[A-Za-z0-9._:-]{1,128}` (docs/protocol.md)."""
    if not valid_stream_id(stream):
        raise ValueError(f"stream {stream!r} must match {STREAM_ID_PATTERN}")
    return stream


def check_format(value: AudioFormat | str | None) -> AudioFormat | None:
    """An audio format argument as a format (None stays None)."""
    return None if value is None else AudioFormat.of(value)


def check_t_ms(t_ms: float) -> float:
    """The clock's reading as a wire time (finite, 0 ≤ t ≤ 2**53)."""
    return _checked_number("t_ms (from the clock)", t_ms, 0.0, MAX_TIME_MS, open_low=False)


def _pcm(
    stream: str,
    state: _Stream | None,
    pcm_bytes: int,
    fmt: AudioFormat | None,
    *,
    final: bool,
) -> tuple[int, AudioFormat, int]:
    """The whole frames in `pcm_bytes` plus the stream's carried bytes, their format, and the
    bytes carried on."""
    if isinstance(pcm_bytes, bool) or not isinstance(pcm_bytes, int) or pcm_bytes <= 0:
        raise ValueError(f"pcm_bytes must be an integer > 0, not {pcm_bytes!r}")
    if fmt is None:
        raise ValueError(
            f"pcm_bytes of stream {stream!r} in an unknown audio format: give audio_format= "
            "to Reporter(...), to start(...) or to this chunk(...)"
        )
    carried = 0 if state is None else state.carry
    if carried and state is not None and state.carry_format != fmt:
        raise ValueError(
            f"stream {stream!r} carries {carried} bytes of a partial "
            f"{state.carry_format} frame; the next PCM must be in that format"
        )
    frames, carry = divmod(pcm_bytes + carried, fmt.frame_bytes)
    if frames * 1000 > MAX_AUDIO_MS * fmt.rate:
        raise ValueError(f"pcm_bytes={pcm_bytes} is more than {MAX_AUDIO_MS:g} ms of {fmt}")
    if frames == 0 and final:
        raise ValueError(
            "a final chunk must hold a whole frame of audio; "
            "call end() when a stream ends without more audio"
        )
    return frames, fmt, carry


def _merge(event: Event, t_ms: float, ms: float, total_ms: float, eta: float | None) -> None:
    """Merge a piece that arrived at `t_ms` into the waiting chunk `event`."""
    before = event["t_ms"]
    event["t_ms"] = max(before, t_ms)  # the later arrival: slack never overstated
    event["audio_ms"] += ms
    event["audio_total_ms"] = total_ms
    if eta is not None:
        event["eta_ms"] = eta
    elif "eta_ms" in event:  # the same expected instant, from the later arrival
        event["eta_ms"] = max(0.0, event["eta_ms"] - (event["t_ms"] - before))


class Streams:
    """The live streams of one device, as the Reporter has reported them."""

    __slots__ = ("_ended", "_live", "audio_format", "max_streams")

    def __init__(self, *, max_streams: int, audio_format: AudioFormat | None = None) -> None:
        self._live: dict[str, _Stream] = {}
        self._ended: OrderedDict[str, bool] = OrderedDict()  # id -> ended by a final chunk
        self.max_streams = max_streams
        #: The format of `pcm_bytes` when neither `start()` nor the chunk names one.
        self.audio_format = audio_format

    def start(
        self,
        stream: str,
        t_ms: float,
        *,
        play_start_ms: float | None,
        margin_ms: float | None,
        player: str | None,
        audio_format: AudioFormat | str | None = None,
    ) -> Event:
        """The start event of a new stream."""
        check_stream_id(stream)
        fmt = check_format(audio_format)
        event: Event = {"type": "start", "stream": stream, "t_ms": t_ms}
        if play_start_ms is not None:
            event["play_start_ms"] = _checked_number(
                "play_start_ms", play_start_ms, 0.0, MAX_TIME_MS, open_low=False
            )
        if margin_ms is not None:
            event["margin_ms"] = _checked_number(
                "margin_ms", margin_ms, 0.0, MAX_MARGIN_MS, open_low=False
            )
        if player is not None:
            if player not in PLAYERS:
                raise ValueError(f"player must be 'conceal' or 'rebuffer', not {player!r}")
            event["player"] = player
        if stream in self._live:
            raise Conflict("live", f"stream {stream!r} has already started")
        self._refuse_new(stream)
        self._add(stream, fmt or self.audio_format).sent = True
        return event

    def chunk(  # noqa: C901, PLR0912, PLR0913 - the wire's fields, and merging
        self,
        stream: str,
        t_ms: float,
        *,
        audio_ms: float | None,
        pcm_bytes: int | None,
        audio_format: AudioFormat | str | None,
        eta_ms: float | None,
        final: bool,
        play_start_ms: float | None = None,
        into: Event | None = None,
    ) -> Event | None:
        """The chunk event, or None when the bytes complete no frame yet (carried).

        `into`: the stream's previous chunk event, still waiting to be sent; this chunk is
        merged into it (and `into` returned): the audio summed, `t_ms` the later arrival, the
        latest `eta_ms` (an earlier one kept as the same instant), `play_start_ms` and `final`.
        """
        check_stream_id(stream)
        if type(final) is not bool:
            raise ValueError(f"final must be True or False, not {final!r}")
        eta = (
            None
            if eta_ms is None
            else _checked_number("eta_ms", eta_ms, 0, MAX_ETA_MS, open_low=False)
        )
        play_start = (
            None
            if play_start_ms is None
            else _checked_number("play_start_ms", play_start_ms, 0.0, MAX_TIME_MS, open_low=False)
        )
        override = check_format(audio_format)
        if (audio_ms is None) == (pcm_bytes is None):
            raise ValueError("give exactly one of audio_ms and pcm_bytes")
        ms_given = (
            None
            if audio_ms is None
            else _checked_number("audio_ms", audio_ms, 0.0, MAX_AUDIO_MS, open_low=True)
        )
        state = self._live.get(stream)
        if state is None:
            self._refuse_new(stream)
        if pcm_bytes is not None:
            fmt = override or (state.format if state is not None else self.audio_format)
            frames, fmt, carry = _pcm(stream, state, pcm_bytes, fmt, final=final)
            if state is None:
                state = self._add(stream, self.audio_format)
            carry_format = fmt if carry else None
            if not frames:  # no whole frame yet: the bytes wait for the next chunk
                state.carry, state.carry_format = carry, carry_format
                return None
            ms = state.add_frames(frames, fmt)
        else:
            assert ms_given is not None
            ms = ms_given
            if state is None:
                state = self._add(stream, self.audio_format)
            carry, carry_format = state.carry, state.carry_format
            state.add_ms(ms)
        state.sent = True
        if into is not None:
            event = into
            _merge(event, t_ms, ms, state.total_ms(), eta)
        else:
            event = {
                "type": "chunk",
                "stream": stream,
                "t_ms": t_ms,
                "seq": state.next_seq,
                "audio_ms": ms,
                "audio_total_ms": state.total_ms(),
            }
            if eta is not None:
                event["eta_ms"] = eta
            state.next_seq += 1
        if play_start is not None:
            event["play_start_ms"] = play_start
        if final:
            event["final"] = True
            self._finish(stream, by_final=True)
        else:
            state.carry, state.carry_format = carry, carry_format
        return event

    def end(self, stream: str, t_ms: float, reason: str) -> Event | None:
        """The end event, or None after a final chunk (the stream is complete already)."""
        check_stream_id(stream)
        if not isinstance(reason, str) or len(reason) > MAX_REASON:
            raise ValueError(f"reason must be a string of at most {MAX_REASON} characters")
        if stream not in self._live:
            if self._ended.get(stream):
                return None
            if stream in self._ended:
                raise Conflict("ended", f"stream {stream!r} has already ended")
            raise Conflict("unknown", f"unknown stream {stream!r}: nothing was reported for it")
        sent = self._live[stream].sent
        self._finish(stream, by_final=False)
        if not sent:  # only a partial frame was ever given: edgemon never heard of it
            return None
        return {"type": "end", "stream": stream, "t_ms": t_ms, "reason": reason}

    def _add(self, stream: str, fmt: AudioFormat | None) -> _Stream:
        state = self._live[stream] = _Stream(fmt)
        return state

    def _refuse_new(self, stream: str) -> None:
        """Refuse a stream that cannot begin now (ended already, or too many live)."""
        if stream in self._ended:
            raise Conflict(
                "ended",
                f"stream {stream!r} has ended: nothing more can be reported for it "
                "(a new stream needs a new id)",
            )
        if len(self._live) >= self.max_streams:
            raise Conflict(
                "max_streams",
                f"more than {self.max_streams} live streams; end() the finished ones "
                "(or raise max_streams to match edgemon's max_streams_per_device)",
            )

    def _finish(self, stream: str, *, by_final: bool) -> None:
        del self._live[stream]
        ended = self._ended
        ended[stream] = by_final
        ended.move_to_end(stream)
        if len(ended) > ENDED_MEMORY:
            ended.popitem(last=False)
