"""One wire contract: whatever a player asks of the Reporter, what reaches the broker decodes
with the daemon's own decoder (`edgemon.wire.decode`) to the events the calls meant, field for
field, with no event refused; and both ends take their limits from `edgemon.protocol`."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgemon import protocol
from edgemon.client import Reporter, ThrottleGate
from edgemon.wire.decode import Problem, decode_events

from mqtt_probe import probe
from properties import examples

if TYPE_CHECKING:
    from brokers import Broker

pytestmark = pytest.mark.integration

STREAMS = ("s0", "req:1", "a.b-c_d")
T0 = 1_700_000_000_000.0
_times = st.none() | st.floats(min_value=0, max_value=protocol.MAX_TIME_MS)
_START = st.tuples(
    st.just("start"),
    st.sampled_from(STREAMS),
    st.fixed_dictionaries(
        {},
        optional={
            "play_start_ms": st.floats(min_value=0, max_value=protocol.MAX_TIME_MS),
            "margin_ms": st.floats(min_value=0, max_value=protocol.MAX_MARGIN_MS),
            "player": st.sampled_from(sorted(protocol.PLAYERS)),
        },
    ),
)
_CHUNK = st.tuples(
    st.just("chunk"),
    st.sampled_from(STREAMS),
    st.fixed_dictionaries(
        {},
        optional={
            "eta_ms": st.floats(min_value=0, max_value=protocol.MAX_ETA_MS),
            "final": st.booleans(),
            "play_start_ms": st.floats(min_value=0, max_value=protocol.MAX_TIME_MS),
        },
    ).flatmap(
        lambda extra: st.one_of(
            st.floats(min_value=0.001, max_value=protocol.MAX_AUDIO_MS).map(
                lambda ms: extra | {"audio_ms": ms}
            ),
            st.integers(min_value=1, max_value=100_000).map(
                lambda n: extra | {"pcm_bytes": 2 * n}  # whole s16le mono frames
            ),
        )
    ),
)
_END = st.tuples(
    st.just("end"),
    st.sampled_from(STREAMS),
    st.fixed_dictionaries({}, optional={"reason": st.text(max_size=protocol.MAX_REASON)}),
)
CALLS = st.lists(st.one_of(_START, _CHUNK, _END), min_size=1, max_size=30)
_devices = itertools.count()


def meant(call: tuple[str, str, dict[str, Any]], t_ms: float) -> dict[str, Any]:
    """The event a call that was accepted means (before `seq` and `audio_total_ms`)."""
    kind, stream, fields = call
    event: dict[str, Any] = {"type": kind, "stream": stream, "t_ms": t_ms}
    fields = dict(fields)
    if "pcm_bytes" in fields:
        fields["audio_ms"] = fields.pop("pcm_bytes") / 48  # 48 bytes per ms of s16le 24 kHz
    if kind == "end":
        fields.setdefault("reason", "completed")
    if not fields.get("final", True):
        del fields["final"]
    return event | fields


@settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(calls=CALLS)
def test_everything_the_reporter_emits_decodes_to_what_it_meant(
    mosquitto_broker: Broker, calls: list[tuple[str, str, dict[str, Any]]]
) -> None:
    """Each accepted call is one event on the wire; the daemon's decoder refuses none of them
    and reads each field as the call gave it, `seq` counting each stream's chunks from 0 and
    `audio_total_ms` their running total."""
    broker = mosquitto_broker
    device = f"dev{next(_devices)}"
    topic = broker.topic(device, "events")
    ticks = itertools.count()
    expected: list[dict[str, Any]] = []
    with probe(broker.host, broker.port, topic) as watcher:
        with broker.reporter(
            device, clock=lambda: T0 + next(ticks), audio_format="s16le:24000:1",
            merge_chunks=False,
        ) as reporter:  # fmt: skip
            for number, call in enumerate(calls):
                before = reporter.stats.events
                kind, stream, fields = call
                getattr(reporter, kind)(stream, **fields)
                if reporter.stats.events > before:
                    expected.append(meant(call, T0 + number))
            assert reporter.flush(30)
        assert watcher.wait_for(lambda seen: sum(len(m.json()) for m in seen) >= len(expected))
    decoded: list[Any] = []
    for message in watcher.seen:
        verdicts = decode_events(
            message.payload,
            max_bytes=protocol.MAX_PAYLOAD_BYTES,
            max_batch=protocol.MAX_BATCH_EVENTS,
        )
        assert not isinstance(verdicts, Problem), verdicts
        assert not [v for v in verdicts if isinstance(v, Problem)], verdicts
        decoded.extend(verdicts)
    seqs: dict[str, int] = {}
    totals: dict[str, float] = {}
    for event, want in zip(decoded, expected, strict=True):
        got = {k: v for k, v in msgspec.structs.asdict(event).items() if v is not None}
        got["type"] = event.type
        if got.get("final") is False:
            del got["final"]
        if want["type"] == "chunk":
            stream = want["stream"]
            assert got.pop("seq") == seqs.get(stream, 0)
            seqs[stream] = seqs.get(stream, 0) + 1
            totals[stream] = totals.get(stream, 0.0) + want["audio_ms"]
            assert got.pop("audio_total_ms") == pytest.approx(totals[stream], rel=1e-9)
            assert got.pop("audio_ms") == pytest.approx(want.pop("audio_ms"), rel=1e-12)
        else:
            seqs.pop(want["stream"], None)
            totals.pop(want["stream"], None)
        assert got == want


@pytest.mark.parametrize(
    ("field", "limit"),
    [
        ("audio_ms", protocol.MAX_AUDIO_MS),
        ("eta_ms", protocol.MAX_ETA_MS),
        ("play_start_ms", protocol.MAX_TIME_MS),
    ],
)
def test_both_ends_take_the_limits_from_one_module(field: str, limit: float) -> None:
    """At a limit of `edgemon.protocol` both ends accept; just past it the daemon's decoder
    refuses the event and the Reporter refuses the call."""
    base: dict[str, Any] = {"type": "chunk", "stream": "s", "t_ms": 1.0, "seq": 0, "audio_ms": 1.0}
    for value, ok in ((limit, True), (limit * (1 + 1e-9), False)):
        payload = msgspec.json.encode(base | {field: value})
        verdicts = decode_events(payload, max_bytes=10_000, max_batch=10)
        assert not isinstance(verdicts, Problem)
        assert isinstance(verdicts[0], Problem) is not ok, (field, value)
        reporter = Reporter("mqtt://127.0.0.1:1", "d", merge_chunks=False)
        try:
            arguments: dict[str, Any] = {"audio_ms": 1.0} | {field: value}
            if ok:
                reporter.chunk("s", **arguments)
            else:
                with pytest.raises(ValueError, match=field):
                    reporter.chunk("s", **arguments)
        finally:
            reporter.close(0.1)


def test_the_reserved_device_id_is_refused_by_both_clients() -> None:
    """`_edgemon` names edgemon's own topics: the Reporter and the gate refuse it as a device."""
    for constructor in (Reporter, ThrottleGate):
        with pytest.raises(ValueError, match="reserved"):
            constructor("mqtt://127.0.0.1:1", protocol.RESERVED_DEVICE)
