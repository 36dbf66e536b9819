"""`SlackFeedReader` (engine side): edgemon's slack feed of one device, as an engine reads it.

edgemon publishes, per device, what its players measured (`P/{device}/slack`, QoS 0, the
"Slack feed object" of docs/protocol.md): per live stream, the audio its player holds ahead of
playback and when its playback starts. The reader keeps the device's latest object, each entry
placed on the reader's own clock at receipt (the transit on a box is a few milliseconds, and
no clock offset is needed), and ages it as the protocol says: a playing stream's lead falls one
millisecond per millisecond, one not yet playing keeps it until its play start. An object
replaces the last whole (a stream absent from it has ended); an object older than `max_age_ms`
is ignored, as is a payload that is not a feed object (counted in `rejected`).

`stream_of` joins vLLM's request ids to the feed's streams: the player sends its stream id as
the HTTP request's ``X-Request-Id``, and vLLM's OpenAI server names the engine request
``cmpl-{id}-{index}-{suffix}`` or ``chatcmpl-{id}-{suffix}``.

Standard library and paho-mqtt only; the network thread is paho's (`PahoLink`).
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

from edgemon.broker_url import parse_broker_url
from edgemon.client import _mqtt
from edgemon.protocol import check_device, check_topic_prefix

if TYPE_CHECKING:
    import os
    from collections.abc import Callable

    import paho.mqtt.client as mqtt

__all__ = ["FedStream", "SlackFeedReader", "read_feed", "stream_of"]

MAX_AGE_MS = 3_000.0
"""An object older than this is ignored: three of the daemon's one-second refreshes."""

_REQUEST_ID = re.compile(r"^(?:cmpl-(?P<cmpl>.+)-\d+|chatcmpl-(?P<chat>.+))-[A-Za-z0-9]{8}$")


def stream_of(request_id: str) -> str | None:
    """The stream id vLLM's OpenAI server took from ``X-Request-Id`` for `request_id`
    (``cmpl-{id}-{index}-{suffix}``, ``chatcmpl-{id}-{suffix}``); None for any other id."""
    match = _REQUEST_ID.match(request_id)
    if match is None:
        return None
    return match.group("cmpl") or match.group("chat")


@dataclass(frozen=True, slots=True)
class FedStream:
    """One stream of the feed, placed on the reader's clock (seconds) at receipt."""

    stream: str
    slack_ms: float
    """The audio its player held ahead of playback when the object was made."""
    received_s: float
    """When the reader received the object."""
    start_in_ms: float | None
    """Its play start, in ms after the object's instant (negative: it started before);
    None: not started, and the player has not said when."""

    def playing(self, now_s: float) -> bool:
        """Its playback has started by `now_s`."""
        start = self.start_in_ms
        return start is not None and start <= (now_s - self.received_s) * 1000.0

    def lead_ms(self, now_s: float) -> float:
        """The audio its player holds at `now_s`, nothing arriving meanwhile."""
        elapsed = max(0.0, (now_s - self.received_s) * 1000.0)
        start = self.start_in_ms
        if start is None:
            return self.slack_ms
        return self.slack_ms - max(0.0, elapsed - max(0.0, start))


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"not a finite number: {value!r}")
    return float(value)


def read_feed(payload: bytes, received_s: float) -> dict[str, FedStream]:
    """The streams of one slack feed object received at `received_s` (ValueError if it is
    not one)."""
    try:
        obj = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("streams"), list):
        raise ValueError("not a slack feed object")  # noqa: TRY004 - bad input, one kind
    t_ms = _number(obj.get("t_ms"))
    out: dict[str, FedStream] = {}
    for entry in obj["streams"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("stream"), str):
            raise ValueError(f"not a feed entry: {entry!r}")  # noqa: TRY004 - as above
        start = entry.get("play_start_ms")
        start_in = None if start is None else _number(start) - t_ms
        out[entry["stream"]] = FedStream(
            entry["stream"], _number(entry.get("slack_ms")), received_s, start_in
        )
    return out


class SlackFeedReader:
    """The latest slack feed of `device`, read in the background; see the module doc.

    The connection's keywords are the `ThrottleGate`'s. `get(stream)` is safe from any
    thread. `open()` starts paho's network thread and never waits for the broker; `close()`
    ends it."""

    __slots__ = (
        "_clock",
        "_link",
        "_lock",
        "_streams",
        "_topic",
        "max_age_ms",
        "received",
        "rejected",
    )

    def __init__(  # noqa: PLR0913 - the device, then the connection's terms by keyword
        self,
        broker_url: str,
        device: str,
        *,
        topic_prefix: str = "edgemon/v1",
        max_age_ms: float = MAX_AGE_MS,
        client_id: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        username: str | None = None,
        password: str | None = None,
        password_file: str | os.PathLike[str] | None = None,
        ca_file: str | os.PathLike[str] | None = None,
        cert_file: str | os.PathLike[str] | None = None,
        key_file: str | os.PathLike[str] | None = None,
    ) -> None:
        if not (math.isfinite(max_age_ms) and max_age_ms > 0):
            raise ValueError(f"max_age_ms must be a number > 0, not {max_age_ms!r}")
        broker = parse_broker_url(
            broker_url,
            username=username,
            password=password,
            password_file=password_file,
            ca_file=ca_file,
            cert_file=cert_file,
            key_file=key_file,
        )
        device = check_device(device)
        self._topic = f"{check_topic_prefix(topic_prefix)}/{device}/slack"
        self.max_age_ms = max_age_ms
        self._clock = clock
        self._lock = threading.Lock()
        self._streams: dict[str, FedStream] = {}
        #: Feed objects read, and payloads that were none.
        self.received = 0
        self.rejected = 0
        self._link = _mqtt.PahoLink(
            broker,
            who=f"edgemon slack feed {device}",
            client_id=client_id or _mqtt.default_client_id("feed", device),
            on_up=self._up,
            on_down=lambda _reason: True,
            lost_means="; its streams age out until it is back",
        )

    def open(self) -> Self:
        """Start reading in the background."""
        self._link.open(self._configure)
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Stop reading (waits at most `timeout` s)."""
        self._link.close(timeout)

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _up(self, client: mqtt.Client) -> None:
        client.subscribe(self._topic, qos=0)

    def _configure(self, client: mqtt.Client) -> None:
        client.on_message = self._on_message

    def _on_message(self, _client: mqtt.Client, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        self.take(bytes(message.payload))

    def take(self, payload: bytes) -> bool:
        """One payload of the feed's topic, received now: whether it was a feed object."""
        try:
            streams = read_feed(payload, self._clock())
        except ValueError as exc:
            with self._lock:
                self.rejected += 1
                first = self.rejected == 1
            if first:
                _mqtt.log.warning("%s: not a slack feed object (%s)", self._topic, exc)
            return False
        with self._lock:
            self._streams = streams
            self.received += 1
        return True

    def now(self) -> float:
        """The reader's clock now (seconds): what `FedStream.lead_ms` and `playing` take."""
        return self._clock()

    def get(self, stream: str) -> FedStream | None:
        """`stream`'s entry in the latest object, or None (not in it, or it is too old)."""
        with self._lock:
            entry = self._streams.get(stream)
        if entry is None or (self._clock() - entry.received_s) * 1000.0 > self.max_age_ms:
            return None
        return entry
