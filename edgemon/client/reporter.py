"""`Reporter`: a player tells edgemon when each audio chunk arrived (docs/protocol.md).

The calls (`start`, `chunk`, `end`) check their arguments, stamp `t_ms` from the clock and
append the event to a bounded buffer under a short lock: they never wait for the network, so
they are safe on an audio thread and inside asyncio coroutines. A flusher thread takes what
was reported within `flush_ms` of the oldest waiting event and publishes it as one JSON array
(QoS 1) on `P/{device}/events`, split to stay within edgemon's default `max_batch_events` and
`max_payload_bytes`. paho's own network thread sends it and receives the PUBACKs.

- **Streams are requests.** Name a stream by its request's id and send that id as the HTTP
  request's `X-Request-Id`: vLLM names its request after it, which is how an engine joins
  edgemon's slack feed (`P/{device}/slack`) to its requests.
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
import threading
import time
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Self

from edgemon.broker_url import parse_broker_url
from edgemon.client import _mqtt
from edgemon.client._events import Conflict, Event, Streams, check_format, check_t_ms
from edgemon.client._report_buffer import EventBuffer
from edgemon.client._report_flight import InFlight
from edgemon.client._report_sender import Sender
from edgemon.protocol import (
    MAX_BATCH_EVENTS,
    MAX_PAYLOAD_BYTES,
    MAX_STREAMS_PER_DEVICE,
    check_device,
    check_topic_prefix,
)

if TYPE_CHECKING:
    import os
    from collections.abc import Callable, Mapping
    from types import TracebackType

    from edgemon.client.audio import AudioFormat

__all__ = ["MAX_BATCH_EVENTS", "MAX_PAYLOAD_BYTES", "Reporter", "ReporterStats"]


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
    """Reports a device's streams to edgemon; see the module docstring.

    Its parts each own their state, under one lock: `Streams` (what each stream said, the
    checks), `EventBuffer` (events waiting, merging), `InFlight` (messages awaiting their
    PUBACK) and `Sender` (the paho client and the flusher thread)."""

    __slots__ = (
        "_at_exit",
        "_buffer",
        "_clock",
        "_closed",
        "_cond",
        "_conflicts",
        "_exit_flush_s",
        "_flight",
        "_sender",
        "_streams",
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
        self.device = check_device(device)
        topic = f"{check_topic_prefix(topic_prefix)}/{device}/events"
        broker = parse_broker_url(
            broker_url,
            username=username,
            password=password,
            password_file=password_file,
            ca_file=ca_file,
            cert_file=cert_file,
            key_file=key_file,
        )
        _check_bounds(
            max_buffered_events=max_buffered_events,
            max_batch_events=max_batch_events,
            max_in_flight=max_in_flight,
            max_streams=max_streams,
            max_payload_bytes=max_payload_bytes,
            flush_ms=flush_ms,
            exit_flush_s=exit_flush_s,
        )
        self._exit_flush_s = float(exit_flush_s)
        self._clock = clock or _epoch_ms
        self._streams = Streams(max_streams=max_streams, audio_format=check_format(audio_format))
        self._cond = threading.Condition(threading.Lock())
        self._buffer = EventBuffer(
            max_buffered=max_buffered_events,
            max_batch=max_batch_events,
            flush_s=flush_ms / 1000,
            merge=bool(merge_chunks),
        )
        self._flight = InFlight()
        self._sender = Sender(
            self._cond,
            self._buffer,
            self._flight,
            broker=broker,
            topic=topic,
            device=device,
            client_id=client_id or _mqtt.default_client_id("reporter", device),
            clean_session=not persistent_session,
            max_in_flight=max_in_flight,
            max_payload_bytes=max_payload_bytes,
        )
        self._closed = False
        self._conflicts: dict[str, int] = {}
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
        if self._sender.client is not None:
            return
        self._at_exit = self._exit_flush
        atexit.register(self._at_exit)
        self._sender.start()

    def _exit_flush(self) -> None:
        """At interpreter exit: send what is waiting (up to `exit_flush_s`), then disconnect."""
        if self._exit_flush_s > 0 and not self.flush(self._exit_flush_s):
            _mqtt.log.warning(
                "edgemon reporter %s: exiting with %d events not acknowledged by the broker",
                self.device,
                self._buffer.next_idx - self._oldest_unsettled_now(),
            )
        self.close(0.5)

    def wait_connected(self, timeout: float) -> bool:
        """Wait until connected to the broker (opening the Reporter if needed); False if
        `timeout` s pass first."""
        with self._cond:
            if not self._closed:
                self._open_locked()
            return self._cond.wait_for(lambda: self._sender.connected, timeout)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every event reported before the call is acknowledged by the broker
        (or was dropped, see `stats.dropped`); False if `timeout` seconds pass first.

        Blocks: from asyncio, call it as `await asyncio.to_thread(reporter.flush, 5)`.
        """
        with self._cond:
            target = self._buffer.next_idx
            if self._sender.client is None:  # not opened: nothing can be sent
                return self._oldest_unsettled() >= target
            self._sender.urgent += 1
            self._cond.notify_all()
            try:
                return self._cond.wait_for(lambda: self._oldest_unsettled() >= target, timeout)
            finally:
                self._sender.urgent -= 1

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
        if self._sender.client is not None:
            self.flush(timeout)  # the flusher and paho get what is left of the timeout
        self._sender.stop(deadline)

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
            buffer, flight, sender = self._buffer, self._flight, self._sender
            return ReporterStats(
                events=buffer.events,
                sent=flight.sent,
                messages=flight.messages,
                dropped=buffer.dropped,
                buffered=len(buffer),
                in_flight=flight.events(),
                connected=sender.connected,
                connects=sender.connects,
                merged=buffer.merged,
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
            self._buffer.close_stream(stream)
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
            into = self._buffer.merge_into(stream, now)
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
                self._buffer.merged_piece(stream, final=final)
            elif self._buffer.add_chunk(stream, event, now, final=final):
                self._cond.notify_all()

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
            self._buffer.close_stream(stream)
            if event is not None:
                self._enqueue(event)

    def _usable(self) -> None:
        """Refuse calls after `close()`; open a Reporter never opened (under the lock)."""
        if self._closed:
            raise Conflict("closed", "this Reporter is closed: nothing more is sent")
        if self._sender.client is None:
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
        """Append under the lock (the oldest chunk goes when the buffer is full); wake the
        flusher when a batch may be due."""
        if self._buffer.add(event):
            self._cond.notify_all()

    def _oldest_unsettled(self) -> int:
        """Index of the oldest event neither acknowledged nor dropped (under the lock)."""
        waiting = self._buffer.oldest()
        return self._flight.oldest(self._buffer.next_idx if waiting is None else waiting)

    def _oldest_unsettled_now(self) -> int:
        with self._cond:
            return self._oldest_unsettled()


def _check_bounds(
    *, max_payload_bytes: int, flush_ms: float, exit_flush_s: float, **counts: int
) -> None:
    """ValueError naming the first keyword out of its range: each of `counts` an integer ≥ 1,
    `max_payload_bytes` ≥ 1024, `flush_ms` 0 to 60000, `exit_flush_s` 0 to 60."""
    for name, value in counts.items():
        if type(value) is not int or value < 1:
            raise ValueError(f"{name} must be an integer ≥ 1, not {value!r}")
    if type(max_payload_bytes) is not int or max_payload_bytes < 1024:
        raise ValueError(f"max_payload_bytes must be an integer ≥ 1024, not {max_payload_bytes!r}")
    if isinstance(flush_ms, bool) or not 0 <= flush_ms <= 60_000:
        raise ValueError(f"flush_ms must be 0 ≤ x ≤ 60000, not {flush_ms!r}")
    if isinstance(exit_flush_s, bool) or not 0 <= exit_flush_s <= 60:
        raise ValueError(f"exit_flush_s must be 0 ≤ x ≤ 60, not {exit_flush_s!r}")


def _epoch_ms() -> float:
    return time.time() * 1000.0
