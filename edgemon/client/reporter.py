"""`Reporter`: a player tells edgemon when each audio chunk arrived (SPEC §1, §9).

The calls (`start`, `chunk`, `end`) check their arguments, stamp `t_ms` from the clock and
append the event to a bounded buffer under a short lock: they never wait for the network, so
they are safe on an audio thread and inside asyncio coroutines. A flusher thread takes what
was reported within `flush_ms` of the oldest waiting event and publishes it as one JSON array
(QoS 1) on `P/{device}/events`, split to stay within edgemon's default `max_batch_events` and
`max_payload_bytes`. paho's own network thread sends it and receives the PUBACKs.

Offline (or while `max_in_flight` messages wait for their PUBACK) events stay in the buffer.
When it holds `max_buffered_events`, the **oldest** event is dropped and counted
(`stats.dropped`): the newest events carry the stream's `audio_total_ms`, so edgemon
resynchronises on them (a `seq` gap is applied with the total), and an `end` stays delivered.
Messages already handed to paho when the connection drops are resent on reconnect; the
session is persistent (fixed client id, clean_session False), as the daemon's is.

The shape is OpenTelemetry's BatchSpanProcessor: bounded queue, schedule delay, batch size,
drops counted rather than blocking, `flush()` (force_flush) and `close()` (shutdown).
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

import paho.mqtt.client as mqtt

from edgemon.client import _mqtt
from edgemon.client._events import Event, Streams, check_t_ms
from edgemon.client.audio import AudioFormat

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType

#: edgemon's default `[limits]` (edgemon/settings): a batch stays within both.
MAX_BATCH_EVENTS = 1_000
MAX_PAYLOAD_BYTES = 262_144
_RETRY_S = 0.1
#: Built once: `json.dumps` with arguments builds an encoder per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
_SENT = frozenset({mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN})  # NO_CONN: paho resends


@dataclass(frozen=True, slots=True)
class ReporterStats:
    """Counts since the Reporter was made (a snapshot)."""

    #: Events reported (accepted by `start`/`chunk`/`end`).
    events: int
    #: Events the broker acknowledged (PUBACK).
    sent: int
    #: Batch messages the broker acknowledged.
    messages: int
    #: Events dropped, oldest first, because the buffer held `max_buffered_events`.
    dropped: int
    #: Events waiting in the buffer now.
    buffered: int
    #: Events published and waiting for their PUBACK now.
    in_flight: int
    #: Whether the MQTT connection is up now.
    connected: bool
    #: Connections made (the first one included).
    connects: int


class Reporter:
    """Reports a device's streams to edgemon; see the module docstring."""

    __slots__ = (
        "_broker",
        "_clean_session",
        "_client",
        "_client_id",
        "_clock",
        "_closed",
        "_cond",
        "_connected",
        "_connects",
        "_dropped",
        "_early_acks",
        "_events",
        "_first_at",
        "_flush_s",
        "_flusher",
        "_in_flight",
        "_in_hand",
        "_max_batch_events",
        "_max_buffered",
        "_max_in_flight",
        "_max_payload_bytes",
        "_messages",
        "_next_idx",
        "_pending",
        "_sent",
        "_stop",
        "_streams",
        "_topic",
        "_urgent",
        "device",
    )

    def __init__(  # noqa: PLR0913 - the contract's keywords plus the limits
        self,
        broker_url: str,
        device: str,
        *,
        flush_ms: float = 5.0,
        topic_prefix: str = "edgemon/v1",
        client_id: str | None = None,
        max_buffered_events: int = 10_000,
        clock: Callable[[], float] | None = None,
        username: str | None = None,
        password: str | None = None,
        max_batch_events: int = MAX_BATCH_EVENTS,
        max_payload_bytes: int = MAX_PAYLOAD_BYTES,
        max_in_flight: int = 16,
        max_streams: int = 256,
        persistent_session: bool = True,
    ) -> None:
        self.device = _mqtt.check_device(device)
        self._topic = f"{_mqtt.check_topic_prefix(topic_prefix)}/{device}/events"
        self._broker = _mqtt.parse_broker_url(broker_url, username=username, password=password)
        for name, value in (
            ("max_buffered_events", max_buffered_events),
            ("max_batch_events", max_batch_events),
            ("max_in_flight", max_in_flight),
            ("max_streams", max_streams),
        ):
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be an integer ≥ 1, not {value!r}")
        if type(max_payload_bytes) is not int or max_payload_bytes < 1024:
            raise ValueError(
                f"max_payload_bytes must be an integer ≥ 1024, not {max_payload_bytes!r}"
            )
        if isinstance(flush_ms, bool) or not 0 <= flush_ms <= 60_000:
            raise ValueError(f"flush_ms must be 0 ≤ x ≤ 60000, not {flush_ms!r}")
        self._flush_s = flush_ms / 1000
        self._client_id = client_id or _mqtt.default_client_id("reporter", device, unique=False)
        self._clean_session = not persistent_session
        self._clock = clock or _epoch_ms
        self._max_buffered = max_buffered_events
        self._max_batch_events = max_batch_events
        self._max_payload_bytes = max_payload_bytes
        self._max_in_flight = max_in_flight
        self._streams = Streams(max_streams=max_streams)
        self._cond = threading.Condition(threading.Lock())
        self._pending: deque[tuple[int, Event]] = deque()  # (index, event), oldest first
        self._next_idx = 0  # index of the next event reported
        self._first_at = 0.0  # monotonic time the oldest waiting event was reported
        self._in_flight: dict[int, tuple[int, int]] = {}  # mid -> (first index, events)
        self._in_hand: int | None = None  # first index of events taken, not yet published
        self._early_acks: set[int] = set()  # PUBACKs that beat publish() returning the mid
        self._urgent = 0  # flush() calls waiting: no coalescing delay meanwhile
        self._connected = False
        self._stop = False
        self._closed = False
        self._events = self._sent = self._messages = self._dropped = self._connects = 0
        self._client: mqtt.Client | None = None
        self._flusher: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> Self:
        """Start the network and flusher threads (never waits for the broker); idempotent."""
        with self._cond:
            if self._closed:
                raise RuntimeError("this Reporter is closed")
            if self._client is not None:
                return self
            client = _mqtt.new_client(
                self._broker, client_id=self._client_id, clean_session=self._clean_session
            )
            client.max_inflight_messages_set(0)  # bounded here: max_in_flight messages
            client.on_connect = self._on_connect
            client.on_disconnect = self._on_disconnect
            client.on_publish = self._on_publish
            self._client = client
            self._flusher = threading.Thread(
                target=self._run, name=f"edgemon-reporter-{self.device}", daemon=True
            )
        _mqtt.start(client, self._broker)
        self._flusher.start()
        return self

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every event reported before the call is acknowledged by the broker
        (or was dropped, see `stats.dropped`); False if `timeout` seconds pass first.

        Blocks: from asyncio, call it as `await asyncio.to_thread(reporter.flush, 5)`.
        """
        with self._cond:
            target = self._next_idx
            if self._client is None:  # not opened: nothing can be sent
                return self._oldest_unsettled() >= target
            self._urgent += 1
            self._cond.notify_all()
            try:
                return self._cond.wait_for(lambda: self._oldest_unsettled() >= target, timeout)
            finally:
                self._urgent -= 1

    def close(self, timeout: float = 5.0) -> None:
        """Flush (for up to `timeout` s), then disconnect; idempotent. What could not be sent
        stays counted in `stats.buffered` / `stats.in_flight`."""
        deadline = time.monotonic() + timeout
        with self._cond:
            if self._closed:
                return
            self._closed = True
        if self._client is not None:
            self.flush(timeout)  # the flusher and paho get what is left of the timeout
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._flusher is not None:
            self._flusher.join(max(0.0, deadline - time.monotonic()))
        if self._client is not None:
            _mqtt.stop(self._client, deadline - time.monotonic())

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def stats(self) -> ReporterStats:
        """Counts now."""
        with self._cond:
            return ReporterStats(
                events=self._events,
                sent=self._sent,
                messages=self._messages,
                dropped=self._dropped,
                buffered=len(self._pending),
                in_flight=sum(count for _, count in self._in_flight.values()),
                connected=self._connected,
                connects=self._connects,
            )

    # ------------------------------------------------------------------ the calls
    def start(
        self,
        stream: str,
        *,
        play_start_ms: float | None = None,
        margin_ms: float | None = None,
        player: str | None = None,
    ) -> None:
        """A stream begins (optional: the first chunk starts it too)."""
        with self._cond:
            self._check_open()
            t_ms = check_t_ms(self._clock())
            event = self._streams.start(
                stream, t_ms, play_start_ms=play_start_ms, margin_ms=margin_ms, player=player
            )
            self._enqueue(event)

    def chunk(
        self,
        stream: str,
        *,
        audio_ms: float | None = None,
        pcm_bytes: int | None = None,
        audio_format: AudioFormat | str = AudioFormat.PCM_S16LE_24K_MONO,
        eta_ms: float | None = None,
        final: bool = False,
        play_start_ms: float | None = None,
    ) -> None:
        """A chunk of audio reached the player now: `audio_ms`, or `pcm_bytes` of
        `audio_format` (a partial frame is carried to the stream's next chunk).
        `play_start_ms`: when the player starts (or started) playback, device clock; a player
        that sent `start` at the request and prebuffers says it with the first chunk."""
        with self._cond:
            self._check_open()
            t_ms = check_t_ms(self._clock())
            event = self._streams.chunk(
                stream,
                t_ms,
                audio_ms=audio_ms,
                pcm_bytes=pcm_bytes,
                audio_format=audio_format,
                eta_ms=eta_ms,
                final=final,
                play_start_ms=play_start_ms,
            )
            if event is not None:
                self._enqueue(event)

    def end(self, stream: str, reason: str = "completed") -> None:
        """The stream ended (`completed`, `cancelled`, `error`, …; at most 64 characters).
        After a final chunk this sends nothing: the stream is complete already."""
        with self._cond:
            self._check_open()
            t_ms = check_t_ms(self._clock())
            event = self._streams.end(stream, t_ms, reason)
            if event is not None:
                self._enqueue(event)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this Reporter is closed")

    def _enqueue(self, event: Event) -> None:
        """Append under the lock; the oldest event goes when the buffer is full."""
        pending = self._pending
        if not pending:
            self._first_at = time.monotonic()
            self._cond.notify_all()
        elif len(pending) >= self._max_buffered:
            pending.popleft()
            self._dropped += 1
        pending.append((self._next_idx, event))
        self._next_idx += 1
        self._events += 1
        if len(pending) == self._max_batch_events:
            self._cond.notify_all()

    # ------------------------------------------------------------------ the flusher
    def _oldest_unsettled(self) -> int:
        """Index of the oldest event neither acknowledged nor dropped (under the lock)."""
        oldest = self._next_idx
        if self._pending:
            oldest = self._pending[0][0]
        if self._in_hand is not None and self._in_hand < oldest:
            oldest = self._in_hand
        for first, _ in self._in_flight.values():
            if first < oldest:
                oldest = first
        return oldest

    def _take(self) -> list[tuple[int, Event]] | None:
        """Wait (under the lock) until a batch is due, and take it; None when stopping."""
        cond = self._cond
        while not self._stop:
            ready = self._pending and self._connected and len(self._in_flight) < self._max_in_flight
            if not ready:
                cond.wait()
                continue
            due = self._first_at + self._flush_s - time.monotonic()
            if due > 0 and not self._urgent and len(self._pending) < self._max_batch_events:
                cond.wait(due)
                continue
            pending = self._pending
            taken = [pending.popleft() for _ in range(min(len(pending), self._max_batch_events))]
            self._in_hand = taken[0][0]
            if pending:
                self._first_at = time.monotonic() - self._flush_s  # the rest is due already
            return taken
        return None

    def _run(self) -> None:
        client = self._client
        assert client is not None
        while True:
            with self._cond:
                taken = self._take()
            if taken is None:
                return
            payloads = self._encode(taken)
            for number, (first, count, payload) in enumerate(payloads, 1):
                try:
                    info = client.publish(self._topic, payload, qos=1)
                    rc, mid = info.rc, info.mid
                except Exception:  # noqa: BLE001 - the flusher must outlive any library surprise
                    _mqtt.log.exception("edgemon reporter: publish raised")
                    rc, mid = mqtt.MQTT_ERR_UNKNOWN, 0
                with self._cond:
                    if rc not in _SENT:  # not expected (queue and size are bounded): retry
                        _mqtt.log.warning("edgemon reporter: publish failed (%s); retrying", rc)
                        self._requeue(taken, first)
                        self._cond.wait(_RETRY_S)
                        break
                    self._register(mid, first, count)
                    self._in_hand = payloads[number][0] if number < len(payloads) else None
                    self._cond.notify_all()

    def _encode(self, taken: list[tuple[int, Event]]) -> list[tuple[int, int, bytes]]:
        """JSON arrays of `taken`, each within `max_payload_bytes`: (first index, count, bytes)."""
        out: list[tuple[int, int, bytes]] = []
        parts: list[str] = []
        first = taken[0][0]
        size = 2
        for idx, event in taken:
            text = _ENCODER.encode(event)
            if parts and size + len(text) + 1 > self._max_payload_bytes:
                out.append((first, len(parts), f"[{','.join(parts)}]".encode()))
                parts, first, size = [], idx, 2
            parts.append(text)
            size += len(text) + (1 if len(parts) > 1 else 0)
        out.append((first, len(parts), f"[{','.join(parts)}]".encode()))
        return out

    def _register(self, mid: int, first: int, count: int) -> None:
        if mid in self._early_acks:
            self._early_acks.discard(mid)
            self._settle(count)
        else:
            self._in_flight[mid] = (first, count)

    def _requeue(self, taken: list[tuple[int, Event]], first: int) -> None:
        """Put back the events from index `first` on, ahead of newer ones (bound kept)."""
        back = [item for item in taken if item[0] >= first]
        self._in_hand = None
        self._pending.extendleft(reversed(back))
        while len(self._pending) > self._max_buffered:
            self._pending.popleft()
            self._dropped += 1
        self._first_at = time.monotonic() - self._flush_s

    def _settle(self, count: int) -> None:
        self._sent += count
        self._messages += 1

    # ------------------------------------------------------------------ paho callbacks
    def _on_connect(
        self,
        _client: mqtt.Client,
        _userdata: Any,
        _flags: Any,
        reason_code: Any,
        _properties: Any,
    ) -> None:
        if reason_code.is_failure:
            _mqtt.log.warning("edgemon reporter: broker refused the connection: %s", reason_code)
            return
        _mqtt.log.info("edgemon reporter %s: connected to the broker", self.device)
        with self._cond:
            self._connected = True
            self._connects += 1
            self._cond.notify_all()

    def _on_disconnect(
        self,
        _client: mqtt.Client,
        _userdata: Any,
        _flags: Any,
        reason_code: Any,
        _properties: Any,
    ) -> None:
        with self._cond:
            self._connected = False
            closing = self._stop
            self._cond.notify_all()
        if not closing:
            _mqtt.log.warning(
                "edgemon reporter %s: lost the broker (%s); buffering events until it is back",
                self.device,
                reason_code,
            )

    def _on_publish(
        self,
        _client: mqtt.Client,
        _userdata: Any,
        mid: int,
        _reason_code: Any,
        _properties: Any,
    ) -> None:
        with self._cond:
            entry = self._in_flight.pop(mid, None)
            if entry is None:
                self._early_acks.add(mid)
            else:
                self._settle(entry[1])
            self._cond.notify_all()


def _epoch_ms() -> float:
    return time.time() * 1000.0
