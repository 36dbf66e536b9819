"""Hypothesis strategies for engine traces, kept in one place.

A scenario is an engine configuration plus integer-valued trace messages: per device a few
streams of ``start``/``chunk``/``end`` events with equal timestamps, ``eta_ms`` 0 or absent,
``final`` chunks, duplicates (a repeated ``seq``, also after the stream ended), gaps (skipped
``seq``, sometimes with ``audio_total_ms``) and, unless ``in_order``, delivery jitter, so that a
later message can carry a smaller ``t_ms``. The traces stay inside what ``tests/reference.py``
models (see its docstring), in particular: events of one stream are received in stream order,
and each device's first message has the device's smallest delivery lag.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hypothesis import strategies as st

from edgemon.engine.config import (
    ClockMode,
    DeviceOverride,
    EngineConfig,
    PlayerModel,
    SlackPolicy,
    SloPolicy,
)

if TYPE_CHECKING:
    from edgemon.trace import TraceRecord

    from reference import TraceEvent

PLAYERS: tuple[PlayerModel, ...] = ("conceal", "rebuffer")
REASONS = ("completed", "cancelled", "error")
DEVICE_NAMES = ("d0", "edge-1.a", "d_2")
MAX_JITTER_MS = 100
# Round values make exact ties (headroom equal to margin or margin + hysteresis) likely.
ROUND_AUDIO = st.sampled_from((50, 100, 200))
ROUND_MARGIN = st.sampled_from((0, 50, 80, 100))
ROUND_STEP = st.sampled_from((0, 50, 100))


def hysteresis() -> st.SearchStrategy[int]:
    """A hysteresis, often a round one."""
    return st.sampled_from((0, 20, 50)) | st.integers(0, 60)


def min_on() -> st.SearchStrategy[int]:
    """A minimum ON time, often a round one."""
    return st.sampled_from((0, 50, 100, 250)) | st.integers(0, 400)


@dataclass(frozen=True, slots=True)
class Message:
    """One MQTT message of a trace: a single event, or a batch (a JSON array)."""

    recv_ms: int
    device: str
    events: tuple[dict[str, Any], ...]
    batch: bool


@dataclass(frozen=True, slots=True)
class Scenario:
    """A configuration and the messages of one trace, in receipt order."""

    config: EngineConfig
    messages: tuple[Message, ...]
    sample_ms: int
    in_order: bool

    @property
    def events(self) -> list[TraceEvent]:
        """The trace as the reference takes it: one (recv_ms, device, event) per event."""
        return [(m.recv_ms, m.device, e) for m in self.messages for e in m.events]

    def records(self) -> list[TraceRecord]:
        """The trace as the engine's replay reads it."""
        from edgemon.trace import TraceRecord  # noqa: PLC0415 - the engine may not exist yet

        prefix = self.config.topic_prefix
        return [
            TraceRecord(
                recv_ms=float(m.recv_ms),
                topic=f"{prefix}/{m.device}/events",
                payload=json.dumps(list(m.events) if m.batch else m.events[0]).encode(),
            )
            for m in self.messages
        ]


@dataclass(frozen=True, slots=True)
class _Pending:
    """An event of one stream before delivery: when it happens, and its object."""

    happens: int
    body: dict[str, Any]


@st.composite
def _stream(
    draw: st.DrawFn,
    sid: str,
    player: PlayerModel,
    *,
    own_player: bool,
    in_order: bool,
    eta_always: bool,
    first_again: bool = True,
) -> list[_Pending]:
    """The events of one stream, in the order the device sends them.

    ``player`` is the stream's player unless its ``start`` names one (when ``own_player``).
    ``first_again``: the first chunk (seq 0) may be redelivered too.
    """
    out: list[_Pending] = []
    begin = draw(st.integers(0, 20)) * 50 + draw(st.sampled_from((0, 0, 7, 25)))
    has_start = draw(st.booleans())
    named_player = has_start and own_player and draw(st.integers(0, 3)) == 0
    if named_player:
        player = draw(st.sampled_from(PLAYERS))
    n_chunks = draw(st.integers(0 if has_start else 1, 12))
    first_t = begin + (draw(st.sampled_from((0, 0, 50, 120, 300))) if has_start else 0)
    play_start: int | None = None
    if draw(st.integers(0, 3)) == 0:
        low = 0 if player == "rebuffer" else -150  # rebuffer: player never starts before audio
        play_start = max(0, first_t + draw(st.integers(low, 300)))
    if has_start:
        start: dict[str, Any] = {"type": "start", "stream": sid, "t_ms": begin}
        if named_player:
            start["player"] = player
        if play_start is not None and draw(st.booleans()):
            start["play_start_ms"] = play_start
            play_start = None
        if draw(st.integers(0, 2)) == 0:
            start["margin_ms"] = draw(ROUND_MARGIN | st.integers(0, 200))
        out.append(_Pending(begin, start))
    t = first_t
    seq = 0
    true_total = 0
    sent: list[dict[str, Any]] = []
    for i in range(n_chunks):
        if i > 0:
            t = max(0, t + draw(ROUND_STEP | st.integers(0 if in_order else -50, 250)))
        gap = i > 0 and draw(st.integers(0, 5)) == 0
        if gap:
            skipped = draw(st.integers(1, 2))
            true_total += sum(draw(st.integers(1, 400)) for _ in range(skipped))
            seq += skipped
        audio = draw(ROUND_AUDIO | st.integers(1, 400))
        true_total += audio
        body: dict[str, Any] = {"type": "chunk", "stream": sid, "t_ms": t, "seq": seq}
        body["audio_ms"] = audio
        if eta_always or draw(st.booleans()):
            body["eta_ms"] = draw(st.sampled_from((0, 100, 200)) | st.integers(0, 500))
        if gap and draw(st.booleans()):
            body["audio_total_ms"] = true_total
        if i == 0 and play_start is not None:
            body["play_start_ms"] = play_start
        if i == n_chunks - 1 and draw(st.integers(0, 2)) == 0:
            body["final"] = True
        out.append(_Pending(t, body))
        sent.append(body)
        seq += 1
        again = [b for b in sent if b["seq"] > 0 or (first_again and not body.get("final"))]
        if again and draw(st.integers(0, 6)) == 0:  # a redelivery of something already sent
            dup = dict(draw(st.sampled_from(again)))
            out.append(_Pending(max(t, dup["t_ms"]), dup))
    terminal = out[-1].happens if out else begin
    ended = bool(sent) and sent[-1].get("final", False)
    if not ended and draw(st.booleans()):
        terminal += draw(st.integers(0, 400))
        out.append(_Pending(terminal, {"type": "end", "stream": sid, "t_ms": terminal}))
        out[-1].body["reason"] = draw(st.sampled_from(REASONS))
        ended = True
    late = [b for b in sent if b["seq"] > 0]
    if ended and late and draw(st.integers(0, 3)) == 0:  # a late redelivery after the end
        dup = dict(draw(st.sampled_from(late)))
        out.append(_Pending(max(terminal + draw(st.integers(0, 300)), dup["t_ms"]), dup))
    return out


def slo_policies() -> st.SearchStrategy[SloPolicy]:
    """`[slo]` thresholds at the scale of the generated streams (starts of 0-600 ms, gaps of
    tens to hundreds), so that every outcome occurs, exact ties included."""
    return st.builds(
        SloPolicy,
        start_ms=st.sampled_from((0, 50, 120, 300, 3000)) | st.integers(0, 600),
        gap_ms=st.sampled_from((0, 50, 100, 200)) | st.integers(0, 400),
    )


@st.composite
def scenarios(
    draw: st.DrawFn,
    *,
    in_order: bool = False,
    eta_always: bool = False,
    hysteresis_ms: int | None = None,
    min_on_ms: int | None = None,
    player: PlayerModel | None = None,
) -> Scenario:
    """A whole trace with its configuration (see the module docstring)."""
    clock: ClockMode = draw(st.sampled_from(("estimate", "trust")))
    slack = SlackPolicy(
        player=draw(st.sampled_from(PLAYERS)) if player is None else player,
        default_margin_ms=draw(ROUND_MARGIN | st.integers(0, 150)),
        hysteresis_ms=draw(hysteresis()) if hysteresis_ms is None else hysteresis_ms,
        min_on_ms=draw(min_on()) if min_on_ms is None else min_on_ms,
        default_chunk_gap_ms=draw(st.sampled_from((200, 1)) | st.integers(1, 300)),
        stream_idle_timeout_ms=draw(st.integers(700, 1500)),
        clock=clock,
        allowed_lateness_ms=0,  # what edgemon knows is the record (late delivery: see below)
    )
    devices = draw(st.lists(st.sampled_from(DEVICE_NAMES), min_size=1, max_size=2, unique=True))
    overrides: dict[str, DeviceOverride] = {}
    timed: list[tuple[int, int, int, dict[str, Any]]] = []  # (recv, device index, order, event)
    for d, device in enumerate(devices):
        override = DeviceOverride()
        if draw(st.integers(0, 3)) == 0:
            override = DeviceOverride(
                margin_ms=draw(st.none() | ROUND_MARGIN | st.integers(0, 150)),
                player=None if player is not None else draw(st.none() | st.sampled_from(PLAYERS)),
            )
            overrides[device] = override
        lag = 0 if clock == "trust" else draw(st.integers(0, 500))
        delivered: list[tuple[int, int, int, dict[str, Any]]] = []
        for s in range(draw(st.integers(1, 4))):
            sid = f"s{s}" if draw(st.booleans()) else f"req:{s}.x-{d}"
            stream = _stream(
                sid,
                override.player or slack.player,
                own_player=override.player is None and player is None,
                in_order=in_order,
                eta_always=eta_always,
            )
            events = draw(stream)
            at = 0
            for i, ev in enumerate(events):  # a stream's events arrive in the order sent
                jitter = 0 if in_order else draw(st.integers(0, MAX_JITTER_MS))
                at = max(at, ev.happens + jitter)
                delivered.append((at, s, i, ev.body))
        delivered.sort(key=lambda x: (x[0], x[1], x[2]))
        if delivered:  # the device's first message sets its clock offset: no jitter on it
            _, s0, i0, body0 = delivered[0]
            delivered[0] = (body0["t_ms"], s0, i0, body0)
        timed.extend((at + lag, d, order, body) for order, (at, *_, body) in enumerate(delivered))
    timed.sort(key=lambda x: (x[0], x[1], x[2]))
    messages: list[Message] = []
    for recv, d, _, body in timed:
        last = messages[-1] if messages else None
        if (
            last is not None
            and (last.recv_ms, last.device) == (recv, devices[d])
            and draw(st.integers(0, 2)) == 0
        ):
            messages[-1] = Message(recv, devices[d], (*last.events, body), batch=True)
        else:
            messages.append(Message(recv, devices[d], (body,), batch=False))
    config = EngineConfig(slack=slack, devices=overrides, slo=draw(slo_policies()))
    sample_ms = draw(st.sampled_from((50, 100, 250)))
    return Scenario(config, tuple(messages), sample_ms, in_order)


# ---------------------------------------------------------------- late delivery (docs/semantics.md)
#: Largest delivery delay beyond the fastest (below allowed_lateness_ms, as semantics.md requires).
MAX_DELAY_MS = 500
LATENESS_MS = 1_000


@dataclass(frozen=True, slots=True)
class LateScenario:
    """A trace delivered late: the events as the devices sent them (``sent``, each with its
    device and send index) and the messages as edgemon receives them, in receipt order, with
    an optional outage (no delivery in ``[outage[0], outage[1])``, the queue delivered at its
    end in a burst) of which edgemon is told (its broker link was down)."""

    config: EngineConfig
    sent: tuple[tuple[str, dict[str, Any]], ...]
    messages: tuple[Message, ...]
    outage: tuple[int, int] | None

    @property
    def on_event_time(self) -> list[TraceEvent]:
        """Every event as if delivered the instant it happened (recv = t_ms): what the record
        must equal once all messages are in. Equal times keep the order sent."""
        order = sorted(range(len(self.sent)), key=lambda i: (self.sent[i][1]["t_ms"], i))
        return [(self.sent[i][1]["t_ms"], self.sent[i][0], self.sent[i][1]) for i in order]


@st.composite
def late_scenarios(draw: st.DrawFn, *, outage: bool = False) -> LateScenario:
    """Streams whose events reach edgemon late: ``recv = t + delay`` with a random delay per
    message (up to ``MAX_DELAY_MS``), first in first out per device (one MQTT topic) except
    adjacent chunks of one stream that swap places (reordering within a stream), and, with
    ``outage``, a broker outage longer than ``allowed_lateness_ms`` whose backlog arrives in
    a burst. Traces also hold real gaps, duplicates, finals and ends."""
    player: PlayerModel = draw(st.sampled_from(PLAYERS))
    slack = SlackPolicy(
        player=player,
        default_margin_ms=draw(ROUND_MARGIN),
        hysteresis_ms=draw(hysteresis()),
        min_on_ms=draw(min_on()),
        default_chunk_gap_ms=draw(st.sampled_from((200, 1)) | st.integers(1, 300)),
        stream_idle_timeout_ms=draw(st.integers(4_500, 6_000)),
        clock=draw(st.sampled_from(("estimate", "trust"))),
        allowed_lateness_ms=LATENESS_MS,
    )
    devices = draw(st.lists(st.sampled_from(DEVICE_NAMES), min_size=1, max_size=2, unique=True))
    sent: list[tuple[str, dict[str, Any]]] = []
    received: list[tuple[int, int, str, dict[str, Any]]] = []  # (recv, order, device, event)
    for device in devices:
        lag = 0 if slack.clock == "trust" else draw(st.integers(0, 300))
        pending: list[tuple[int, int, int, dict[str, Any]]] = []
        for s in range(draw(st.integers(1, 4))):
            # No redelivered seq 0: delivered late, after its stream ended, it would begin a
            # new stream of that id (docs/semantics.md), which the record on t_ms cannot know.
            stream = _stream(
                f"s{s}", player, own_player=True, in_order=True, eta_always=False, first_again=False
            )
            events = draw(stream)
            pending += [(ev.happens, s, i, ev.body) for i, ev in enumerate(events)]
        pending.sort(key=lambda x: (x[0], x[1], x[2]))
        recv = 0
        times: list[int] = []
        for happens, *_ in pending:
            recv = max(recv, happens + lag + draw(st.integers(0, MAX_DELAY_MS)))
            times.append(recv)
        bodies = [body for *_, body in pending]
        happened = [happens for happens, *_ in pending]  # each body's, as the bodies move
        for j in range(len(bodies) - 1):
            a, b = bodies[j], bodies[j + 1]
            same = a["stream"] == b["stream"] and a["type"] == b["type"] == "chunk"
            causal = times[j] >= happened[j + 1] + lag  # b cannot arrive before it happened
            # a, moved later, is still no more than MAX_DELAY_MS late (below the lateness:
            # a chunk later than that is semantics.md's other case, not this record's).
            bounded = times[j + 1] - happened[j] - lag <= MAX_DELAY_MS
            if (
                same
                and causal
                and bounded
                and a["seq"] != b["seq"]
                and draw(st.integers(0, 3)) == 0
            ):
                bodies[j], bodies[j + 1] = b, a
                happened[j], happened[j + 1] = happened[j + 1], happened[j]
        sent += [(device, body) for *_, body in pending]
        received += [
            (t, len(received) + k, device, body)
            for k, (t, body) in enumerate(zip(times, bodies, strict=True))
        ]
    window: tuple[int, int] | None = None
    if outage and received:
        first = min(r[0] for r in received)
        begin = first + draw(st.integers(0, 2_000))
        window = (begin, begin + draw(st.integers(LATENESS_MS + 200, 3_000)))
        received = [
            (window[1] if window[0] <= t < window[1] else t, order, device, body)
            for t, order, device, body in received
        ]
    received.sort(key=lambda x: (x[0], x[1]))
    messages = tuple(Message(t, device, (body,), batch=False) for t, _, device, body in received)
    config = EngineConfig(slack=slack, slo=draw(slo_policies()))
    return LateScenario(config, tuple(sent), messages, window)


def _found_chunk(stream: str, seq: int, t_ms: int = 0, **fields: Any) -> dict[str, Any]:
    """A 50 ms chunk (or as `fields` say)."""
    return {"type": "chunk", "stream": stream, "t_ms": t_ms, "seq": seq, "audio_ms": 50, **fields}


def _found_config(**slack: Any) -> EngineConfig:
    """The found traces' configuration: an idle timeout of 700 ms, no hysteresis, min-on or
    allowed lateness, unless `slack` says otherwise."""
    base: dict[str, Any] = {
        "hysteresis_ms": 0,
        "min_on_ms": 0,
        "stream_idle_timeout_ms": 700,
        "allowed_lateness_ms": 0,
    }
    return EngineConfig(slack=SlackPolicy(**(base | slack)))


# ---------------------------------------------------------------------- found examples
#: The trace Hypothesis found through the restart property: a repeated seq 0 in
#: one batch, a re-sent first chunk with `play_start_ms`, allowed lateness 0. Cut after the
#: third message, the restored monitor's lines came in wall-time order and the uninterrupted
#: run's did not: edge-1.a's timer, moved later by a message at the instant its engine queue
#: entry was due, fired at 99 ahead of d0's at 50. An `@example` of the properties in
#: `test_snapshot.py` and `test_engine_order.py`.
FOUND_RESTART_TRACE = Scenario(
    config=_found_config(default_margin_ms=101, clock="trust"),
    messages=(
        Message(0, "d0", (_found_chunk("req:1.x-0", 0, play_start_ms=0),) * 2, batch=True),
        Message(
            0,
            "edge-1.a",
            (
                *(_found_chunk("req:0.x-1", 0, play_start_ms=0),) * 2,
                _found_chunk("req:0.x-1", 2, audio_ms=100),
            ),
            batch=True,
        ),
        Message(0, "edge-1.a", (_found_chunk("req:0.x-1", 3),), batch=False),
        Message(1, "d0", (_found_chunk("req:2.x-0", 0, final=True),), batch=False),
        Message(1, "edge-1.a", (_found_chunk("req:0.x-1", 0, play_start_ms=0),), batch=False),
        Message(
            100,
            "d0",
            ({"type": "start", "stream": "req:0.x-0", "t_ms": 100, "margin_ms": 0},),
            batch=False,
        ),
        Message(
            150,
            "d0",
            (
                _found_chunk("req:0.x-0", 0, 150, play_start_ms=150),
                _found_chunk("req:0.x-0", 1, 150),
            ),
            batch=True,
        ),
        Message(151, "d0", (_found_chunk("req:0.x-0", 2, 150),), batch=False),
    ),
    sample_ms=50,
    in_order=False,
)

#: A second trace the restart property found: min-on 250 ms, allowed lateness 0, a re-sent first
#: chunk. Cut after the seventh message, the restored monitor turned the throttle off at
#: 1027 where the uninterrupted run did at 1057 (a throttle decision dated before the instant
#: the device's clock had reached). An `@example` of the property in `test_snapshot.py`.
FOUND_RESTART_TRACE_MIN_ON = Scenario(
    config=_found_config(default_margin_ms=0, min_on_ms=250),
    messages=(
        Message(
            0,
            "d0",
            (_found_chunk("req:3.x-0", 0, audio_ms=1, final=True),),
            batch=False,
        ),
        Message(7, "d0", (_found_chunk("req:0.x-0", 0, 7),), batch=False),
        Message(8, "d0", (_found_chunk("req:0.x-0", 1, 7),), batch=False),
        Message(9, "d0", (_found_chunk("req:0.x-0", 2, 7),), batch=False),
        Message(89, "d0", (_found_chunk("req:0.x-0", 3, 7, eta_ms=0, final=True),), batch=False),
        Message(
            622, "edge-1.a", ({"type": "start", "stream": "req:0.x-1", "t_ms": 275},), batch=False
        ),
        Message(
            777,
            "edge-1.a",
            (
                _found_chunk("req:0.x-1", 0, 395, play_start_ms=395),
                _found_chunk("req:0.x-1", 1, 395),
                _found_chunk("req:0.x-1", 2, 395),
            ),
            batch=True,
        ),
        Message(778, "edge-1.a", (_found_chunk("req:0.x-1", 4, 431),), batch=False),
        Message(779, "edge-1.a", (_found_chunk("req:0.x-1", 6, 431, final=True),), batch=False),
        Message(950, "d0", (_found_chunk("req:2.x-0", 0, 950, play_start_ms=977),), batch=False),
        Message(1000, "d0", (_found_chunk("req:2.x-0", 1, 1000),), batch=False),
        Message(1007, "d0", ({"type": "start", "stream": "req:1.x-0", "t_ms": 1007},), batch=False),
        Message(1008, "d0", (_found_chunk("req:1.x-0", 0, 1007),), batch=False),
        Message(1057, "d0", (_found_chunk("req:1.x-0", 1, 1057),), batch=False),
        Message(
            1101,
            "d0",
            (_found_chunk("req:2.x-0", 2, 1100), _found_chunk("req:2.x-0", 3, 1100)),
            batch=True,
        ),
        Message(1107, "d0", (_found_chunk("req:1.x-0", 2, 1107),), batch=False),
        Message(1146, "d0", (_found_chunk("req:1.x-0", 0, 1007),), batch=False),
        Message(1150, "d0", (_found_chunk("req:2.x-0", 4, 1150, eta_ms=0),), batch=False),
        Message(1151, "d0", (_found_chunk("req:2.x-0", 5, 1150),), batch=False),
    ),
    sample_ms=50,
    in_order=False,
)

#: A trace the sampling property found: a chunk whose `t_ms` (150) is
#: earlier than the one before it (151). The engine expires the stream an idle timeout after
#: its latest event time (851); the reference took the last event received (850), so at 850
#: the engine sampled a stream the reference had removed. The reference was wrong: the
#: stream had an event at 151, and semantics.md's "last event t" is the latest one. An
#: `@example` of `test_samples_are_exact_with_integer_inputs`.
FOUND_EARLIER_T_MS = Scenario(
    config=_found_config(default_margin_ms=0, clock="trust"),
    messages=(
        Message(0, "d0", (_found_chunk("req:0.x-0", 0, eta_ms=0),) * 2, batch=True),
        Message(151, "d0", (_found_chunk("req:0.x-0", 1, 151, eta_ms=0),), batch=False),
        Message(152, "d0", (_found_chunk("req:0.x-0", 2, 150, audio_ms=1, eta_ms=0),), batch=False),
    ),
    sample_ms=50,
    in_order=False,
)
