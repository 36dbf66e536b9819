"""Event objects of SPEC §1 built from a player's calls, checked as edgemon checks them.

`Streams` keeps what the wire needs per stream (next `seq`, the exact audio total, a partial
PCM frame carried to the next chunk) and refuses, with a ValueError, whatever edgemon would
reject: nothing invalid is ever queued. It holds no lock; the Reporter calls it under its own.

A PCM byte count that ends inside a frame (one sample of every channel) carries the leftover
bytes to the next chunk of the stream (in the same format), so `audio_total_ms` is exactly the
audio of all whole frames received. A chunk whose bytes complete no frame sends nothing; a
final chunk must hold audio (call `end()` when a stream ends without more).
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from fractions import Fraction
from typing import Any

from edgemon.client.audio import AudioFormat

_STREAM_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
MAX_AUDIO_MS = 600_000.0
MAX_ETA_MS = 3_600_000.0
MAX_MARGIN_MS = 60_000.0
MAX_TIME_MS = float(2**53)
MAX_REASON = 64
PLAYERS = frozenset({"conceal", "rebuffer"})
#: How many ended stream ids are remembered to refuse chunks after `end()`.
ENDED_MEMORY = 4096

Event = dict[str, Any]


class _Stream:
    __slots__ = ("base", "carry", "carry_format", "frames", "frames_format", "next_seq", "sent")

    def __init__(self) -> None:
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


def _number(name: str, value: object, low: float, high: float, *, open_low: bool) -> float:
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


def _optional_time(name: str, value: float | None) -> float | None:
    """None, or a device-clock time (0 ≤ x ≤ the largest `t_ms`)."""
    return None if value is None else _number(name, value, 0.0, MAX_TIME_MS, open_low=False)


def check_stream_id(stream: str) -> str:
    """`[A-Za-z0-9._:-]{1,128}` (SPEC §1)."""
    if not isinstance(stream, str) or _STREAM_ID.fullmatch(stream) is None:
        raise ValueError(f"stream {stream!r} must match [A-Za-z0-9._:-]{{1,128}}")
    return stream


def check_t_ms(t_ms: float) -> float:
    """The clock's reading as a wire time (finite, 0 ≤ t ≤ 2**53)."""
    return _number("t_ms (from the clock)", t_ms, 0.0, MAX_TIME_MS, open_low=False)


def _pcm(
    stream: str,
    state: _Stream | None,
    pcm_bytes: int,
    audio_format: AudioFormat | str,
    *,
    final: bool,
) -> tuple[int, AudioFormat, int]:
    """The whole frames in `pcm_bytes` plus the stream's carried bytes, their format, and the
    bytes carried on."""
    fmt = AudioFormat.of(audio_format)
    if isinstance(pcm_bytes, bool) or not isinstance(pcm_bytes, int) or pcm_bytes <= 0:
        raise ValueError(f"pcm_bytes must be an integer > 0, not {pcm_bytes!r}")
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


class Streams:
    """The live streams of one device, as the Reporter has reported them."""

    __slots__ = ("_ended", "_live", "max_streams")

    def __init__(self, *, max_streams: int) -> None:
        self._live: dict[str, _Stream] = {}
        self._ended: OrderedDict[str, bool] = OrderedDict()  # id -> ended by a final chunk
        self.max_streams = max_streams

    def __len__(self) -> int:
        return len(self._live)

    def start(
        self,
        stream: str,
        t_ms: float,
        *,
        play_start_ms: float | None,
        margin_ms: float | None,
        player: str | None,
    ) -> Event:
        """The start event of a new stream."""
        check_stream_id(stream)
        event: Event = {"type": "start", "stream": stream, "t_ms": t_ms}
        if play_start_ms is not None:
            event["play_start_ms"] = _number(
                "play_start_ms", play_start_ms, 0.0, MAX_TIME_MS, open_low=False
            )
        if margin_ms is not None:
            event["margin_ms"] = _number("margin_ms", margin_ms, 0.0, MAX_MARGIN_MS, open_low=False)
        if player is not None:
            if player not in PLAYERS:
                raise ValueError(f"player must be 'conceal' or 'rebuffer', not {player!r}")
            event["player"] = player
        if stream in self._live:
            raise ValueError(f"stream {stream!r} has already started")
        self._refuse_ended(stream)
        self._add(stream).sent = True
        return event

    def chunk(
        self,
        stream: str,
        t_ms: float,
        *,
        audio_ms: float | None,
        pcm_bytes: int | None,
        audio_format: AudioFormat | str,
        eta_ms: float | None,
        final: bool,
        play_start_ms: float | None = None,
    ) -> Event | None:
        """The chunk event, or None when the bytes complete no frame yet (carried)."""
        check_stream_id(stream)
        if type(final) is not bool:
            raise ValueError(f"final must be True or False, not {final!r}")
        eta = None if eta_ms is None else _number("eta_ms", eta_ms, 0, MAX_ETA_MS, open_low=False)
        play = _optional_time("play_start_ms", play_start_ms)
        state = self._live.get(stream)
        if state is None:
            self._refuse_new(stream)
        if (audio_ms is None) == (pcm_bytes is None):
            raise ValueError("give exactly one of audio_ms and pcm_bytes")
        if pcm_bytes is not None:
            frames, fmt, carry = _pcm(stream, state, pcm_bytes, audio_format, final=final)
            if state is None:
                state = self._add(stream)
            carry_format = fmt if carry else None
            if not frames:  # no whole frame yet: the bytes wait for the next chunk
                state.carry, state.carry_format = carry, carry_format
                return None
            ms = state.add_frames(frames, fmt)
        else:
            ms = _number("audio_ms", audio_ms, 0.0, MAX_AUDIO_MS, open_low=True)
            if state is None:
                state = self._add(stream)
            carry, carry_format = state.carry, state.carry_format
            state.add_ms(ms)
        state.sent = True
        event: Event = {
            "type": "chunk",
            "stream": stream,
            "t_ms": t_ms,
            "seq": state.next_seq,
            "audio_ms": ms,
            "audio_total_ms": state.total_ms(),
        }
        event.update(
            (key, value)
            for key, value in (("eta_ms", eta), ("play_start_ms", play))
            if value is not None
        )
        if final:
            event["final"] = True
            self._finish(stream, by_final=True)
        else:
            state.next_seq += 1
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
                raise ValueError(f"stream {stream!r} has already ended")
            raise ValueError(f"unknown stream {stream!r}: nothing was reported for it")
        sent = self._live[stream].sent
        self._finish(stream, by_final=False)
        if not sent:  # only a partial frame was ever given: edgemon never heard of it
            return None
        return {"type": "end", "stream": stream, "t_ms": t_ms, "reason": reason}

    def _add(self, stream: str) -> _Stream:
        if len(self._live) >= self.max_streams:
            self._too_many()
        state = self._live[stream] = _Stream()
        return state

    def _refuse_new(self, stream: str) -> None:
        """Refuse a stream that cannot begin now (ended already, or too many live)."""
        self._refuse_ended(stream)
        if len(self._live) >= self.max_streams:
            self._too_many()

    def _too_many(self) -> None:
        raise ValueError(
            f"more than {self.max_streams} live streams; end() the finished ones "
            "(or raise max_streams to match edgemon's max_streams_per_device)"
        )

    def _refuse_ended(self, stream: str) -> None:
        if stream in self._ended:
            raise ValueError(
                f"stream {stream!r} has ended: nothing more can be reported for it "
                "(a new stream needs a new id)"
            )

    def _finish(self, stream: str, *, by_final: bool) -> None:
        del self._live[stream]
        ended = self._ended
        ended[stream] = by_final
        ended.move_to_end(stream)
        if len(ended) > ENDED_MEMORY:
            ended.popitem(last=False)
