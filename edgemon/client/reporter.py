"""`Reporter`: a player tells edgemon when each audio chunk arrived (docs/protocol.md).

The calls (`start`, `chunk`, `end`) check their arguments, stamp `t_ms` from the clock and
append the event to a bounded buffer under a short lock: they never wait for the network, so
they are safe on an audio thread and inside asyncio coroutines. A flusher thread takes what
was reported within `flush_ms` of the oldest waiting event and publishes it as one JSON array
(QoS 1) on `P/{device}/events`, split to stay within edgemon's default `max_batch_events` and
`max_payload_bytes`. paho's own network thread sends it and receives the PUBACKs.

- **Merging.** Chunks of one stream reported within one flush window of each other become one
  event: a transport that splits one server chunk into several reads (`read1()`) still shows
  edgemon one arrival. The audio is summed and `t_ms` is the last piece's arrival, so the
  merged audio never counts before all of it was there (slack is never overstated).
- **Mistakes.** A bad argument raises `ValueError` at the call. A call the stream's state makes
  moot (an `end()` twice, of an unknown stream, a chunk after the end or after `close()`, one
  stream more than `max_streams`) raises nothing into the player: it is counted
  (`stats.conflicts`) and logged, the first of each kind as a WARNING.
- **Offline** (or while `max_in_flight` messages wait for their PUBACK) events stay in the
  buffer. When it holds `max_buffered_events`, the **oldest chunk** is dropped and counted
  (`stats.dropped`); starts and ends stay (a buffer of nothing else drops its oldest). Later
  chunks carry the stream's `audio_total_ms`, so edgemon resynchronises on them. Messages
  already handed to paho when the connection drops are resent on reconnect.
- **Sessions.** A clean session with a unique client id by default, so two Reporters never
  take each other's session; `client_id=` and `persistent_session=True` for a fixed one.
- **Lifecycle.** A call on a Reporter never opened opens it. An unreachable broker is logged
  once as a WARNING (again only after a connection succeeded); `wait_connected(timeout)`
  checks. At interpreter exit an open Reporter flushes for up to `exit_flush_s`, so a player
  that exits right after `end()` loses nothing.

The shape is OpenTelemetry's BatchSpanProcessor: bounded queue, schedule delay, batch size,
drops counted rather than blocking, `flush()` (force_flush), `close()` (shutdown) and an
atexit flush.
"""

from __future__ import annotations

import atexit
import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Self

import paho.mqtt.client as mqtt

from edgemon.broker_url import parse_broker_url
from edgemon.client import _mqtt
from edgemon.client._events import Conflict, Event, Streams, check_format, check_t_ms
from edgemon.protocol import (
    MAX_BATCH_EVENTS,
    MAX_PAYLOAD_BYTES,
    MAX_STREAMS_PER_DEVICE,
    check_topic_prefix,
)

if TYPE_CHECKING:
    import os
    from collections.abc import Callable, Mapping
    from types import TracebackType

    from edgemon.client.audio import AudioFormat

__all__ = ["MAX_BATCH_EVENTS", "MAX_PAYLOAD_BYTES", "Reporter", "ReporterStats"]

_RETRY_S = 0.1
#: Built once: `json.dumps` with arguments builds an encoder per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
_SENT = frozenset({mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN})  # NO_CONN: paho resends


@dataclass(frozen=True, slots=True)
class ReporterStats:
    """Counts since the Reporter was made (a snapshot)."""

    #: Events reported (accepted by `start`/`chunk`/`end`; merged chunks count once).
    events: int
    #: Events the broker acknowledged (PUBACK).
    sent: int
    #: Batch messages the broker acknowledged.
    messages: int
    #: Events dropped, oldest chunk first, because the buffer held `max_buffered_events`.
    dropped: int
    #: Events waiting in the buffer now.
    buffered: int
    #: Events published and waiting for their PUBACK now.
    in_flight: int
    #: Whether the MQTT connection is up now.
    connected: bool
    #: Connections made (the first one included).
    connects: int
    #: `chunk()` calls merged into the stream's previous chunk event (same flush window).
    merged: int = 0
    #: Calls that the stream's state made moot, by kind (`ended`, `unknown`, `live`,
    #: `max_streams`, `closed`): nothing was queued for them.
    conflicts: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


class Reporter:
    """Reports a device's streams to edgemon; see the module docstring."""

    __slots__ = (
        "_at_exit",
        "_broker",
        "_clean_session",
        "_client",
        "_client_id",
        "_clock",
        "_closed",
        "_cond",
        "_conflicts",
        "_connected",
        "_connects",
        "_dropped",
        "_early_acks",
        "_events",
        "_exit_flush_s",
        "_first_at",
        "_flush_s",
        "_flusher",
        "_in_flight",
        "_in_hand",
        "_max_batch_events",
        "_max_buffered",
        "_max_in_flight",
        "_max_payload_bytes",
        "_merge",
        "_merged",
        "_messages",
        "_next_idx",
        "_open_chunks",
        "_pending",
        "_sent",
        "_stop",
        "_streams",
        "_topic",
        "_unreachable",
        "_urgent",
        "device",
    )

    def __init__(  # noqa: PLR0913 - the contract's keywords plus the limits
        self,
        broker_url: str,
        device: str,
        *,
        flush_ms: float = 5.0,
        audio_format: AudioFormat | str | None = None,
        topic_prefix: str = "edgemon/v1",
        client_id: str | None = None,
        max_buffered_events: int = 10_000,
        clock: Callable[[], float] | None = None,
        username: str | None = None,
        password: str | None = None,
        password_file: str | os.PathLike[str] | None = None,
        ca_file: str | os.PathLike[str] | None = None,
        cert_file: str | os.PathLike[str] | None = None,
        key_file: str | os.PathLike[str] | None = None,
        max_batch_events: int = MAX_BATCH_EVENTS,
        max_payload_bytes: int = MAX_PAYLOAD_BYTES,
        max_in_flight: int = 16,
        max_streams: int = MAX_STREAMS_PER_DEVICE,
        persistent_session: bool = False,
        merge_chunks: bool = True,
        exit_flush_s: float = 2.0,
    ) -> None:
        self.device = _mqtt.check_device(device)
        self._topic = f"{check_topic_prefix(topic_prefix)}/{device}/events"
        self._broker = parse_broker_url(
            broker_url,
            username=username,
            password=password,
            password_file=password_file,
            ca_file=ca_file,
            cert_file=cert_file,
            key_file=key_file,
        )
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
        if isinstance(exit_flush_s, bool) or not 0 <= exit_flush_s <= 60:
            raise ValueError(f"exit_flush_s must be 0 ≤ x ≤ 60, not {exit_flush_s!r}")
        self._flush_s = flush_ms / 1000
        self._exit_flush_s = float(exit_flush_s)
        self._client_id = client_id or _mqtt.default_client_id("reporter", device)
        self._clean_session = not persistent_session
        self._clock = clock or _epoch_ms
        self._max_buffered = max_buffered_events
        self._max_batch_events = max_batch_events
        self._max_payload_bytes = max_payload_bytes
        self._max_in_flight = max_in_flight
        self._merge = bool(merge_chunks)
        self._streams = Streams(max_streams=max_streams, audio_format=check_format(audio_format))
        self._unreachable = _mqtt.Unreachable(f"edgemon reporter {device}", self._broker)
        self._cond = threading.Condition(threading.Lock())
        self._pending: deque[tuple[int, Event]] = deque()  # (index, event), oldest first
        # A stream's last chunk event while it waits in `_pending` and may take more pieces:
        # stream -> (monotonic time of its first piece, the event).
        self._open_chunks: dict[str, tuple[float, Event]] = {}
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
        self._merged = 0
        self._conflicts: dict[str, int] = {}
        self._client: mqtt.Client | None = None
        self._flusher: threading.Thread | None = None
        self._at_exit: Callable[[], None] | None = None

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> Self:
        """Start the network and flusher threads (never waits for the broker); idempotent.

        Optional: the first `start`/`chunk`/`end` opens a Reporter that was not opened."""
        with self._cond:
            if self._closed:
                raise RuntimeError("this Reporter is closed")
            self._open_locked()
        return self

    def _open_locked(self) -> None:
        """Open (under the lock): the threads start at once, the connection in the background."""
        if self._client is not None:
            return
        client = _mqtt.new_client(
            self._broker, client_id=self._client_id, clean_session=self._clean_session
        )
        client.max_inflight_messages_set(0)  # bounded here: max_in_flight messages
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        self._client = client
        self._flusher = threading.Thread(
            target=self._run, name=f"edgemon-reporter-{self.device}", daemon=True
        )
        self._at_exit = self._exit_flush
        atexit.register(self._at_exit)
        _mqtt.start(client, self._broker)
        self._flusher.start()

    def _exit_flush(self) -> None:
        """At interpreter exit: send what is waiting (up to `exit_flush_s`), then disconnect."""
        if self._exit_flush_s > 0 and not self.flush(self._exit_flush_s):
            _mqtt.log.warning(
                "edgemon reporter %s: exiting with %d events not acknowledged by the broker",
                self.device,
                self._next_idx - self._oldest_unsettled_now(),
            )
        self.close(0.5)

    def wait_connected(self, timeout: float) -> bool:
        """Wait until connected to the broker (opening the Reporter if needed); False if
        `timeout` s pass first."""
        with self._cond:
            if not self._closed:
                self._open_locked()
            return self._cond.wait_for(lambda: self._connected, timeout)

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
            at_exit, self._at_exit = self._at_exit, None
        if at_exit is not None:
            atexit.unregister(at_exit)
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
                merged=self._merged,
                conflicts=MappingProxyType(dict(self._conflicts)),
            )

    # ------------------------------------------------------------------ the calls
    def start(
        self,
        stream: str,
        *,
        play_start_ms: float | None = None,
        margin_ms: float | None = None,
        player: str | None = None,
        audio_format: AudioFormat | str | None = None,
    ) -> None:
        """A stream begins (optional: the first chunk starts it too). `audio_format`: the
        format of this stream's `pcm_bytes` (else the Reporter's)."""
        with self._cond:
            t_ms = check_t_ms(self._clock())
            try:
                self._usable()
                event = self._streams.start(
                    stream,
                    t_ms,
                    play_start_ms=play_start_ms,
                    margin_ms=margin_ms,
                    player=player,
                    audio_format=audio_format,
                )
            except Conflict as conflict:
                self._conflict(conflict)
                return
            self._open_chunks.pop(stream, None)
            self._enqueue(event)

    def chunk(
        self,
        stream: str,
        *,
        audio_ms: float | None = None,
        pcm_bytes: int | None = None,
        audio_format: AudioFormat | str | None = None,
        eta_ms: float | None = None,
        final: bool = False,
        play_start_ms: float | None = None,
    ) -> None:
        """A chunk of audio reached the player now: `audio_ms`, or `pcm_bytes` of the stream's
        audio format (`audio_format` here overrides it for this chunk; a partial frame is
        carried to the stream's next chunk). `eta_ms`: when the next chunk is expected, from
        now. `play_start_ms`: when the player starts (or started) playback, device clock; a
        player that sent `start` at the request and prebuffers says it with the first chunk."""
        with self._cond:
            t_ms = check_t_ms(self._clock())
            now = time.monotonic()
            into = None
            if self._merge:
                waiting = self._open_chunks.get(stream)
                if waiting is not None and now - waiting[0] <= self._flush_s:
                    into = waiting[1]
            try:
                self._usable()
                event = self._streams.chunk(
                    stream,
                    t_ms,
                    audio_ms=audio_ms,
                    pcm_bytes=pcm_bytes,
                    audio_format=audio_format,
                    eta_ms=eta_ms,
                    final=final,
                    play_start_ms=play_start_ms,
                    into=into,
                )
            except Conflict as conflict:
                self._conflict(conflict)
                return
            if event is None:
                return
            if event is into:
                self._merged += 1
                if final:
                    self._open_chunks.pop(stream, None)
                return
            if final:
                self._open_chunks.pop(stream, None)
            elif self._merge:
                self._open_chunks[stream] = (now, event)
            self._enqueue(event)

    def end(self, stream: str, reason: str = "completed") -> None:
        """The stream ended (`completed`, `cancelled`, `error`, …; at most 64 characters).
        After a final chunk this sends nothing: the stream is complete already."""
        with self._cond:
            t_ms = check_t_ms(self._clock())
            try:
                self._usable()
                event = self._streams.end(stream, t_ms, reason)
            except Conflict as conflict:
                self._conflict(conflict)
                return
            self._open_chunks.pop(stream, None)
            if event is not None:
                self._enqueue(event)

    def _usable(self) -> None:
        """Refuse calls after `close()`; open a Reporter never opened (under the lock)."""
        if self._closed:
            raise Conflict("closed", "this Reporter is closed: nothing more is sent")
        if self._client is None:
            _mqtt.log.info(
                "edgemon reporter %s: opened by its first call (open() or `with` opens it "
                "before the first audio)",
                self.device,
            )
            self._open_locked()

    def _conflict(self, conflict: Conflict) -> None:
        """Count a moot call (under the lock); the first of its kind is a WARNING."""
        seen = self._conflicts.get(conflict.kind, 0)
        self._conflicts[conflict.kind] = seen + 1
        if seen == 0:
            _mqtt.log.warning(
                "edgemon reporter %s: %s (ignored; counted in stats.conflicts[%r], "
                "not logged again)",
                self.device,
                conflict,
                conflict.kind,
            )

    def _enqueue(self, event: Event) -> None:
        """Append under the lock; the oldest chunk goes when the buffer is full."""
        pending = self._pending
        if not pending:
            self._first_at = time.monotonic()
            self._cond.notify_all()
        elif len(pending) >= self._max_buffered:
            self._drop_oldest()
        pending.append((self._next_idx, event))
        self._next_idx += 1
        self._events += 1
        if len(pending) == self._max_batch_events:
            self._cond.notify_all()

    def _drop_oldest(self) -> None:
        """Drop the oldest waiting chunk (the oldest event when none is a chunk)."""
        pending = self._pending
        position = next((i for i, (_, e) in enumerate(pending) if e["type"] == "chunk"), 0)
        _, event = pending[position]
        del pending[position]
        self._dropped += 1
        waiting = self._open_chunks.get(event["stream"])
        if waiting is not None and waiting[1] is event:
            del self._open_chunks[event["stream"]]

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

    def _oldest_unsettled_now(self) -> int:
        with self._cond:
            return self._oldest_unsettled()

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
            self._open_chunks.clear()  # taken events are final: no piece merges into them
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
            self._drop_oldest()
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
            self._unreachable.failed(f"the broker refused the connection: {reason_code}")
            return
        self._unreachable.connected()
        _mqtt.log.info("edgemon reporter %s: connected to the broker", self.device)
        with self._cond:
            self._connected = True
            self._connects += 1
            self._cond.notify_all()

    def _on_connect_fail(self, _client: mqtt.Client, _userdata: Any) -> None:
        self._unreachable.failed("no connection")

    def _on_disconnect(
        self,
        _client: mqtt.Client,
        _userdata: Any,
        _flags: Any,
        reason_code: Any,
        _properties: Any,
    ) -> None:
        with self._cond:
            was_connected, self._connected = self._connected, False
            closing = self._stop
            self._cond.notify_all()
        if was_connected and not closing:  # a refused attempt was said by `_unreachable`
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
