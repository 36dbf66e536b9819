"""An ended stream's service level (docs/semantics.md, "Service level"): its longest gap on the
device's clock, its start silence, and its outcome under `[slo]`, in the engine's summary, its
device's totals and replay's `stream_end` line."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from edgemon.engine import (
    ChunkEvent,
    Engine,
    EngineConfig,
    SlackPolicy,
    SloPolicy,
    StartEvent,
    StreamEnded,
)
from edgemon.replay import replay
from edgemon.trace import TraceRecord

if TYPE_CHECKING:
    from collections.abc import Sequence

    from edgemon.engine import Event, Output
    from edgemon.engine.config import PlayerModel
TOPIC = "edgemon/v1/d/events"


def config(player: PlayerModel = "conceal", **slo: float) -> EngineConfig:
    """Device clock = edgemon's, a short idle timeout, and the given `[slo]`."""
    slack = SlackPolicy(player=player, clock="trust", stream_idle_timeout_ms=2_000)
    return EngineConfig(slack=slack, slo=SloPolicy(**slo))


def start(t: float, stream: str = "s") -> dict[str, Any]:
    """A start event (the request) at `t`."""
    return {"type": "start", "stream": stream, "t_ms": t}


def chunk(
    t: float, seq: int, audio: float = 200.0, stream: str = "s", **extra: Any
) -> dict[str, Any]:
    """A chunk that reached the player at `t`."""
    return {"type": "chunk", "stream": stream, "t_ms": t, "seq": seq, "audio_ms": audio, **extra}


def end(t: float, reason: str, stream: str = "s") -> dict[str, Any]:
    """An end event at `t`."""
    return {"type": "end", "stream": stream, "t_ms": t, "reason": reason}


def ends(trace: Sequence[tuple[float, dict[str, Any]]], cfg: EngineConfig) -> dict[str, Any]:
    """Replay's `stream_end` lines by stream, for events received at `recv` each."""
    records = [TraceRecord(recv, TOPIC, json.dumps(e).encode()) for recv, e in trace]
    lines = replay(records, cfg)
    return {line["stream"]: line for line in lines if line["kind"] == "stream_end"}


def on_time(*events: dict[str, Any]) -> list[tuple[float, dict[str, Any]]]:
    """Each event received when it happened."""
    return [(e["t_ms"], e) for e in events]


#: Requested at 0, playing from the first chunk at 100: dry at 300, refilled at 350 (a gap of
#: 50), dry again at 500 (conceal; rebuffer: 550), the final chunk at 620.
TWO_GAPS = on_time(
    start(0), chunk(100, 0), chunk(350, 1), chunk(620, 2, final=True)
)  # fmt: skip


@pytest.mark.parametrize(
    ("player", "gap_ms", "longest", "outcome"),
    [
        ("conceal", 100, 120, "gappy"),  # 500 → 620: the player concealed 120 ms
        ("conceal", 120, 120, "good"),  # at the threshold is within it
        ("rebuffer", 100, 70, "good"),  # paused at 300 → 350, resumed; dry at 550 → 620
        ("rebuffer", 60, 70, "gappy"),
    ],
)
def test_longest_gap_is_the_longest_single_underrun_of_either_player(
    player: PlayerModel, gap_ms: float, longest: float, outcome: str
) -> None:
    """The longest gap is the longest one underrun, not their sum (conceal: 50 and 120;
    rebuffer, whose paused player resumes at each chunk: 50 and 70); a stream that completes
    with it at most `gap_ms` is good, above it gappy."""
    (line,) = ends(TWO_GAPS, config(player, gap_ms=gap_ms)).values()
    assert (line["reason"], line["underruns"]) == ("completed", 2)
    assert (line["longest_gap_ms"], line["outcome"]) == (longest, outcome)


def test_a_completed_stream_without_a_gap_is_good_and_counted() -> None:
    """Played through to its final chunk, started within the start SLO: good; the device
    counts the outcome and the longest gap (0) once the stream is removed."""
    engine = Engine(config())
    out: list[Output] = []
    events: list[Event] = [
        StartEvent(stream="s", t_ms=0),
        ChunkEvent(stream="s", t_ms=100, seq=0, audio_ms=200),
        ChunkEvent(stream="s", t_ms=250, seq=1, audio_ms=200, final=True),
    ]
    for event in events:
        engine.advance(event.t_ms, out, inclusive=False)
        engine.apply("d", [event], event.t_ms, out)
    engine.advance(10_000, out)
    device = engine.device("d")
    assert device is not None
    assert dict(device.stats.slo) == {"good": 1}
    longest_gap = device.stats.longest_gap
    assert (longest_gap.count, longest_gap.counts[0]) == (1, 1)  # in the le=0 bucket
    (ended,) = [o for o in out if isinstance(o, StreamEnded)]
    assert (ended.start_silence_ms, ended.longest_gap_ms, ended.outcome) == (100, 0, "good")


def test_a_late_chunk_that_retracts_the_underrun_leaves_no_gap() -> None:
    """The buffer would run dry at 200 and edgemon announces the underrun live; the chunk
    that reached the player at 150 arrives at 260 and retracts it: by the device's clock
    there was no gap, so the stream is good."""
    trace = [(0, chunk(0, 0)), (260, chunk(150, 1)), (300, chunk(300, 2, final=True))]
    (line,) = ends(trace, config()).values()
    assert (line["underruns"], line["longest_gap_ms"], line["outcome"]) == (0, 0, "good")


def test_a_late_chunk_ends_the_gap_at_its_own_instant() -> None:
    """The buffer ran dry at 200; the chunk that refilled it reached the player at 250 but
    edgemon got it at 600: the gap is 50 ms on the device's clock (what the listener heard),
    not the 400 ms edgemon waited."""
    trace = [(0, chunk(0, 0)), (600, chunk(250, 1)), (700, chunk(390, 2, final=True))]
    (line,) = ends(trace, config(gap_ms=50)).values()
    assert (line["underruns"], line["longest_gap_ms"], line["outcome"]) == (1, 50, "good")


def test_an_expired_stream_is_unfinished() -> None:
    """A stream whose chunks stop and that expires is unfinished, however it played."""
    (line,) = ends(on_time(start(0), chunk(10, 0)), config()).values()
    assert (line["reason"], line["outcome"]) == ("expired", "unfinished")


@pytest.mark.parametrize(
    ("reason", "at", "outcome"),
    [
        ("cancelled", 150, "unfinished"),  # its audio played until 210
        ("cancelled", 210, "good"),  # played out: judged as any other
        ("completed", 150, "good"),  # the device says it completed
        ("error", 300, "gappy"),  # played out at 210, in a gap of 90 until the end
    ],
)
def test_an_end_before_the_audio_played_out_is_unfinished(
    reason: str, at: float, outcome: str
) -> None:
    """An `end` other than `completed` before the stream's audio played out (its `t_ms`
    against start + audio) leaves it unfinished; after that it is judged like any other,
    its gap running until the end."""
    trace = on_time(start(0), chunk(10, 0), end(at, reason))
    (line,) = ends(trace, config(gap_ms=80)).values()
    assert line["outcome"] == outcome


def test_a_stream_that_never_played_is_unfinished() -> None:
    """A request ended before any audio came is unfinished, even `completed`."""
    (line,) = ends(on_time(start(0), end(100, "completed")), config()).values()
    assert (line["chunks"], line["outcome"]) == (0, "unfinished")


def test_a_start_past_the_start_slo_is_late_even_if_gappy() -> None:
    """Start silence (request to playback start, prebuffer included) above `start_ms` makes
    the stream late, whatever its gaps; a stream without a start event is never late."""
    late = on_time(
        start(0), chunk(100, 0, play_start_ms=400), chunk(900, 1, final=True)
    )  # fmt: skip
    (line,) = ends(late, config(start_ms=300, gap_ms=100)).values()
    assert (line["longest_gap_ms"], line["outcome"]) == (300, "late")  # dry at 600 → 900
    no_start = [(t, e) for t, e in late if e["type"] != "start"]
    (line,) = ends(no_start, config(start_ms=300, gap_ms=100)).values()
    assert line["outcome"] == "gappy"
