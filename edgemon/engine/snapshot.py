"""The engine's state as plain JSON values, and back (reliability.md: a restart loses no stream).

A snapshot holds what events built up — streams, clocks, throttles, totals — not what can be
derived: risk flags, counts and timers are recomputed on restore (the device's lifecycle
adopts each stream and arms its timer afresh: `Lifecycle.adopt`, `Lifecycle.restore_timers`).
Times stay on the devices' clocks. On restore each device's clock resumes from the instant it
had reached: the downtime is cut out of the device's timeline, and the messages the broker
queued meanwhile bring it forward at their own `t_ms` as they arrive (the offset is estimated
afresh), so a stream whose chunks kept coming shows no underrun for the time edgemon was away.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import msgspec

from edgemon.engine.capacity import CapacityRecord
from edgemon.engine.device import Device
from edgemon.engine.events import CheckedChunk, ChunkEvent
from edgemon.engine.headroom import INF
from edgemon.engine.kv import KVVerdict
from edgemon.engine.reorder_buffer import Held
from edgemon.engine.stream import Phase, Stream
from edgemon.engine.timers import MIN_ON
from edgemon.engine.tombstones import Tombstones
from edgemon.engine.tts import TtsEngineInfo
from edgemon.errors import EdgemonError

if TYPE_CHECKING:
    from collections.abc import Iterable

    from edgemon.engine.config import EngineConfig
    from edgemon.engine.histogram import Histogram

FORMAT = 1

#: Stream fields kept as they are (times on the device's clock; INF stored as null).
_STREAM_FIELDS = (
    "buffered",
    "chunks",
    "expected",
    "first_audio_ms",
    "gap_ewma",
    "last_seq",
    "margin_from_start",
    "min_slack",
    "start",
    "t_last_chunk",
    "t_last_event",
    "t_start_event",
    "underrun_ms",
    "underrun_since",
    "underruns",
)
_STAT_FIELDS = (
    "audio_ms",
    "chunks",
    "streams_started",
    "throttle_engagements",
    "throttle_ms",
    "underrun_ms",
    "underruns",
)
_HISTOGRAMS = ("chunk_gap", "slack_at_arrival", "time_to_first_audio")
#: Histograms a snapshot may lack (one written by an earlier version): restored empty.
_HISTOGRAMS_ADDED = ("start_silence", "longest_gap")
#: Fields added with late delivery (docs/semantics.md), and their values in an older snapshot.
_STREAM_LATE_FIELDS = {"underrun_provisional": False, "underrun_published": False}
#: Fields added with the service level (docs/semantics.md), and their values in an older
#: snapshot (which knew no start silence and no longest gap).
_STREAM_SLO_FIELDS: dict[str, float | None] = {"start_silence_ms": None, "longest_gap_ms": 0.0}


class SnapshotError(EdgemonError, ValueError):
    """A snapshot that cannot be restored (wrong format or version, missing fields)."""


def take(devices: Iterable[Device], wall_ms: float) -> dict[str, Any]:
    """The engine's state (its `devices`) at wall time `wall_ms`, as JSON-ready values."""
    return {
        "format": FORMAT,
        "wall_ms": wall_ms,
        "devices": [_device(device, wall_ms) for device in devices],
    }


def restore_devices(data: dict[str, Any], config: EngineConfig, wall_ms: float) -> list[Device]:
    """Devices rebuilt from `take`'s output, their clocks resumed at wall time `wall_ms`.

    Flags, counts and timers are recomputed; the caller schedules the devices.
    """
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SnapshotError(f"not an edgemon snapshot of format {FORMAT}")
    try:
        return [_restore_device(item, config, wall_ms) for item in data["devices"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise SnapshotError(f"snapshot is incomplete or malformed ({exc!r})") from None


# ---------------------------------------------------------------------- take
def _device(device: Device, wall_ms: float) -> dict[str, Any]:
    stats = device.stats
    info = device.engine_info
    return {
        "id": device.id,
        "device_ms": device.clock.now(wall_ms),
        "gap_ewma": device.gap_ewma,
        "throttle_on": device.throttle_on,
        "throttle_since": device.throttle_since,
        "last_message_wall_ms": device.last_message_wall_ms,
        "event_time": _finite(device.lateness.event_time),
        "horizon": _finite(device.lateness.horizon),
        "engine_info": None if info is None else _engine_info(info),
        "capacity": None if device.capacity is None else device.capacity.as_dict(),
        "stats": {
            **{name: getattr(stats, name) for name in _STAT_FIELDS},
            "underruns_retracted": stats.underruns_retracted,
            "finished": dict(stats.finished),
            "slo": dict(stats.slo),
            **{name: _histogram(getattr(stats, name)) for name in _HISTOGRAMS + _HISTOGRAMS_ADDED},
        },
        "tombstones": device.tombstones.as_dict(),  # a copy: serialised off the event loop
        "streams": [_stream(stream) for stream in device.streams.values()],
    }


def _stream(stream: Stream) -> dict[str, Any]:
    return {
        "id": stream.id,
        "phase": stream.phase.value,
        "rebuffer": stream.rebuffer,
        **{name: _finite(getattr(stream, name)) for name in _STREAM_FIELDS},
        **{name: getattr(stream, name) for name in _STREAM_LATE_FIELDS},
        **{name: getattr(stream, name) for name in _STREAM_SLO_FIELDS},
        "held": None if stream.held is None else _held(stream.held),
    }


def _held(held: Held) -> dict[str, Any]:
    return {
        "chunks": [
            [msgspec.to_builtins(e), held.arrived[seq], _finite(held.floors[seq])]
            for seq, e in held.chunks.items()
        ]
    }


def _engine_info(info: TtsEngineInfo) -> dict[str, Any]:
    return {
        "margin_ms": info.margin_ms,
        "hardware_class": info.hardware_class,
        "kv": None if info.kv is None else asdict(info.kv),
        "kv_error": info.kv_error,
    }


def _histogram(histogram: Histogram) -> dict[str, Any]:
    return {"counts": list(histogram.counts), "total": histogram.total}


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and math.isinf(value) else value


# ---------------------------------------------------------------------- restore
def _restore_device(item: dict[str, Any], config: EngineConfig, wall_ms: float) -> Device:
    device = Device(str(item["id"]), config)
    resumed = float(item["device_ms"])
    clock = device.clock
    clock.offset_ms = wall_ms - resumed  # the device's clock resumes where it had reached
    clock.reach(resumed, wall_ms)
    device.applier.gap_ewma = item["gap_ewma"]
    device.throttle.on = bool(item["throttle_on"])
    device.throttle.since = float(item["throttle_since"])
    device.last_message_wall_ms = float(item["last_message_wall_ms"])
    event_time = item.get("event_time")
    device.lateness.event_time = -INF if event_time is None else float(event_time)
    horizon = item.get("horizon")
    device.lateness.horizon = -INF if horizon is None else float(horizon)
    info = item["engine_info"]
    if info is not None:
        kv = info["kv"]
        device.set_engine_info(
            TtsEngineInfo(
                margin_ms=info["margin_ms"],
                hardware_class=info["hardware_class"],
                kv=None if kv is None else KVVerdict(**kv),
                kv_error=info["kv_error"],
            ),
            resumed,
        )
    capacity = item.get("capacity")  # absent from a snapshot older than capacity objects
    if capacity is not None:
        device.capacity = CapacityRecord.from_dict(capacity)
    _restore_stats(device, item["stats"])
    removed = {str(k): float(v) for k, v in item["tombstones"].items()}
    device.lifecycle.tombstones = Tombstones(removed)
    for fields in item["streams"]:
        device.lifecycle.adopt(_restore_stream(fields, resumed))
    device.lifecycle.restore_timers(resumed)
    min_on_until = device.throttle.since + config.slack.min_on_ms
    if device.throttle.on and min_on_until > resumed:
        device.timers.push(min_on_until, 0, MIN_ON)
    return device


def _restore_stats(device: Device, data: dict[str, Any]) -> None:
    stats = device.stats
    for name in _STAT_FIELDS:
        setattr(stats, name, type(getattr(stats, name))(data[name]))
    stats.underruns_retracted = int(data.get("underruns_retracted", 0))
    stats.finished.update({str(k): int(v) for k, v in data["finished"].items()})
    stats.slo.update({str(k): int(v) for k, v in data.get("slo", {}).items()})
    for name in _HISTOGRAMS + tuple(name for name in _HISTOGRAMS_ADDED if name in data):
        histogram: Histogram = getattr(stats, name)
        counts = [int(n) for n in data[name]["counts"]]
        if len(counts) != len(histogram.counts):
            raise ValueError(f"{name}: {len(counts)} buckets, expected {len(histogram.counts)}")
        histogram.counts = counts
        histogram.total = float(data[name]["total"])


def _restore_stream(fields: dict[str, Any], resumed: float) -> Stream:
    stream = Stream(
        str(fields["id"]),
        t_ms=resumed,
        rebuffer=bool(fields["rebuffer"]),
        margin=0.0,
        margin_from_start=None,
        started_by_event=False,
        play_start_ms=None,
    )
    for name in _STREAM_FIELDS:
        value = fields[name]
        setattr(stream, name, INF if value is None and name in ("start", "expected") else value)
    for name, default in _STREAM_LATE_FIELDS.items():
        setattr(stream, name, bool(fields.get(name, default)))
    for name, absent in _STREAM_SLO_FIELDS.items():
        value = fields.get(name, absent)
        setattr(stream, name, None if value is None else float(value))
    held = fields.get("held")
    if held is not None:
        stream.held = Held()
        for chunk, arrived, *floor in held["chunks"]:
            bound = floor[0] if floor and floor[0] is not None else -INF
            msgspec.convert(chunk, CheckedChunk)  # its stream id too, as the wire checks it
            stream.held.add(msgspec.convert(chunk, ChunkEvent), float(arrived), float(bound))
    stream.phase = Phase(fields["phase"])
    return stream
