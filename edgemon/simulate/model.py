"""Synthetic TTS devices on a virtual clock: the events they would publish, in time order.

Pure and deterministic: no asyncio, no MQTT, no wall clock. A `Simulation` is seeded and
started at `start_ms`; `until(t_ms)` hands out every message due by then. The publisher maps
the virtual clock to the wall clock; tests run it through the engine directly.

What a device does (per stream slot, `streams` slots per device, so that many streams are
being generated at once):

- a `start` event, then a first chunk of one codec frame (80 ms of audio) after a short
  prefill (≈ 20 ms) plus 80 ms × RTF — time to first audio ≈ 30 ms at RTF 0.1;
- then chunks of 25 frames (2 s of audio), each taking 2 s × RTF ± 8 % jitter plus a 5 ms
  hop; the last chunk holds 1–25 frames and is `final`;
- with probability `stall_rate` per chunk, an extra delay of 0.5–3 s (a stall);
- some streams (`cancel_rate`) are cancelled between two chunks with an `end` event;
- the slot's next stream starts 50–500 ms after the previous one finished: after its audio
  has played out, or after it was cancelled. So edgemon sees about `streams` streams per
  device (generation is RTF times faster than playback, so it idles in between).

Every chunk carries `seq`, `audio_ms`, `audio_total_ms`, `final` when last, and (unless last)
`eta_ms`: the device's own estimate of the next chunk's generation time (nominal, without
jitter or stalls). The player does not start at the first chunk: 80 ms would run dry before
a 2 s chunk can be generated at any realistic RTF, so the first chunk carries
`play_start_ms` = its arrival + (eta − 80 ms) + a 120 ms cushion: the announced wait for the
second chunk plus edgemon's margin (80 ms here) and room for the chunk's jitter (with a
cushion under the margin, 40 ms as it was, every healthy stream started at risk and throttled
its device). At RTF 0.1 with no
stalls a stream then never underruns; at RTF ≥ 1 every chunk falls further behind.
"""

from __future__ import annotations

import heapq
import math
import random
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Sequence

FRAME_MS = 80.0
"""Audio of one codec frame."""
CHUNK_FRAMES = 25
"""Frames per chunk after the first."""
CHUNK_MS = CHUNK_FRAMES * FRAME_MS
PREFILL_MS = (15.0, 25.0)
"""Prefill before the first frame (uniform range)."""
HOP_MS = 5.0
"""Fixed cost per chunk besides decoding (codec, hand-off, network)."""
JITTER = 0.08
"""Relative jitter of a chunk's generation time (uniform ±)."""
STALL_MS = (500.0, 3000.0)
"""Extra delay of a stall (uniform range)."""
PLAYER_CUSHION_MS = 120.0
"""What the player keeps beyond the announced wait for the second chunk: the margin (80 ms for
this engine's hardware class) and 40 ms for the jitter of a healthy device's chunk."""
CHUNKS_PER_STREAM = (2, 8)
"""Chunks after the first (inclusive range); the last one is partial."""
THINK_MS = (50.0, 500.0)
"""Pause between a stream's end and the slot's next stream (uniform range)."""

#: The Qwen3-TTS talker on a Jetson-class box: 28 layers × 8 KV heads × 128, bf16.
ENGINE_OBJECT: dict[str, Any] = {
    "kv_cache_bytes": 4 * 2**30,
    "max_num_seqs": 8,
    "max_model_len": 4096,
    "block_size": 16,
    "dtype": "bfloat16",
    "kv_cache_dtype": "auto",
    "geometry": {"num_layers": 28, "num_kv_heads": 8, "head_dim": 128},
    "hardware_class": "jetson",
}


class Message(NamedTuple):
    """One event a device publishes at `t_ms` (its clock) on its events topic."""

    t_ms: float
    device: str
    payload: dict[str, Any]


class Simulation:
    """Seeded synthetic devices; `until` advances the virtual clock and returns what is due."""

    __slots__ = ("_devices", "_heap", "_slots", "_stopped", "start_ms")

    def __init__(
        self,
        *,
        devices: int,
        streams: int,
        rtf: float | Sequence[float],
        stall_rate: float,
        seed: int,
        start_ms: float = 0.0,
        cancel_rate: float = 0.2,
        device_prefix: str = "sim",
    ) -> None:
        if devices < 1:
            raise ValueError("devices must be ≥ 1")
        if streams < 1:
            raise ValueError("streams must be ≥ 1")
        rtfs = [float(rtf)] * devices if isinstance(rtf, int | float) else [float(x) for x in rtf]
        if len(rtfs) != devices:
            raise ValueError(f"{len(rtfs)} RTF values for {devices} devices")
        if not all(math.isfinite(x) and x > 0 for x in rtfs):
            raise ValueError("rtf must be a finite number > 0")
        if not 0.0 <= stall_rate <= 1.0:
            raise ValueError("stall_rate must be between 0 and 1")
        if not 0.0 <= cancel_rate <= 1.0:
            raise ValueError("cancel_rate must be between 0 and 1")
        if not (math.isfinite(start_ms) and start_ms >= 0):
            raise ValueError("start_ms must be a finite number ≥ 0")
        self.start_ms = start_ms
        self._devices = tuple(f"{device_prefix}-{i}" for i in range(devices))
        self._slots: list[_Slot] = []
        self._heap: list[tuple[float, int]] = []
        self._stopped = False
        for d, (name, device_rtf) in enumerate(zip(self._devices, rtfs, strict=True)):
            for s in range(streams):
                rng = random.Random(f"{seed}/{d}/{s}")  # noqa: S311 - a simulation, not secrets
                first = start_ms + rng.uniform(0.0, THINK_MS[1])
                slot = _Slot(name, s, rng, device_rtf, stall_rate, cancel_rate, first)
                self._heap.append((slot.due, len(self._slots)))
                self._slots.append(slot)
        heapq.heapify(self._heap)

    @property
    def devices(self) -> tuple[str, ...]:
        """The simulated device ids, in order."""
        return self._devices

    def engine_objects(self) -> dict[str, dict[str, Any]]:
        """The engine object (docs/protocol.md) each device publishes retained at start-up."""
        return {device: _engine_object() for device in self._devices}

    def next_t_ms(self) -> float | None:
        """When the next message is due (None once stopped)."""
        return None if self._stopped else self._heap[0][0]

    def until(self, t_ms: float) -> list[Message]:
        """Every message due at or before `t_ms`, in time order (ties: device, slot order)."""
        out: list[Message] = []
        if self._stopped:
            return out
        heap, slots = self._heap, self._slots
        while heap[0][0] <= t_ms:
            _, index = heap[0]
            slot = slots[index]
            out.append(Message(slot.due, slot.device, slot.step()))
            heapq.heapreplace(heap, (slot.due, index))
        return out

    def stop(self, t_ms: float) -> list[Message]:
        """End the simulation at `t_ms`: `end` (cancelled) for every stream still generating.

        Messages due by `t_ms` are returned first, so nothing is skipped; a stream whose final
        chunk was sent needs no end. Afterwards `until` returns nothing.
        """
        out = self.until(t_ms)
        for slot in self._slots:
            if slot.stream is not None:
                out.append(Message(t_ms, slot.device, slot.cancel(t_ms)))
        self._stopped = True
        return out


def _engine_object() -> dict[str, Any]:
    obj = dict(ENGINE_OBJECT)
    obj["geometry"] = dict(ENGINE_OBJECT["geometry"])
    return obj


class _Slot:
    """One generation slot of a device: streams one after another, as a small state machine."""

    __slots__ = (
        "audio_total",
        "cancel_after",
        "cancel_rate",
        "count",
        "device",
        "due",
        "index",
        "plan",
        "play_start",
        "rng",
        "rtf",
        "seq",
        "stall_rate",
        "stream",
    )

    def __init__(
        self,
        device: str,
        index: int,
        rng: random.Random,
        rtf: float,
        stall_rate: float,
        cancel_rate: float,
        first_start_ms: float,
    ) -> None:
        self.device = device
        self.index = index
        self.rng = rng
        self.rtf = rtf
        self.stall_rate = stall_rate
        self.cancel_rate = cancel_rate
        self.count = 0
        #: The stream being generated; None between streams (the next step is a start).
        self.stream: str | None = None
        self.plan: list[float] = []
        self.seq = -1
        self.cancel_after: int | None = None
        self.audio_total = 0.0
        self.play_start = 0.0
        self.due = _ms(first_start_ms)

    def step(self) -> dict[str, Any]:
        """The event due at `self.due`; schedules the next one."""
        t = self.due
        if self.stream is None:
            return self._start(t)
        if self.cancel_after == self.seq:
            return self.cancel(t)
        return self._chunk(t)

    def cancel(self, t: float) -> dict[str, Any]:
        """End the current stream as cancelled at `t`; the next stream starts after a pause."""
        assert self.stream is not None
        event = {"type": "end", "stream": self.stream, "t_ms": t, "reason": "cancelled"}
        self._idle(t)
        return event

    def _start(self, t: float) -> dict[str, Any]:
        rng = self.rng
        self.stream = f"s{self.index}-{self.count}"
        self.count += 1
        longs = rng.randint(*CHUNKS_PER_STREAM)
        self.plan = [FRAME_MS] + [CHUNK_MS] * (longs - 1)
        self.plan.append(rng.randint(1, CHUNK_FRAMES) * FRAME_MS)
        self.seq = -1
        self.audio_total = 0.0
        # Cancelled streams end after one of their chunks, before the final one.
        cancelled = rng.random() < self.cancel_rate
        self.cancel_after = rng.randrange(len(self.plan) - 1) if cancelled else None
        prefill = rng.uniform(*PREFILL_MS)
        self.due = _ms(t + prefill + self._generation_ms(FRAME_MS))
        return {"type": "start", "stream": self.stream, "t_ms": t}

    def _chunk(self, t: float) -> dict[str, Any]:
        assert self.stream is not None
        self.seq += 1
        seq, plan = self.seq, self.plan
        audio = plan[seq]
        self.audio_total += audio
        event: dict[str, Any] = {
            "type": "chunk",
            "stream": self.stream,
            "t_ms": t,
            "seq": seq,
            "audio_ms": audio,
            "audio_total_ms": self.audio_total,
        }
        if seq == len(plan) - 1:
            event["final"] = True
            # The player (conceal model) has played it all out at play_start + audio.
            self._idle(max(t, self.play_start + self.audio_total))
            return event
        eta = _ms(plan[seq + 1] * self.rtf + HOP_MS)
        event["eta_ms"] = eta
        if seq == 0:
            self.play_start = _ms(t + max(0.0, eta - audio) + PLAYER_CUSHION_MS)
            event["play_start_ms"] = self.play_start
        generation = self._generation_ms(plan[seq + 1]) + HOP_MS
        if self.cancel_after == seq:
            self.due = _ms(t + self.rng.uniform(1.0, generation))
        else:
            self.due = _ms(t + generation)
        return event

    def _generation_ms(self, audio_ms: float) -> float:
        rng = self.rng
        ms = audio_ms * self.rtf * (1.0 + rng.uniform(-JITTER, JITTER))
        if rng.random() < self.stall_rate:
            ms += rng.uniform(*STALL_MS)
        return ms

    def _idle(self, t: float) -> None:
        self.stream = None
        self.cancel_after = None
        self.due = _ms(t + self.rng.uniform(*THINK_MS))


def _ms(t: float) -> float:
    """Times on the wire to 0.1 ms: exact enough, and short in JSON."""
    return round(t, 1)
