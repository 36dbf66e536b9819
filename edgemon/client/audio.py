"""Raw PCM formats, and how many milliseconds of audio a byte count holds.

A format is written `ENCODING:RATE:CHANNELS`, e.g. `s16le:24000:1` (what vLLM-Omni's
Qwen3-TTS streams: 48,000 bytes per second). Encodings: signed integer `s16`, `s24` (packed,
3 bytes), `s32` and float `f32`, each `le` or `be` (the byte order does not change the
duration). The common formats are constants: `AudioFormat.PCM_S16LE_24K_MONO` and friends.

Durations are exact where they can be: a whole number of frames `n` is `n * 1000 / rate`
milliseconds, computed from integers and rounded once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

_SAMPLE_BYTES = {
    "s16le": 2,
    "s16be": 2,
    "s24le": 3,
    "s24be": 3,
    "s32le": 4,
    "s32be": 4,
    "f32le": 4,
    "f32be": 4,
}
_MAX_RATE = 768_000
_MAX_CHANNELS = 8
_FORM = "ENCODING:RATE:CHANNELS, e.g. 's16le:24000:1'"


@dataclass(frozen=True, slots=True)
class AudioFormat:
    """Interleaved raw PCM: sample encoding, sample rate (Hz) and channel count."""

    encoding: str
    rate: int
    channels: int

    PCM_S16LE_16K_MONO: ClassVar[AudioFormat]
    PCM_S16LE_22K_MONO: ClassVar[AudioFormat]
    PCM_S16LE_24K_MONO: ClassVar[AudioFormat]
    PCM_S16LE_44K_STEREO: ClassVar[AudioFormat]
    PCM_S16LE_48K_MONO: ClassVar[AudioFormat]
    PCM_S16LE_48K_STEREO: ClassVar[AudioFormat]
    PCM_F32LE_24K_MONO: ClassVar[AudioFormat]
    PCM_F32LE_48K_STEREO: ClassVar[AudioFormat]

    def __post_init__(self) -> None:
        if self.encoding not in _SAMPLE_BYTES:
            known = ", ".join(_SAMPLE_BYTES)
            raise ValueError(f"unknown PCM encoding {self.encoding!r}; known: {known}")
        if type(self.rate) is not int or not 0 < self.rate <= _MAX_RATE:
            raise ValueError(f"sample rate must be an integer in 1..{_MAX_RATE} Hz")
        if type(self.channels) is not int or not 0 < self.channels <= _MAX_CHANNELS:
            raise ValueError(f"channels must be an integer in 1..{_MAX_CHANNELS}")

    @classmethod
    def parse(cls, text: str) -> AudioFormat:
        """`ENCODING:RATE:CHANNELS` (e.g. `s16le:24000:1`) as a format; ValueError otherwise."""
        parts = text.strip().lower().split(":")
        if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
            raise ValueError(f"audio format {text!r} must be {_FORM}")
        return cls(parts[0], int(parts[1]), int(parts[2]))

    @classmethod
    def of(cls, value: AudioFormat | str) -> AudioFormat:
        """A format given as itself or as its text form."""
        if isinstance(value, AudioFormat):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        raise ValueError(f"audio_format must be an AudioFormat or {_FORM}, not {value!r}")

    @property
    def frame_bytes(self) -> int:
        """Bytes of one frame (one sample of every channel)."""
        return _SAMPLE_BYTES[self.encoding] * self.channels

    @property
    def bytes_per_second(self) -> int:
        """Bytes of one second of audio (48,000 for `s16le:24000:1`)."""
        return self.frame_bytes * self.rate

    def frames_ms(self, frames: int) -> float:
        """Milliseconds of `frames` whole frames, rounded once."""
        return frames * 1000 / self.rate

    def duration_ms(self, pcm_bytes: int) -> float:
        """Milliseconds in `pcm_bytes` (the whole frames in it; a partial frame counts 0)."""
        return self.frames_ms(pcm_bytes // self.frame_bytes)

    def __str__(self) -> str:
        return f"{self.encoding}:{self.rate}:{self.channels}"


AudioFormat.PCM_S16LE_16K_MONO = AudioFormat("s16le", 16_000, 1)
AudioFormat.PCM_S16LE_22K_MONO = AudioFormat("s16le", 22_050, 1)
AudioFormat.PCM_S16LE_24K_MONO = AudioFormat("s16le", 24_000, 1)
AudioFormat.PCM_S16LE_44K_STEREO = AudioFormat("s16le", 44_100, 2)
AudioFormat.PCM_S16LE_48K_MONO = AudioFormat("s16le", 48_000, 1)
AudioFormat.PCM_S16LE_48K_STEREO = AudioFormat("s16le", 48_000, 2)
AudioFormat.PCM_F32LE_24K_MONO = AudioFormat("f32le", 24_000, 1)
AudioFormat.PCM_F32LE_48K_STEREO = AudioFormat("f32le", 48_000, 2)
