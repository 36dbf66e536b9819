"""The monitor: topics and payloads in, engine outputs out — what the daemon and replay share.

It adds to the engine only what belongs to messages: topic routing, decoding, the count of
every message or event by `result` (docs/runbook.md `edgemon_messages_total{result}`), and the order
in which a message and the clock take turns (`Monitor.handle`, docs/semantics.md).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from edgemon.engine.engine import Engine
from edgemon.engine.outputs import GapDeclared, Rejected
from edgemon.engine.snapshot import SnapshotError
from edgemon.wire.decode import (
    Problem,
    decode_capacity,
    decode_engine,
    parse_json,
    parted_events,
)
from edgemon.wire.topics import Kind, Topics

if TYPE_CHECKING:
    from edgemon.engine.config import EngineConfig
    from edgemon.engine.events import Event
    from edgemon.engine.outputs import Output

#: Results that mean "applied" (a gap is applied, and counted as a gap). An emptied retained
#: topic is neither applied nor rejected: `deleted`.
APPLIED = frozenset({"accepted", "gap"})


class Monitor:
    """Routes messages to the engine and keeps the per-result counts."""

    __slots__ = ("_sample_every_ms", "engine", "events", "messages", "results", "topics")

    def __init__(self, config: EngineConfig, *, sample_every_ms: float | None = None) -> None:
        self.engine = Engine(config, sample_every_ms=sample_every_ms)
        self._sample_every_ms = sample_every_ms
        self.topics = Topics(config.topic_prefix, cached=3 * config.limits.max_devices + 64)
        self.results: Counter[str] = Counter()
        self.messages = 0
        #: Events applied (engine and capacity objects are messages, not events).
        self.events = 0

    def handle(
        self,
        topic: str,
        payload: bytes,
        recv_ms: float,
        out: list[Output],
        *,
        decide: bool = True,
    ) -> str | None:
        """Take one MQTT message received at wall time `recv_ms`, in the order of docs/semantics.md;
        the device whose events it applied, if it applied any (see `receive`).

        Every timer due strictly before `recv_ms` fires first (on every device: a device idle
        long enough is forgotten before its next message starts it afresh), then the message
        is applied, then the clock reaches `recv_ms`: the timers due at it and the throttle
        decision for this instant. The daemon, replay and the tests all feed messages here.

        `decide=False` leaves that last step to the next call: for a caller that knows more
        messages share the instant and must be applied before its timers and samples
        (replay, whose next message or final run-on reaches the instant after all of them).
        The daemon cannot know, so it decides at every message.
        """
        self.advance(recv_ms, out, inclusive=False)
        applied_to = self.receive(topic, payload, recv_ms, out)
        if decide:
            self.advance(recv_ms, out)
        return applied_to

    def receive(self, topic: str, payload: bytes, recv_ms: float, out: list[Output]) -> str | None:
        """Lower level than `handle`: route, decode and apply one message, and nothing else.

        No timer fires and no throttle decision is taken here: a caller driving the clock by
        hand (tests of an exact interleaving) pairs it with `advance`. Everything else uses
        `handle`. The device whose events it applied, if it applied any (none refused them
        all): what changed a device's streams.
        """
        self.messages += 1
        route = self.topics.parse(topic)
        if route is None:
            self._reject(
                recv_ms, topic, None, Problem("unknown_topic", "not an edgemon topic"), out
            )
            return None
        device, kind = route
        limits = self.engine.config.limits
        if kind != "events":
            self._receive_object(kind, device, topic, payload, recv_ms, out)
            return None
        if not payload:  # a retained message someone left on the topic, removed: no event
            self.results["deleted"] += 1
            return None
        decoded = parted_events(
            payload, max_bytes=limits.max_payload_bytes, max_batch=limits.max_batch_events
        )
        if isinstance(decoded, Problem):
            self._reject(recv_ms, topic, device, decoded, out)
            return None
        events, problems = decoded
        for problem in problems:
            self._reject(recv_ms, topic, device, problem, out)
        return self._apply_events(topic, device, events, recv_ms, out) if events else None

    def _apply_events(
        self, topic: str, device: str, events: list[Event], recv_ms: float, out: list[Output]
    ) -> str | None:
        """A message's decoded events given to the engine, each counted by its result;
        `device` if any was applied."""
        mark = len(out)
        results = self.engine.apply(device, events, recv_ms, out)
        self._count_gaps(out, mark)
        counts = self.results
        accepted = results.count("accepted")
        if accepted == len(results):  # the usual: every event accepted, counted at once
            counts["accepted"] += accepted
            self.events += accepted
            return device
        applied = 0
        for event, result in zip(events, results, strict=True):
            if result in APPLIED:
                applied += 1
                counts[result] += 1
            else:
                self._count(result, recv_ms, topic, device, out, event)
        self.events += applied
        return device if applied else None

    def _receive_object(
        self,
        kind: Kind,
        device: str,
        topic: str,
        payload: bytes,
        recv_ms: float,
        out: list[Output],
    ) -> None:
        """An engine or a capacity object: decoded, then given to the engine (or rejected); an
        empty payload removes the object."""
        if not payload:
            self._delete(kind, device, recv_ms, out)
            return
        max_bytes = self.engine.config.limits.max_payload_bytes
        if kind == "capacity":
            capacity = decode_capacity(payload, max_bytes=max_bytes)
            if isinstance(capacity, Problem):  # the device's last object is void too
                self.engine.void_capacity(device, recv_ms)
                self._reject(recv_ms, topic, device, capacity, out)
                return
            result = self.engine.apply_capacity(device, capacity, recv_ms)
            self._count(result, recv_ms, topic, device, out, what="capacity object")
            return
        value = parse_json(payload, max_bytes=max_bytes)
        info = value if isinstance(value, Problem) else decode_engine(value)
        if isinstance(info, Problem):
            self._reject(recv_ms, topic, device, info, out)
            return
        result = self.engine.apply_engine_info(device, info, recv_ms, out)
        self._count(result, recv_ms, topic, device, out)

    def _delete(self, kind: Kind, device: str, recv_ms: float, out: list[Output]) -> None:
        """An empty payload on an engine or capacity topic: the retained object removed
        (docs/protocol.md), counted `deleted`, never rejected. It no longer applies."""
        if kind == "capacity":
            self.engine.void_capacity(device, recv_ms)
        else:
            self.engine.forget_engine_info(device, recv_ms, out)
        self.results["deleted"] += 1

    def snapshot(self, wall_ms: float) -> dict[str, Any]:
        """Everything needed to continue after a restart: the engine and the counts."""
        return {
            "engine": self.engine.snapshot(wall_ms),
            "results": dict(self.results),
            "messages": self.messages,
            "events": self.events,
        }

    def restore(self, data: dict[str, Any], wall_ms: float) -> None:
        """Continue from `snapshot`'s output (SnapshotError if it cannot be used)."""
        try:
            engine = Engine.restore(
                data["engine"], self.engine.config, wall_ms, sample_every_ms=self._sample_every_ms
            )
            results = Counter({str(k): int(v) for k, v in data["results"].items()})
            messages, events = int(data["messages"]), int(data["events"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, SnapshotError):
                raise
            raise SnapshotError(f"snapshot is incomplete or malformed ({exc!r})") from None
        self.engine, self.results, self.messages, self.events = engine, results, messages, events

    def cut(self, since_ms: float, now_ms: float) -> None:
        """Take the wall-clock stretch from `since_ms` to `now_ms`, in which edgemon did not
        run (its process stopped, its VM paused), out of every device's timeline, as a restart
        takes out its downtime: each device's clock resumes at `now_ms` from where it stood at
        `since_ms`, so no timer fires for the stall itself, and the messages that queued up
        meanwhile bring the clock forward at their own `t_ms` as they are applied."""
        self.restore(self.snapshot(since_ms), now_ms)

    def advance(self, wall_ms: float, out: list[Output], *, inclusive: bool = True) -> None:
        """Let the clock reach wall time `wall_ms` with no message: fire every timer due by
        then (see `Engine.advance`). `handle` does this itself around each message."""
        mark = len(out)
        self.engine.advance(wall_ms, out, inclusive=inclusive)
        self._count_gaps(out, mark)

    def _count_gaps(self, out: list[Output], mark: int) -> None:
        """A gap declared once held chunks stopped waiting counts as `gap` (docs/semantics.md)."""
        for i in range(mark, len(out)):
            if type(out[i]) is GapDeclared:
                self.results["gap"] += 1

    def next_deadline(self) -> float | None:
        """When `advance` must next be called (wall ms), if ever."""
        return self.engine.next_deadline()

    def until_deadline(self, wall_ms: float) -> float | None:
        """Milliseconds from wall time `wall_ms` to the next deadline (None if none)."""
        deadline = self.engine.next_deadline()
        return None if deadline is None else deadline - wall_ms

    def _count(
        self,
        result: str,
        recv_ms: float,
        topic: str,
        device: str,
        out: list[Output],
        event: Event | None = None,
        *,
        what: str = "engine object",
    ) -> None:
        if result in APPLIED:
            self.results[result] += 1
            return
        if event is not None:
            what = f"{event.type} of stream {event.stream}"
        self._reject(recv_ms, topic, device, Problem(result, what), out)

    def _reject(
        self, recv_ms: float, topic: str, device: str | None, problem: Problem, out: list[Output]
    ) -> None:
        self.results[problem.reason] += 1
        out.append(Rejected(recv_ms, topic, device, problem.reason, problem.detail))
