"""The wire contract in one place: names, patterns and limits that both ends check.

`edgemon.client` (the Reporter and the gate) and the daemon's engine and wire layer import
these constants, so a player refuses at the call exactly what edgemon would reject on the
wire. Standard library only: a player or a vLLM process imports it without the daemon's
dependencies. What each constant means is written out in docs/protocol.md.
"""

from __future__ import annotations

import re
from typing import Final

#: Default topic prefix `P`.
TOPIC_PREFIX: Final = "edgemon/v1"
#: The topic level edgemon's own topics live under (`P/_edgemon/{instance}/status`): never a
#: device id, so no device's topics can shadow edgemon's status.
RESERVED_DEVICE: Final = "_edgemon"

#: A device id is one topic level (no `/`, `+`, `#`); a stream id also allows `:`.
DEVICE_ID_PATTERN: Final = r"[A-Za-z0-9._-]{1,64}"
STREAM_ID_PATTERN: Final = r"[A-Za-z0-9._:-]{1,128}"
DEVICE_ID: Final = re.compile(DEVICE_ID_PATTERN)
STREAM_ID: Final = re.compile(STREAM_ID_PATTERN)

#: Event `type`s and their fields (every event carries `type`, `stream` and `t_ms`).
EVENT_TYPES: Final = ("start", "chunk", "end")
START_FIELDS: Final = ("play_start_ms", "margin_ms", "player")
CHUNK_FIELDS: Final = ("seq", "audio_ms", "eta_ms", "final", "audio_total_ms", "play_start_ms")
END_FIELDS: Final = ("reason",)
#: Player models a `start` may name.
PLAYERS: Final = frozenset({"conceal", "rebuffer"})

#: Largest time the wire accepts: beyond 2**53 float milliseconds stop being exact.
MAX_TIME_MS: Final = float(2**53)
#: A `play_start_ms` of this says the player has not started and cannot tell when it will.
NOT_STARTED_MS: Final = MAX_TIME_MS
#: `audio_ms`: 0 < x ≤ this.
MAX_AUDIO_MS: Final = 600_000.0
#: `eta_ms`: 0 ≤ x ≤ this.
MAX_ETA_MS: Final = 3_600_000.0
#: `margin_ms`: 0 ≤ x ≤ this.
MAX_MARGIN_MS: Final = 60_000.0
#: `seq`: 0 ≤ x ≤ this.
MAX_SEQ: Final = 2**53
#: `reason`: at most this many characters.
MAX_REASON: Final = 64

#: edgemon's default `[limits]`: a batch within both is never refused for its size.
MAX_BATCH_EVENTS: Final = 1_000
MAX_PAYLOAD_BYTES: Final = 262_144
MAX_STREAMS_PER_DEVICE: Final = 256

#: The capacity object's power is bounded (docs/protocol.md, "Capacity object"). Its publisher
#: publishes it again at least every `CAPACITY_REFRESH_S` while it runs; a reader ignores an
#: object older than `CAPACITY_MAX_AGE_MS` (three refreshes), by its `t_ms` and by when the
#: reader received it (`capacity_age_ms`), so one left behind by a dead engine, or stamped in
#: the past, says nothing.
CAPACITY_REFRESH_S: Final = 5.0
CAPACITY_MAX_AGE_MS: Final = 15_000.0
#: `start_wait_ms` is read as at most this (10 minutes); the `Retry-After` of a refusal is at
#: most `RETRY_AFTER_MAX_SLOS` start SLOs.
MAX_START_WAIT_MS: Final = 600_000.0
RETRY_AFTER_MAX_SLOS: Final = 4
#: Sequences an engine runs at once, as far as a reader counts them when the engine object
#: (`max_num_seqs`) does not say.
DEFAULT_MAX_SEQS: Final = 1024
#: `shed_total` moves a reader's count by plausible steps only: at most `SHED_BURST` at once,
#: refilled at `SHED_RATE_PER_S` (refusals a second); what lies beyond is not counted.
SHED_BURST: Final = 5_000
SHED_RATE_PER_S: Final = 1_000.0


def valid_device_id(device: object) -> bool:
    """Whether `device` can name a device: the pattern, and not the reserved `_edgemon`."""
    return (
        isinstance(device, str)
        and DEVICE_ID.fullmatch(device) is not None
        and device != RESERVED_DEVICE
    )


def check_device(device: str) -> str:
    """A device id as a topic level: `[A-Za-z0-9._-]{1,64}`, not the reserved `_edgemon`."""
    if device == RESERVED_DEVICE:
        raise ValueError(f"device {device!r} is reserved: it names edgemon's own topics")
    if not valid_device_id(device):
        raise ValueError(f"device {device!r} must match {DEVICE_ID_PATTERN}")
    return device


def check_devices(devices: str) -> tuple[str, ...]:
    """`+` (every device), one device id, or a comma-separated list of them: `("+",)` or the
    ids, sorted, without repeats (blanks around a comma are ignored)."""
    if not isinstance(devices, str):
        raise ValueError(f"device {devices!r} must be an id, a comma-separated list or '+'")  # noqa: TRY004
    if devices.strip() == "+":
        return ("+",)
    ids = [part.strip() for part in devices.split(",")]
    for part in ids:
        if part == "+":
            raise ValueError(f"device {devices!r}: '+' stands alone, not in a list")
        check_device(part)
    return tuple(sorted(set(ids)))


def valid_stream_id(stream: object) -> bool:
    """Whether `stream` can name a stream."""
    return isinstance(stream, str) and STREAM_ID.fullmatch(stream) is not None


def topic_prefix_problem(prefix: object) -> str | None:
    """What keeps `prefix` from being the topic prefix `P`, or None: it is topic levels
    separated by '/', none empty, with no wildcard, and does not start with '$' (reserved by
    brokers)."""
    if not isinstance(prefix, str) or not prefix or "" in prefix.split("/"):
        return "must be MQTT topic levels separated by '/', none of them empty"
    if "+" in prefix or "#" in prefix or "\x00" in prefix:
        return "must not contain the wildcards '+' or '#'"
    if prefix.startswith("$"):
        return "must not start with '$' (reserved by brokers)"
    return None


def capacity_age_ms(now_ms: float, received_ms: float, t_ms: float | None) -> float:
    """A capacity object's age at `now_ms` for a reader that received it at `received_ms`:
    the longer of the time since then and the time since its own `t_ms` (when it has one).
    A reader ignores it once this exceeds `CAPACITY_MAX_AGE_MS`."""
    age = now_ms - received_ms
    return age if t_ms is None else max(age, now_ms - t_ms)


def check_topic_prefix(prefix: str) -> str:
    """`prefix` if it can be the topic prefix `P` (`topic_prefix_problem`), else ValueError."""
    problem = topic_prefix_problem(prefix)
    if problem is not None:
        raise ValueError(f"topic prefix {prefix!r} {problem}")
    return prefix
