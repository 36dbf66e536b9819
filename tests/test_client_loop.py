"""The loop closed on real parts: a Reporter feeding `edgemon run` (a process) on Mosquitto,
and a ThrottleGate following what that edgemon publishes."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from edgemon.client import AudioFormat, GateState

from processes import T, edgemon_run, poll, samples

if TYPE_CHECKING:
    from pathlib import Path

    from brokers import Broker

pytestmark = pytest.mark.integration


def test_edgemon_counts_exactly_what_the_reporter_sent(
    mosquitto_broker: Broker, tmp_path: Path
) -> None:
    """Three streams reported through the Reporter (PCM bytes with partial frames, audio_ms,
    a final chunk, an end): edgemon counts exactly the chunks sent, the audio they carry, and
    every event as `accepted`, with no rejection of any kind."""
    broker = mosquitto_broker
    with (
        edgemon_run(broker, tmp_path) as http,
        broker.reporter(
            "loop1", "loop1-reporter", merge_chunks=False, audio_format="s16le:24000:1"
        ) as reporter,
    ):
        reporter.start("a", margin_ms=50)
        for _ in range(10):
            reporter.chunk("a", pcm_bytes=4_801, eta_ms=20)  # 100 ms and a byte carried
        reporter.chunk("a", pcm_bytes=4_790, final=True)  # 1,100 ms in all: 52,800 B
        for _ in range(7):
            reporter.chunk("b", audio_ms=40, eta_ms=10)
        reporter.end("b", "cancelled")
        for size in (960, 1_921, 1_919, 3):  # 20 ms, 40 ms (1 B carried), 40 ms, 1 frame
            reporter.chunk("c", pcm_bytes=size, audio_format=AudioFormat.PCM_S16LE_24K_MONO)
        assert reporter.flush(T)
        stats = reporter.stats
        chunks = 11 + 7 + 4
        assert stats.events == stats.sent == chunks + 2
        assert poll(
            lambda: samples(http, "edgemon_chunks_total").get((("device", "loop1"),)) == chunks
        )
        audio = samples(http, "edgemon_audio_seconds_total")[(("device", "loop1"),)]
        results = {
            dict(labels)["result"]: value
            for labels, value in samples(http, "edgemon_messages_total").items()
            if value
        }
    assert audio == pytest.approx((1_100 + 280 + 100 + 1 / 24) / 1000, abs=1e-12)
    assert results == {"accepted": chunks + 2}


def held(state: GateState) -> bool:
    return state.active


def released(state: GateState) -> bool:
    return state.connected and state.throttle is False


def test_gate_follows_edgemon_when_a_stream_runs_dry(
    mosquitto_broker: Broker, tmp_path: Path
) -> None:
    """A stream gets one 1.5 s chunk and nothing more: edgemon's deadline task throttles the
    device when its headroom falls below the margin (1.42 s later), and the gate says hold;
    the stream's end releases it. Three rounds; the throttle object's `t_ms` is the crossing
    instant edgemon computed on the device's clock, exactly the chunk's `t_ms` + 1,420 ms. The
    latency from it to the gate seeing it is printed (with edgemon's clock offset for the
    device, which is part of it), not judged: it is the load of this machine as much as
    edgemon's."""
    broker = mosquitto_broker
    latencies, offsets = [], []
    stamped: list[float] = []

    def stamp() -> float:
        stamped.append(time.time() * 1000.0)
        return stamped[-1]

    with (
        edgemon_run(broker, tmp_path) as http,
        broker.reporter("loop2", "loop2-reporter", clock=stamp) as reporter,
        broker.gate("loop2") as gate,
    ):
        assert gate.wait_until(lambda s: s.connected and s.edgemon_online, T)
        assert not gate.should_throttle_prefills()
        for round_ in range(3):
            stream = f"dry-{round_}"
            reporter.start(stream)
            reporter.chunk(stream, audio_ms=1_500, eta_ms=0)
            chunk_t_ms = stamped[-1]  # the chunk's t_ms, as the Reporter stamped it
            assert gate.wait_until(held, T)
            state = gate.state
            seen_ms = (state.changed_at + time.time() - time.monotonic()) * 1000
            assert state.t_ms is not None
            assert state.streams == (stream,)
            # The crossing instant on the device's clock: 1,500 ms of audio, margin 80.
            assert state.t_ms == pytest.approx(chunk_t_ms + 1_420, abs=1e-6)
            latencies.append(seen_ms - state.t_ms)
            offset = samples(http, "edgemon_device_clock_offset_seconds")[(("device", "loop2"),)]
            offsets.append(offset * 1000)
            assert gate.should_throttle_prefills()
            reporter.end(stream)
            assert gate.wait_until(released, T)
            assert not gate.should_throttle_prefills()
        stats = gate.stats
    # edgemon acts at device time t_ms, i.e. at wall time t_ms + its clock offset estimate
    # for the device (semantics.md: the smallest transit seen, here the Reporter's flush delay too).
    print(
        "throttle t_ms -> gate saw it, ms:",
        ", ".join(f"{ms:.1f}" for ms in latencies),
        "| of which edgemon's device-clock offset, ms:",
        ", ".join(f"{ms:.1f}" for ms in offsets),
    )
    assert stats.holds == 3
    assert stats.max_hold_releases == 0
