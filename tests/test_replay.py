"""`replay()` on small hand-built traces: the JSON lines of README on a virtual clock
(docs/semantics.md)."""

from __future__ import annotations

import json
import signal
from collections import Counter
from contextlib import contextmanager
from itertools import islice
from typing import TYPE_CHECKING, Any

import pytest

from edgemon.engine.config import EngineConfig, SlackPolicy
from edgemon.replay import replay
from edgemon.trace import TraceMark, TraceRecord

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

D1 = "edgemon/v1/d1/events"
D2 = "edgemon/v1/d2/events"

#: README replay lines: the keys of each kind, exactly (`rejected` also has `detail`).
KEYS = {
    "sample": {"kind", "t_ms", "device", "stream", "slack_ms", "eta_ms", "headroom_ms", "at_risk"},
    "underrun": {"kind", "t_ms", "device", "stream"},
    "throttle": {"kind", "t_ms", "device", "active", "streams", "min_headroom_ms"},
    "stream_end": {
        "kind",
        "t_ms",
        "device",
        "stream",
        "reason",
        "chunks",
        "audio_ms",
        "underruns",
        "underrun_ms",
        "min_slack_ms",
        "longest_gap_ms",
        "outcome",
    },
    "rejected": {"kind", "recv_ms", "topic", "reason", "detail"},
    "summary": {
        "kind",
        "messages",
        "events",
        "rejected",
        "streams",
        "underruns",
        "throttle_engagements",
    },
}
#: No hysteresis, no minimum on-time: the throttle follows `any(at risk)` exactly.
EXACT = EngineConfig(slack=SlackPolicy(hysteresis_ms=0, min_on_ms=0))


def rec(recv_ms: float, value: Any, topic: str = D1) -> TraceRecord:
    """A trace record of a JSON value (or raw bytes) received at `recv_ms`."""
    body = value if isinstance(value, bytes) else json.dumps(value).encode()
    return TraceRecord(recv_ms, topic, body)


def chunk(seq: int, t: float, audio: float, stream: str = "s", **extra: Any) -> dict[str, Any]:
    """A chunk event."""
    return {"type": "chunk", "stream": stream, "t_ms": t, "seq": seq, "audio_ms": audio, **extra}


def at(t: float, event: dict[str, Any], topic: str = D1) -> TraceRecord:
    """An event received exactly when it happened (device clock = wall clock)."""
    return rec(t, event, topic)


def run(
    records: Iterable[TraceRecord | TraceMark],
    config: EngineConfig | None = None,
    *,
    sample_ms: float | None = None,
) -> list[dict[str, Any]]:
    """All replay lines of a trace."""
    return list(replay(records, config or EngineConfig(), sample_ms=sample_ms))


def kinds(lines: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The lines of one kind."""
    return [line for line in lines if line["kind"] == kind]


def moment(line: dict[str, Any]) -> float:
    """The instant of a line: `t_ms`, or `recv_ms` for a rejection."""
    value = line["t_ms"] if "t_ms" in line else line["recv_ms"]
    assert isinstance(value, int | float)
    return value


def busy_trace() -> list[TraceRecord]:
    """Two devices, an underrun, a throttle, a final chunk, an end, and bad messages."""
    return [
        at(0, {"type": "start", "stream": "a", "t_ms": 0}),
        at(20, chunk(0, 20, 300, "a", eta_ms=100)),
        at(40, chunk(0, 40, 100, "b", eta_ms=400), D2),
        rec(50, b"{not json"),
        at(120, chunk(1, 120, 300, "a", eta_ms=100)),
        rec(130, {"type": "chunk", "stream": "a"}),
        rec(140, chunk(0, 140, 100), "edgemon/v1/d1/nonsense"),
        at(220, chunk(2, 220, 300, "a", final=True)),
        at(600, {"type": "end", "stream": "b", "t_ms": 600, "reason": "error"}, D2),
    ]


def test_output_kinds_and_keys() -> None:
    """Every line has exactly the README keys of its kind; the summary comes last, once."""
    lines = run(busy_trace(), sample_ms=50)
    assert {line["kind"] for line in lines} == set(KEYS)
    for line in lines:
        assert set(line) == KEYS[line["kind"]], line
    assert lines[-1]["kind"] == "summary"
    assert len(kinds(lines, "summary")) == 1
    json.dumps(lines, allow_nan=False)  # plain JSON values only


def test_value_types() -> None:
    """Times and amounts are numbers, flags booleans, ids strings, lists of ids lists."""
    lines = run(busy_trace(), sample_ms=50)
    for line in kinds(lines, "sample"):
        assert isinstance(line["at_risk"], bool)
        assert all(isinstance(line[k], int | float) for k in ("slack_ms", "eta_ms", "headroom_ms"))
    for line in kinds(lines, "throttle"):
        assert isinstance(line["active"], bool)
        assert isinstance(line["streams"], list)
        assert all(isinstance(s, str) for s in line["streams"])
    for line in kinds(lines, "stream_end"):
        assert isinstance(line["chunks"], int)
        assert isinstance(line["underruns"], int)
    for line in kinds(lines, "rejected"):
        assert isinstance(line["detail"], str)


def test_lines_are_in_time_order() -> None:
    """Lines come in virtual-time order (device clock = wall clock here), except `underrun`
    lines: written when confirmed (docs/semantics.md), they carry the earlier instant it began."""
    lines = [line for line in run(busy_trace(), sample_ms=50)[:-1] if line["kind"] != "underrun"]
    times = [moment(line) for line in lines]
    assert times == sorted(times)


def test_summary_counts() -> None:
    """The summary counts messages, applied events, rejections, streams, underruns, engagements."""
    lines = run(busy_trace(), sample_ms=50)
    summary = lines[-1]
    assert summary == {
        "kind": "summary",
        "messages": 9,
        "events": 6,
        "rejected": 3,
        "streams": 2,
        "underruns": len(kinds(lines, "underrun")),
        "throttle_engagements": sum(line["active"] for line in kinds(lines, "throttle")),
    }
    assert summary["underruns"] == 1
    assert summary["throttle_engagements"] >= 1
    assert len(kinds(lines, "rejected")) == 3
    assert {(r["recv_ms"], r["reason"]) for r in kinds(lines, "rejected")} == {
        (50.0, "invalid_json"),
        (130.0, "invalid_event"),
        (140.0, "unknown_topic"),
    }


def test_every_stream_is_summarised() -> None:
    """After the last record the clock runs on until every stream has ended and is summarised."""
    lines = run(busy_trace())
    ends = {(e["device"], e["stream"]): e for e in kinds(lines, "stream_end")}
    assert set(ends) == {("d1", "a"), ("d2", "b")}
    a = ends["d1", "a"]
    assert (a["reason"], a["chunks"], a["audio_ms"], a["t_ms"]) == ("completed", 3, 900, 920)
    b = ends["d2", "b"]
    assert (b["reason"], b["t_ms"], b["underruns"], b["underrun_ms"]) == ("error", 600, 1, 460)
    assert kinds(lines, "underrun") == [
        {"kind": "underrun", "t_ms": 140, "device": "d2", "stream": "b"}
    ]


def test_samples_at_exact_multiples() -> None:
    """Samples fall on exact multiples of `sample_ms` on the device clock while the stream lives."""
    lag = 1000  # received 1 s after it happened: samples follow the device's clock
    records = [
        rec(130 + lag, chunk(0, 130, 500, eta_ms=100)),
        rec(230 + lag, chunk(1, 230, 500, eta_ms=100)),
        rec(300 + lag, {"type": "end", "stream": "s", "t_ms": 300}),
    ]
    lines = run(records, sample_ms=50)
    samples = kinds(lines, "sample")
    assert [s["t_ms"] for s in samples] == [150, 200, 250]
    first = samples[0]
    assert first == {
        "kind": "sample",
        "t_ms": 150,
        "device": "d1",
        "stream": "s",
        "slack_ms": 480,
        "eta_ms": 80,
        "headroom_ms": 400,
        "at_risk": False,
    }
    assert samples[2]["slack_ms"] == 1000 - 120


def test_messages_before_timers_and_samples_at_equal_times() -> None:
    """A chunk arriving at the instant the buffer empties prevents the underrun and the risk,
    and the sample at that instant sees the chunk."""
    config = EngineConfig(slack=SlackPolicy(default_margin_ms=0, hysteresis_ms=0, min_on_ms=0))
    records = [
        at(0, chunk(0, 0, 100, eta_ms=100)),
        at(100, chunk(1, 100, 100, eta_ms=100)),
        at(150, {"type": "end", "stream": "s", "t_ms": 150, "reason": "cancelled"}),
    ]
    lines = run(records, config, sample_ms=50)
    assert kinds(lines, "underrun") == []
    assert kinds(lines, "throttle") == []
    samples = {s["t_ms"]: s for s in kinds(lines, "sample")}
    assert sorted(samples) == [0, 50, 100]
    assert samples[100]["slack_ms"] == 100
    assert samples[100]["eta_ms"] == 100
    assert lines[-1]["underruns"] == 0


def test_timer_fires_when_message_comes_later() -> None:
    """Without that chunk the underrun is detected at its exact instant by a timer."""
    config = EngineConfig(slack=SlackPolicy(default_margin_ms=0, hysteresis_ms=0, min_on_ms=0))
    records = [
        at(0, chunk(0, 0, 100, eta_ms=100)),
        at(101, chunk(1, 101, 100, eta_ms=50)),  # headroom at 101: 99 - 50 ≥ 0
        at(150, {"type": "end", "stream": "s", "t_ms": 150}),
    ]
    lines = run(records, config)
    assert kinds(lines, "underrun") == [
        {"kind": "underrun", "t_ms": 100, "device": "d1", "stream": "s"}
    ]
    throttle = kinds(lines, "throttle")
    assert [(t["t_ms"], t["active"]) for t in throttle] == [(100, True), (101, False)]
    (end,) = kinds(lines, "stream_end")
    assert (end["underruns"], end["underrun_ms"]) == (1, 1)


def test_virtual_clock_never_runs_back() -> None:
    """A record with a smaller recv_ms than one before it is treated at the current time."""
    records = [
        at(0, chunk(0, 0, 5000)),
        at(1000, {"type": "start", "stream": "other", "t_ms": 1000}),
        rec(500, {"type": "end", "stream": "s", "t_ms": 500, "reason": "cancelled"}),
        rec(400, b"garbage"),
    ]
    lines = run(records)
    ended = {e["stream"]: e for e in kinds(lines, "stream_end")}
    assert ended["s"]["t_ms"] == 1000
    assert ended["s"]["reason"] == "cancelled"
    (bad,) = kinds(lines, "rejected")
    assert bad["recv_ms"] == 1000
    times = [moment(line) for line in lines[:-1]]
    assert times == sorted(times)


def test_stream_ended_by_end_event() -> None:
    """An `end` removes the stream at once with its reason and its summary."""
    records = [
        at(0, {"type": "start", "stream": "s", "t_ms": 0}),
        at(100, chunk(0, 100, 500, eta_ms=100)),
        at(200, chunk(1, 200, 500, eta_ms=100)),
        at(250, {"type": "end", "stream": "s", "t_ms": 250, "reason": "cancelled"}),
    ]
    lines = run(records, EXACT, sample_ms=50)
    assert kinds(lines, "stream_end") == [
        {
            "kind": "stream_end",
            "t_ms": 250,
            "device": "d1",
            "stream": "s",
            "reason": "cancelled",
            "chunks": 2,
            "audio_ms": 1000,
            "underruns": 0,
            "underrun_ms": 0,
            "min_slack_ms": 400,
            "longest_gap_ms": 0,
            "outcome": "unfinished",  # cancelled at 250, its audio lasting until 1100
        }
    ]
    assert [s["t_ms"] for s in kinds(lines, "sample")] == [100, 150, 200]  # not at 250
    assert lines[-1] == {
        "kind": "summary",
        "messages": 4,
        "events": 4,
        "rejected": 0,
        "streams": 1,
        "underruns": 0,
        "throttle_engagements": 0,
    }


def test_idle_expiry_after_audio_played_out() -> None:
    """With no more events a stream expires `stream_idle_timeout_ms` after its audio played out."""
    lines = run([at(100, chunk(0, 100, 300, eta_ms=50))])
    (end,) = kinds(lines, "stream_end")
    assert (end["reason"], end["t_ms"]) == ("expired", 100 + 300 + 30_000)
    assert kinds(lines, "underrun") == [
        {"kind": "underrun", "t_ms": 400, "device": "d1", "stream": "s"}
    ]
    assert end["underruns"] == 1
    assert end["underrun_ms"] == 30_000


def test_idle_expiry_after_last_event() -> None:
    """When the last event comes after the audio played out, expiry counts from that event."""
    policy = SlackPolicy(stream_idle_timeout_ms=1000)
    records = [at(0, chunk(0, 0, 100)), at(500, chunk(1, 500, 100))]
    (end,) = kinds(run(records, EngineConfig(slack=policy)), "stream_end")
    assert (end["reason"], end["t_ms"], end["chunks"]) == ("expired", 1500, 2)
    # max(last event 500, start + B = 200) + 1000


def test_waiting_stream_expires_after_its_start() -> None:
    """A started stream that never gets a chunk expires one idle timeout after its start."""
    policy = SlackPolicy(stream_idle_timeout_ms=2000)
    lines = run([at(10, {"type": "start", "stream": "w", "t_ms": 10})], EngineConfig(slack=policy))
    (end,) = kinds(lines, "stream_end")
    assert (end["reason"], end["t_ms"], end["chunks"], end["min_slack_ms"]) == (
        "expired",
        2010,
        0,
        None,
    )


def test_final_chunk_completes_when_audio_played_out() -> None:
    """A stream whose last chunk is `final` is removed as `completed` at start + Σ audio."""
    records = [at(0, chunk(0, 0, 200)), at(150, chunk(1, 150, 200, final=True))]
    lines = run(records, EXACT, sample_ms=100)
    (end,) = kinds(lines, "stream_end")
    assert (end["reason"], end["t_ms"], end["min_slack_ms"]) == ("completed", 400, 50)
    assert [s["t_ms"] for s in kinds(lines, "sample")] == [0, 100]  # draining: not sampled


def test_no_samples_without_sample_ms() -> None:
    """`sample_ms=None` (or 0) prints no samples; everything else is unchanged."""
    with_samples = run(busy_trace(), sample_ms=50)
    for sample_ms in (None, 0):
        lines = run(busy_trace(), sample_ms=sample_ms)
        assert kinds(lines, "sample") == []
        assert lines == [line for line in with_samples if line["kind"] != "sample"]


def test_deterministic() -> None:
    """The same trace replayed twice gives identical output."""
    first = [json.dumps(line) for line in run(busy_trace(), sample_ms=20)]
    second = [json.dumps(line) for line in run(busy_trace(), sample_ms=20)]
    assert first == second
    assert Counter(json.loads(line)["kind"] for line in first)["sample"] > 10


def test_empty_trace() -> None:
    """An empty trace prints only a zero summary."""
    assert run([]) == [
        {
            "kind": "summary",
            "messages": 0,
            "events": 0,
            "rejected": 0,
            "streams": 0,
            "underruns": 0,
            "throttle_engagements": 0,
        }
    ]


def test_topic_prefix_from_config() -> None:
    """Replay routes by the configured topic prefix."""
    config = EngineConfig(topic_prefix="site/x")
    lines = run([rec(0, chunk(0, 0, 100), "site/x/d9/events"), rec(0, chunk(0, 0, 100))], config)
    assert [r["reason"] for r in kinds(lines, "rejected")] == ["unknown_topic"]
    assert [e["device"] for e in kinds(lines, "stream_end")] == ["d9"]


class ReplayHangError(Exception):
    """Raised by `time_limit` when the code under test runs past its deadline."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Interrupt the block with ReplayHangError after `seconds` (SIGALRM, main thread)."""

    def on_alarm(signum: int, frame: object) -> None:
        raise ReplayHangError

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs SIGALRM")
def test_tiny_sample_period_does_not_hang() -> None:
    """A sample period below the clock's resolution is refused or sampled at rising instants."""
    t0 = 1_700_000_000_000  # epoch milliseconds, as docs/protocol.md recommends
    lines = replay([at(t0, chunk(0, t0, 100))], EngineConfig(), sample_ms=1e-4)
    with time_limit(0.3):
        try:
            head = list(islice(lines, 20))
        except ValueError:
            return  # refusing such a period is a fine answer too
    times = [line["t_ms"] for line in head if line["kind"] == "sample"]
    assert times == sorted(set(times))


def test_marks_replay_a_restart_as_the_daemon_published_it() -> None:
    """A trace recorded across a clean restart (`stop`, `restart` with the cut's `since_ms`,
    `resumed`) replays to the throttle objects the daemon published: on at the at-risk chunk,
    released at the stop, nothing while catching up (the restored state's `true` at the cut,
    the queued chunk's `false`), then the state as of `resumed`. Without the marks the same
    messages replay as one run: on until the queued chunk."""
    messages = [
        at(0, chunk(0, 0, 300, eta_ms=2000)),
        at(5150, chunk(1, 5150, 1000, final=True)),
    ]
    marked: list[TraceRecord | TraceMark] = [
        messages[0],
        TraceMark(100, "stop"),
        TraceMark(5100, "restart", 100),
        messages[1],
        TraceMark(5400, "resumed"),
    ]
    throttles = [(t["t_ms"], t["active"]) for t in kinds(run(marked, EXACT), "throttle")]
    assert throttles == [(0, True), (100, False), (5400, False)]
    plain = [(t["t_ms"], t["active"]) for t in kinds(run(messages, EXACT), "throttle")]
    assert plain == [(0, True), (5150, False)]


def test_a_stall_mark_cuts_the_stall_out() -> None:
    """A `stall` mark cuts the stall out of the device's timeline, as the daemon does: the
    stream whose audio would have run out during the 4 s stall does not underrun, since the
    chunk that queued meanwhile is applied at its own time when the clock resumes."""
    records: list[TraceRecord | TraceMark] = [
        at(0, chunk(0, 0, 1000, eta_ms=100)),
        TraceMark(4500, "stall", 500),
        at(4500, chunk(1, 600, 1000, eta_ms=100, final=True)),
    ]
    assert kinds(run(records, EXACT), "underrun") == []
    plain = [r for r in records if isinstance(r, TraceRecord)]
    assert kinds(run(plain, EXACT), "underrun") != []
