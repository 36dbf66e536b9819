"""The simulation model: deterministic, realistic TTS streams, valid on the wire, and judged by
edgemon's own engine as healthy at RTF 0.1 and underrunning at RTF 1.2."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgemon.engine.config import EngineConfig
from edgemon.engine.tts import TtsEngineInfo
from edgemon.replay import replay
from edgemon.simulate import Simulation
from edgemon.simulate.model import CHUNK_MS, FRAME_MS, HOP_MS, JITTER, PREFILL_MS
from edgemon.trace import TraceRecord
from edgemon.wire.decode import Problem, decode_engine, decode_events

from properties import examples

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from edgemon.simulate import Message

START_MS = 1_700_000_000_000.0


def _sim(
    *,
    devices: int = 2,
    streams: int = 3,
    rtf: float | Sequence[float] = 0.1,
    stall_rate: float = 0.0,
    seed: int = 7,
) -> Simulation:
    return Simulation(
        devices=devices,
        streams=streams,
        rtf=rtf,
        stall_rate=stall_rate,
        seed=seed,
        start_ms=START_MS,
    )


def _run(sim: Simulation, seconds: float) -> list[Message]:
    end = START_MS + seconds * 1000.0
    return sim.until(end) + sim.stop(end)


def _by_stream(messages: list[Message]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    streams: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for message in messages:
        streams[message.device, message.payload["stream"]].append(message.payload)
    return streams


def _records(sim: Simulation, seconds: float) -> Iterator[TraceRecord]:
    for device, obj in sim.engine_objects().items():
        yield TraceRecord(START_MS, f"edgemon/v1/{device}/engine", json.dumps(obj).encode())
    for message in _run(sim, seconds):
        topic = f"edgemon/v1/{message.device}/events"
        yield TraceRecord(message.t_ms, topic, json.dumps(message.payload).encode())


def _replay_summary(sim: Simulation, seconds: float) -> tuple[dict[str, Any], list[Any]]:
    lines = list(replay(_records(sim, seconds), EngineConfig(), sample_ms=None))
    return lines[-1], lines


def test_same_seed_same_messages_other_seed_others() -> None:
    """A seed fixes the whole run; another seed gives another run."""
    assert _run(_sim(seed=3), 30) == _run(_sim(seed=3), 30)
    assert _run(_sim(seed=3), 30) != _run(_sim(seed=4), 30)


def test_until_in_small_steps_equals_one_call() -> None:
    """The virtual clock can be advanced in any steps: the messages are the same."""
    stepped = _sim()
    messages: list[Message] = []
    t = START_MS
    while t < START_MS + 20_000:
        t += 37.5
        due = stepped.until(t)
        assert all(m.t_ms <= t for m in due)
        messages += due
    assert messages == _sim().until(t)


def test_messages_in_time_order_with_device_ids_from_prefix() -> None:
    """Messages come in non-decreasing time; devices are sim-0 … sim-N-1."""
    sim = _sim(devices=3)
    messages = _run(sim, 30)
    times = [m.t_ms for m in messages]
    assert times == sorted(times)
    assert sim.devices == ("sim-0", "sim-1", "sim-2")
    assert {m.device for m in messages} == set(sim.devices)


def test_first_chunk_is_80ms_after_about_30ms() -> None:
    """Each stream starts, then its first chunk of 80 ms arrives ≈ 30 ms later at RTF 0.1."""
    low = PREFILL_MS[0] + FRAME_MS * 0.1 * (1 - JITTER)
    high = PREFILL_MS[1] + FRAME_MS * 0.1 * (1 + JITTER)
    streams = _by_stream(_run(_sim(), 60))
    started = [events for events in streams.values() if len(events) > 1]
    assert len(started) > 20
    for events in started:
        start, first = events[0], events[1]
        assert start["type"] == "start"
        if first["type"] == "end":  # cancelled by the end of the run
            continue
        assert first["seq"] == 0
        assert first["audio_ms"] == FRAME_MS
        assert low - 0.1 <= first["t_ms"] - start["t_ms"] <= high + 0.1
    ttfa = [e[1]["t_ms"] - e[0]["t_ms"] for e in started if e[1]["type"] == "chunk"]
    assert 25 <= sum(ttfa) / len(ttfa) <= 35


def test_later_chunks_are_2s_generated_at_rtf() -> None:
    """After the first chunk come 25-frame chunks (2 s) every 2 s × RTF ± jitter; the last one
    is 1–25 frames."""
    rtf = 0.1
    for events in _by_stream(_run(_sim(rtf=rtf), 60)).values():
        chunks = [e for e in events if e["type"] == "chunk"]
        for before, chunk in itertools.pairwise(chunks[1:]):
            gap = chunk["t_ms"] - before["t_ms"]
            nominal = chunk["audio_ms"] * rtf
            assert (
                nominal * (1 - JITTER) + HOP_MS - 0.2
                <= gap
                <= nominal * (1 + JITTER) + HOP_MS + 0.2
            )
        for chunk in chunks[1:]:
            if chunk.get("final"):
                frames = chunk["audio_ms"] / FRAME_MS
                assert frames == int(frames)
                assert 1 <= frames <= 25
            else:
                assert chunk["audio_ms"] == CHUNK_MS


def test_streams_are_well_formed() -> None:
    """Per stream: a start, seq 0, 1, 2 … with a running audio total and an eta on every chunk
    but the last, and nothing after a final chunk or an end."""
    for events in _by_stream(_run(_sim(stall_rate=0.05), 90)).values():
        assert events[0]["type"] == "start"
        chunks = [e for e in events[1:] if e["type"] == "chunk"]
        assert [c["seq"] for c in chunks] == list(range(len(chunks)))
        total = 0.0
        for chunk in chunks:
            total += chunk["audio_ms"]
            assert chunk["audio_total_ms"] == total
            assert ("eta_ms" in chunk) != bool(chunk.get("final"))
        assert events[-1]["type"] in {"chunk", "end"}
        assert events[-1]["type"] == "end" or events[-1].get("final") is True
        assert all(e["type"] == "chunk" for e in events[1:-1])
        times = [e["t_ms"] for e in events]
        assert times == sorted(times)


def test_some_streams_complete_and_some_are_cancelled() -> None:
    """Over a minute, streams end both ways: a final chunk, or an `end` with reason cancelled
    (not counting those the stop cancels)."""
    sim = _sim()
    messages = sim.until(START_MS + 60_000)
    finals = sum(1 for m in messages if m.payload.get("final"))
    cancels = [m.payload for m in messages if m.payload["type"] == "end"]
    assert finals > 10
    assert len(cancels) > 2
    assert {c["reason"] for c in cancels} == {"cancelled"}


def test_stop_ends_every_open_stream_then_nothing_more() -> None:
    """`stop` cancels the streams still being generated; the simulation is then over."""
    sim = _sim()
    messages = _run(sim, 10)
    for events in _by_stream(messages).values():
        assert events[-1]["type"] == "end" or events[-1].get("final")
    assert sim.next_t_ms() is None
    assert sim.until(START_MS + 100_000) == []


def test_about_streams_concurrent_streams_per_device() -> None:
    """A slot starts its next stream only after the previous one played out or was cancelled,
    so a device never has more than `streams` streams being played or generated."""
    streams = 3
    sim = _sim(streams=streams, devices=1)
    open_until: dict[str, float] = {}
    play_start: dict[str, float] = {}
    most = 0
    for message in _run(sim, 120):
        event = message.payload
        t = event["t_ms"]
        if event["type"] == "start":
            open_until[event["stream"]] = float("inf")
        elif event["type"] == "end":
            open_until[event["stream"]] = t
        elif event.get("play_start_ms") is not None:
            play_start[event["stream"]] = event["play_start_ms"]
        elif event.get("final"):
            open_until[event["stream"]] = play_start[event["stream"]] + event["audio_total_ms"]
        most = max(most, sum(1 for until in open_until.values() if until > t))
    assert most == streams


def test_stalls_add_half_a_second_to_three() -> None:
    """With stall rate 1 every chunk waits 0.5–3 s more than its generation time."""
    for events in _by_stream(_run(_sim(stall_rate=1.0), 60)).values():
        chunks = [e for e in events if e["type"] == "chunk"]
        for before, chunk in itertools.pairwise(chunks):
            gap = chunk["t_ms"] - before["t_ms"]
            assert 500 <= gap - chunk["audio_ms"] * 0.1 * (1 - JITTER) <= 3000 + 30


def test_payloads_are_valid_events() -> None:
    """Every payload passes edgemon's own wire validation, alone and as a batch."""
    payloads = [m.payload for m in _run(_sim(stall_rate=0.1), 30)]
    for payload in payloads:
        decoded = decode_events(json.dumps(payload).encode(), max_bytes=2**18, max_batch=1000)
        assert not isinstance(decoded, Problem)
        assert not any(isinstance(item, Problem) for item in decoded)
    batch = decode_events(json.dumps(payloads[:500]).encode(), max_bytes=2**20, max_batch=1000)
    assert not isinstance(batch, Problem)
    assert not any(isinstance(item, Problem) for item in batch)


def test_engine_objects_are_valid_qwen3_tts_on_jetson() -> None:
    """Each device's engine object decodes: jetson class, 114688 bytes per token, admission ok."""
    objects = _sim(devices=2).engine_objects()
    assert set(objects) == {"sim-0", "sim-1"}
    for obj in objects.values():
        info = decode_engine(json.loads(json.dumps(obj)))
        assert isinstance(info, TtsEngineInfo)
        assert info.hardware_class == "jetson"
        assert info.margin == 80.0
        assert info.kv_error is None
        assert info.kv is not None
        assert info.kv.bytes_per_token == 114_688
        assert info.kv.max_seqs_without_preemption == 9
        assert info.kv.admission_ok is True


def test_rtf_0_1_without_stalls_never_underruns_in_edgemon() -> None:
    """Run through edgemon's engine (replay), two minutes of 2 × 4 streams at RTF 0.1 with no
    stalls have streams, chunks, both endings and not a single underrun."""
    summary, lines = _replay_summary(_sim(devices=2, streams=4, rtf=0.1), 120)
    assert summary["rejected"] == 0
    assert summary["streams"] > 50
    assert summary["underruns"] == 0
    reasons = {line["reason"] for line in lines if line["kind"] == "stream_end"}
    assert reasons == {"completed", "cancelled"}


def test_healthy_devices_are_never_throttled() -> None:
    """A healthy device (RTF 0.15, the demo's, no stalls) never throttles in edgemon: its
    player prebuffers past the margin, so no stream starts at risk (with a 40 ms cushion,
    under the 80 ms margin, every stream start throttled the device for nothing)."""
    summary, _ = _replay_summary(_sim(devices=2, streams=4, rtf=0.15), 120)
    assert summary["streams"] > 50
    assert summary["underruns"] == 0
    assert summary["throttle_engagements"] == 0


def test_rtf_1_2_underruns_often_in_edgemon() -> None:
    """At RTF 1.2 generation is slower than playback: edgemon counts underruns in most streams."""
    summary, lines = _replay_summary(_sim(devices=2, streams=4, rtf=1.2), 120)
    assert summary["rejected"] == 0
    ends = [line for line in lines if line["kind"] == "stream_end"]
    assert summary["underruns"] > summary["streams"]
    assert sum(1 for end in ends if end["underruns"]) > len(ends) / 2


def test_rtf_per_device() -> None:
    """A sequence of RTFs applies one per device: only the slow device underruns."""
    _, lines = _replay_summary(_sim(devices=2, streams=2, rtf=[0.1, 1.2]), 60)
    underruns = {line["device"] for line in lines if line["kind"] == "underrun"}
    assert underruns == {"sim-1"}


def test_stalls_cause_underruns_at_rtf_0_1() -> None:
    """Stalls of 0.5–3 s outlast the buffer of some streams even at RTF 0.1."""
    summary, _ = _replay_summary(_sim(devices=2, streams=4, stall_rate=0.1), 120)
    assert summary["underruns"] > 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"devices": 0}, "devices"),
        ({"streams": 0}, "streams"),
        ({"rtf": 0.0}, "rtf"),
        ({"rtf": float("nan")}, "rtf"),
        ({"rtf": [0.1]}, "RTF values"),
        ({"stall_rate": 1.5}, "stall_rate"),
    ],
)
def test_bad_parameters_are_value_errors(kwargs: dict[str, Any], message: str) -> None:
    """Impossible parameters raise ValueError naming the parameter."""
    with pytest.raises(ValueError, match=message):
        _sim(**kwargs)


@settings(max_examples=examples(30), deadline=None)
@given(
    seed=st.integers(0, 2**32),
    devices=st.integers(1, 3),
    streams=st.integers(1, 4),
    rtf=st.floats(0.05, 2.0),
    stall_rate=st.floats(0.0, 1.0),
    seconds=st.floats(0.1, 30.0),
)
def test_any_run_is_ordered_and_well_formed(
    seed: int, devices: int, streams: int, rtf: float, stall_rate: float, seconds: float
) -> None:
    """Whatever the parameters: time order, seq from 0 by 1 per stream, nothing after the end."""
    sim = _sim(seed=seed, devices=devices, streams=streams, rtf=rtf, stall_rate=stall_rate)
    messages = _run(sim, seconds)
    times = [m.t_ms for m in messages]
    assert times == sorted(times)
    for events in _by_stream(messages).values():
        assert events[0]["type"] == "start"
        seqs = [e["seq"] for e in events if e["type"] == "chunk"]
        assert seqs == list(range(len(seqs)))
        finished = [i for i, e in enumerate(events) if e["type"] == "end" or e.get("final")]
        assert finished == [len(events) - 1]
