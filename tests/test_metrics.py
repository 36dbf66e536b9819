"""The metrics of docs/runbook.md: a Monitor fed in-process, scraped and parsed as Prometheus would.

Every device here runs `OFFSET` ms behind edgemon's wall clock, and each message is received
at wall time `t + OFFSET`, so the estimated offset is exactly `OFFSET` and the device's clock
at a scrape is `wall − OFFSET`. Values are hand-computed from semantics.md (margin 80, hysteresis
20, min-on 250 ms unless a test says otherwise).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from edgemon.adapters.metrics import ConnectionState, build_registry
from edgemon.engine import EngineConfig, Limits, SlackPolicy, SloPolicy
from edgemon.monitor import Monitor

if TYPE_CHECKING:
    from edgemon.engine.outputs import Output

OFFSET = 5_000.0
#: Underruns confirmed at once: what edgemon knows is the record (docs/semantics.md off).
NO_LATENESS = EngineConfig(slack=SlackPolicy(allowed_lateness_ms=0))
D = 100_000.0  # device-clock origin of every scenario


def chunk(stream: str, t: float, seq: int, audio: float, **extra: Any) -> dict[str, Any]:
    return {"type": "chunk", "stream": stream, "t_ms": t, "seq": seq, "audio_ms": audio} | extra


def start(stream: str, t: float, **extra: Any) -> dict[str, Any]:
    return {"type": "start", "stream": stream, "t_ms": t} | extra


def end(stream: str, t: float, reason: str) -> dict[str, Any]:
    return {"type": "end", "stream": stream, "t_ms": t, "reason": reason}


class Rig:
    """A Monitor driven like the daemon drives it, a wall clock the test sets, and a scraper."""

    def __init__(self, *, per_stream_series: int = 20, config: EngineConfig | None = None) -> None:
        self.wall_ms = D + OFFSET
        self.monitor = Monitor(config or EngineConfig())
        self.connection = ConnectionState()
        self.registry = build_registry(
            self.monitor,
            wall_clock=lambda: self.wall_ms,
            connection=self.connection,
            per_stream_series=per_stream_series,
            version="1.2.3",
        )
        self.out: list[Output] = []

    def receive(self, topic: str, payload: bytes, t: float) -> None:
        """Take a raw message at device time `t` (wall `t + OFFSET`), then its timers."""
        self.wall_ms = t + OFFSET
        self.monitor.handle(topic, payload, self.wall_ms, self.out)

    def send(self, t: float, *events: dict[str, Any], device: str = "d1") -> None:
        """One message (a batch when several events) from `device` at device time `t`."""
        body: object = events[0] if len(events) == 1 else list(events)
        self.receive(f"edgemon/v1/{device}/events", json.dumps(body).encode(), t)

    def advance(self, t: float) -> None:
        """Let the daemon's timer run up to device time `t`."""
        self.wall_ms = t + OFFSET
        self.monitor.advance(self.wall_ms, self.out)

    def at(self, t: float) -> None:
        """Only the wall clock moves (to device time `t`): no engine call at all."""
        self.wall_ms = t + OFFSET

    def scrape(self) -> Scrape:
        return Scrape(generate_latest(self.registry).decode())


class Scrape:
    """One parsed exposition: sample values by name and labels."""

    def __init__(self, text: str) -> None:
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        self.samples = {
            (s.name, frozenset(s.labels.items())): s.value
            for family in self.families.values()
            for s in family.samples
        }

    def get(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, frozenset(labels.items())))

    def names(self) -> set[str]:
        return {name for name, _ in self.samples}

    def labels(self, name: str, key: str) -> set[str]:
        return {dict(ls)[key] for sample, ls in self.samples if sample == name}


def three_chunks(rig: Rig) -> None:
    """s1: start at D; chunks at D+100/200/300 of 400/400/300 ms, each with eta 100.

    Player start D+100, B = 1100 ms: the buffer empties at D+1200. After the last chunk
    the next is expected at D+400.
    """
    rig.send(D, start("s1", D))
    rig.send(D + 100, chunk("s1", D + 100, 0, 400, eta_ms=100))
    rig.send(D + 200, chunk("s1", D + 200, 1, 400, eta_ms=100))
    rig.send(D + 300, chunk("s1", D + 300, 2, 300, eta_ms=100))


def test_counters_and_histograms_after_chunks() -> None:
    """Chunks, audio, starts and the three histograms, in seconds, with `le` bounds in seconds."""
    rig = Rig()
    three_chunks(rig)
    m = rig.scrape()
    assert m.get("edgemon_chunks_total", device="d1") == 3
    assert m.get("edgemon_audio_seconds_total", device="d1") == pytest.approx(1.1)
    assert m.get("edgemon_streams_started_total", device="d1") == 1
    assert m.get("edgemon_streams_active", device="d1") == 1
    # Time to first audio: 100 ms, counted in the inclusive le=0.1 bucket.
    assert m.get("edgemon_time_to_first_audio_seconds_bucket", device="d1", le="0.075") == 0
    assert m.get("edgemon_time_to_first_audio_seconds_bucket", device="d1", le="0.1") == 1
    assert m.get("edgemon_time_to_first_audio_seconds_count", device="d1") == 1
    assert m.get("edgemon_time_to_first_audio_seconds_sum", device="d1") == pytest.approx(0.1)
    # Two gaps of 100 ms.
    assert m.get("edgemon_chunk_gap_seconds_bucket", device="d1", le="0.05") == 0
    assert m.get("edgemon_chunk_gap_seconds_bucket", device="d1", le="0.1") == 2
    assert m.get("edgemon_chunk_gap_seconds_bucket", device="d1", le="+Inf") == 2
    assert m.get("edgemon_chunk_gap_seconds_sum", device="d1") == pytest.approx(0.2)
    # Slack before the 2nd and 3rd chunks: 400 − 100 = 300, 800 − 200 = 600 ms.
    slack = "edgemon_slack_at_arrival_seconds_bucket"
    assert m.get(slack, device="d1", le="-1.0") == 0
    assert m.get(slack, device="d1", le="0.3") == 1
    assert m.get(slack, device="d1", le="0.5") == 1
    assert m.get(slack, device="d1", le="0.75") == 2
    assert m.get(slack, device="d1", le="+Inf") == 2
    # Negative bounds: no _sum, hence no _count (OpenMetrics); +Inf is the count.
    assert m.get("edgemon_slack_at_arrival_seconds_sum", device="d1") is None
    assert m.families["edgemon_slack_at_arrival_seconds"].type == "histogram"


def test_time_dependent_gauges_follow_the_clock_between_scrapes() -> None:
    """Slack, headroom and at-risk are computed at scrape time: only the wall clock moves here."""
    rig = Rig()
    three_chunks(rig)
    m = rig.scrape()  # at D+300: slack 1100 − 200 = 900, ETA 100, headroom 800
    assert m.get("edgemon_playback_slack_min_seconds", device="d1") == pytest.approx(0.9)
    assert m.get("edgemon_headroom_min_seconds", device="d1") == pytest.approx(0.8)
    assert m.get("edgemon_streams_at_risk", device="d1") == 0

    rig.at(D + 700)  # slack 500, the next chunk is overdue: ETA 0, headroom 500
    m = rig.scrape()
    assert m.get("edgemon_playback_slack_min_seconds", device="d1") == pytest.approx(0.5)
    assert m.get("edgemon_headroom_min_seconds", device="d1") == pytest.approx(0.5)
    assert m.get("edgemon_streams_at_risk", device="d1") == 0

    rig.at(D + 1150)  # headroom 50 < margin 80
    m = rig.scrape()
    assert m.get("edgemon_headroom_min_seconds", device="d1") == pytest.approx(0.05)
    assert m.get("edgemon_streams_at_risk", device="d1") == 1
    assert m.get("edgemon_margin_seconds", device="d1") == pytest.approx(0.08)


def test_underrun_throttle_and_their_durations() -> None:
    """An underrun is counted once the timer passes it (no wait for late chunks here);
    throttle and underrun seconds grow while ON, as far as the engine has reached.

    At risk from D+1120 (B + S − t < 80): throttle ON then. The buffer empties at D+1200:
    underrun. Nothing happens between D+1200 and D+1300, so the engine has reached D+1200
    (the ongoing periods count up to there); a message at D+1300 brings it to D+1300. A chunk
    of 500 ms at D+1400 ends the underrun (200 ms) and leaves headroom 1600 − 1300 − 100 =
    200 ≥ 100: throttle OFF at D+1400 after 280 ms.
    """
    rig = Rig(config=NO_LATENESS)
    three_chunks(rig)
    rig.advance(D + 1300)
    m = rig.scrape()
    assert m.get("edgemon_underruns_total", device="d1") == 1
    assert m.get("edgemon_underrun_seconds_total", device="d1") == 0  # reached D+1200
    assert m.get("edgemon_throttle_active", device="d1") == 1
    assert m.get("edgemon_throttle_engagements_total", device="d1") == 1
    assert m.get("edgemon_throttle_seconds_total", device="d1") == pytest.approx(0.08)
    assert m.get("edgemon_playback_slack_min_seconds", device="d1") == pytest.approx(-0.1)

    rig.send(D + 1300, start("s2", D + 1300))  # the engine reaches D+1300
    m = rig.scrape()
    assert m.get("edgemon_throttle_seconds_total", device="d1") == pytest.approx(0.18)
    assert m.get("edgemon_underrun_seconds_total", device="d1") == pytest.approx(0.1)  # ongoing
    rig.at(D + 1350)  # no message, no timer: nothing more is settled
    m = rig.scrape()
    assert m.get("edgemon_throttle_seconds_total", device="d1") == pytest.approx(0.18)
    assert m.get("edgemon_underrun_seconds_total", device="d1") == pytest.approx(0.1)

    rig.send(D + 1400, chunk("s1", D + 1400, 3, 500, eta_ms=100))
    m = rig.scrape()
    assert m.get("edgemon_underruns_total", device="d1") == 1
    assert m.get("edgemon_underrun_seconds_total", device="d1") == pytest.approx(0.2)
    assert m.get("edgemon_throttle_active", device="d1") == 0
    assert m.get("edgemon_throttle_seconds_total", device="d1") == pytest.approx(0.28)
    rig.at(D + 1450)
    assert rig.scrape().get("edgemon_throttle_seconds_total", device="d1") == pytest.approx(0.28)


def test_throttle_seconds_never_step_back_when_the_engine_settles_late() -> None:
    """A scrape between the OFF instant and the timer that applies it counts the ON period
    only as far as the engine has reached, so the counter never goes down once the timer
    runs (a decrease reads as a reset), and ends on the exact 250 ms. (The case that once
    needed a high-water mark in the exporter: the scrape counted up to its own `now`.)

    A chunk of 100 ms at D with ETA 100 leaves headroom 0: ON at D. A chunk of 2 s at D+50
    makes it safe, but the 250 ms minimum on-time holds the throttle: OFF at D+250, applied
    by a timer the daemon has not run yet when the scrape at D+300 comes.
    """
    rig = Rig()
    rig.send(D, chunk("s1", D, 0, 100, eta_ms=100))
    rig.send(D + 50, chunk("s1", D + 50, 1, 2000, eta_ms=100))
    rig.at(D + 300)  # the daemon's timer has not run yet
    before = rig.scrape().get("edgemon_throttle_seconds_total", device="d1")
    assert before == pytest.approx(0.05)  # reached D+50
    rig.advance(D + 300)
    m = rig.scrape()
    assert m.get("edgemon_throttle_active", device="d1") == 0
    assert rig.monitor.engine.device("d1").stats.throttle_ms == 250  # type: ignore[union-attr]
    after = m.get("edgemon_throttle_seconds_total", device="d1")
    assert after == pytest.approx(0.25)
    assert before is not None
    assert after is not None
    assert after >= before


def test_underrun_seconds_never_step_back_when_a_late_chunk_ends_the_underrun() -> None:
    """An ongoing confirmed underrun counts only up to the lateness horizon (allowed lateness
    behind the instant the engine has reached): a chunk later than the lateness that ends
    it at an earlier `t_ms` cannot take back what a scrape showed.

    s1 runs dry at D+1200 (confirmed at D+2200 for want of late chunks). A message of s2 at
    D+2400 brings the engine there: horizon D+1400, so 200 ms are counted. A chunk of s1
    with `t_ms` D+1300 then arrives (1.1 s late): by its own time the underrun lasted 100 ms,
    but the 200 ms were settled, so the underrun ends at the horizon: 200 ms, not less.
    """
    rig = Rig()
    three_chunks(rig)
    rig.advance(D + 2200)
    rig.send(D + 2400, start("s2", D + 2400))
    before = rig.scrape().get("edgemon_underrun_seconds_total", device="d1")
    assert before == pytest.approx(0.2)
    rig.send(D + 2450, chunk("s1", D + 1300, 3, 5_000, eta_ms=100))
    after = rig.scrape().get("edgemon_underrun_seconds_total", device="d1")
    assert after == pytest.approx(0.2)
    assert rig.monitor.engine.device("d1").stats.underrun_ms == 200  # type: ignore[union-attr]


def test_per_stream_series_are_capped_lowest_headroom_first_and_vanish_with_the_stream() -> None:
    """With a cap of 2 and three live streams, the two lowest headroom are exported."""
    rig = Rig(per_stream_series=2)
    t = D + 100
    rig.send(t, *(chunk(s, t, 0, audio, eta_ms=100) for s, audio in [("a", 1000), ("b", 2000)]))
    rig.send(t, chunk("c", t, 0, 500, eta_ms=100))
    m = rig.scrape()  # headroom = audio − 100
    assert m.labels("edgemon_stream_headroom_seconds", "stream") == {"a", "c"}
    assert m.get("edgemon_stream_headroom_seconds", device="d1", stream="c") == pytest.approx(0.4)
    assert m.get("edgemon_stream_playback_slack_seconds", device="d1", stream="a") == 1.0
    assert m.get("edgemon_headroom_min_seconds", device="d1") == pytest.approx(0.4)

    rig.send(t + 10, end("c", t + 10, "cancelled"))
    m = rig.scrape()  # at t+10: a has 1000 − 10 − 90 = 900 ms
    assert m.labels("edgemon_stream_headroom_seconds", "stream") == {"a", "b"}
    assert m.get("edgemon_stream_headroom_seconds", device="d1", stream="a") == pytest.approx(0.9)
    assert m.get("edgemon_stream_headroom_seconds", device="d1", stream="c") is None


def test_per_stream_series_off_and_no_minimum_without_live_streams() -> None:
    """Cap 0 exports no per-stream family; a waiting stream has no slack or headroom minimum."""
    rig = Rig(per_stream_series=0)
    rig.send(D, start("w", D))
    m = rig.scrape()
    assert "edgemon_stream_headroom_seconds" not in m.families
    assert "edgemon_stream_playback_slack_seconds" not in m.families
    assert m.get("edgemon_streams_active", device="d1") == 1
    assert m.get("edgemon_streams_at_risk", device="d1") == 0
    assert m.get("edgemon_headroom_min_seconds", device="d1") is None
    assert m.get("edgemon_playback_slack_min_seconds", device="d1") is None


def test_finished_reasons_are_folded_and_all_present() -> None:
    """End reasons fold to completed/cancelled/error/other; drains complete, idle ones expire."""
    rig = Rig()
    rig.send(D, *(start(s, D) for s in ["s1", "s2", "s3", "s4", "s5", "s6"]))
    rig.send(D + 10, end("s1", D + 10, "cancelled"), end("s2", D + 10, "error"))
    rig.send(D + 10, end("s3", D + 10, "client went away"), end("s4", D + 10, "completed"))
    m = rig.scrape()
    finished = "edgemon_streams_finished_total"
    assert m.get(finished, device="d1", reason="expired") == 0  # present before any
    rig.send(D + 20, chunk("s5", D + 20, 0, 100, final=True))  # drains until D+120
    rig.advance(D + 200)
    rig.advance(D + 40_000)  # s6 waited since D: expired at D + 30000
    m = rig.scrape()
    assert {r: m.get(finished, device="d1", reason=r) for r in m.labels(finished, "reason")} == {
        "cancelled": 1,
        "completed": 2,
        "error": 1,
        "expired": 1,
        "other": 1,
    }
    assert m.get("edgemon_streams_active", device="d1") == 0


def test_streams_by_service_level_outcome_and_their_longest_gaps() -> None:
    """Each ended stream counts once under its outcome (every outcome present from the first
    scrape) and, if it played, its longest gap goes into the histogram (in seconds)."""
    rig = Rig(config=EngineConfig(slo=SloPolicy(start_ms=500, gap_ms=100)))
    slo, gaps = "edgemon_streams_slo_total", "edgemon_stream_longest_gap_seconds"
    rig.send(D, start("good", D), start("late", D), start("gappy", D), start("gone", D))
    m = rig.scrape()
    assert {o: m.get(slo, device="d1", outcome=o) for o in m.labels(slo, "outcome")} == {
        "good": 0,
        "late": 0,
        "gappy": 0,
        "unfinished": 0,
    }
    rig.send(D + 100, chunk("good", D + 100, 0, 200, final=True))  # played out at D+300
    rig.send(D + 100, chunk("gappy", D + 100, 0, 200))  # dry at D+300
    rig.send(D + 450, chunk("gappy", D + 450, 1, 100, final=True))  # a 150 ms gap
    rig.send(D + 460, end("gone", D + 460, "cancelled"))  # never played
    rig.send(D + 600, chunk("late", D + 600, 0, 200, final=True))  # 600 ms of silence first
    rig.advance(D + 2_000)
    m = rig.scrape()
    assert {o: m.get(slo, device="d1", outcome=o) for o in m.labels(slo, "outcome")} == {
        "good": 1,
        "late": 1,
        "gappy": 1,
        "unfinished": 1,
    }
    assert m.get(f"{gaps}_count", device="d1") == 3  # not the stream that never played
    assert m.get(f"{gaps}_bucket", device="d1", le="0.0") == 2
    assert m.get(f"{gaps}_bucket", device="d1", le="0.1") == 2
    assert m.get(f"{gaps}_bucket", device="d1", le="0.15") == 3
    assert m.get(f"{gaps}_sum", device="d1") == pytest.approx(0.15)
    assert m.get("edgemon_slo_objective") == 0.99  # the default, daemon-wide


def test_the_slo_objective_follows_a_reload() -> None:
    """`edgemon_slo_objective` is the `[slo] objective` in force, read at each scrape: a
    reconfigured engine (SIGHUP) exports its new objective at once."""
    rig = Rig(config=EngineConfig(slo=SloPolicy(objective=0.995)))
    assert rig.scrape().get("edgemon_slo_objective") == 0.995
    rig.monitor.engine.reconfigure(EngineConfig(slo=SloPolicy(objective=0.9)), rig.wall_ms, [])
    assert rig.scrape().get("edgemon_slo_objective") == 0.9


def test_kv_gauges_once_an_engine_object_is_received() -> None:
    """No kv_* series before an engine object; then the README's kv-budget verdict and the
    engine's margin."""
    rig = Rig()
    rig.send(D, start("s1", D))
    assert not {n for n in rig.scrape().names() if n.startswith("edgemon_kv_")}
    engine = {
        "kv_cache_bytes": 4 * 1024**3,
        "max_num_seqs": 8,
        "max_model_len": 4096,
        "geometry": {"num_layers": 28, "num_kv_heads": 8, "head_dim": 128},
        "dtype": "bfloat16",
        "hardware_class": "x86",
    }
    rig.receive("edgemon/v1/d1/engine", json.dumps(engine).encode(), D + 10)
    m = rig.scrape()
    assert m.get("edgemon_kv_bytes_per_token", device="d1") == 114_688
    # 4 GiB / (4096 × 114688 B) = 9.14…
    assert m.get("edgemon_kv_max_seqs_without_preemption", device="d1") == 9
    assert m.get("edgemon_kv_max_num_seqs", device="d1") == 8
    assert m.get("edgemon_kv_admission_ok", device="d1") == 1
    assert m.get("edgemon_margin_seconds", device="d1") == pytest.approx(0.12)

    del engine["max_num_seqs"]
    rig.receive("edgemon/v1/d2/engine", json.dumps(engine).encode(), D + 20)
    m = rig.scrape()
    assert m.get("edgemon_kv_max_seqs_without_preemption", device="d2") == 9
    assert m.get("edgemon_kv_max_num_seqs", device="d2") is None
    assert m.get("edgemon_kv_admission_ok", device="d2") is None


def test_messages_by_result() -> None:
    """Each event of a batch counts once; a message rejected whole counts once; known at 0.
    (No wait for late chunks: the chunk after the hole is a gap at once.)"""
    rig = Rig(config=NO_LATENESS)
    rig.send(D, chunk("s1", D, 0, 100), chunk("s1", D, 0, 100), chunk("s1", D, 2, 100))
    rig.receive("edgemon/v1/d1/events", b"{not json", D + 1)
    rig.receive("somewhere/else", b"{}", D + 2)
    rig.send(D + 3, {"type": "chunk", "stream": "s1"})
    m = rig.scrape()
    counts = {r: m.get("edgemon_messages_total", result=r) for r in ["accepted", "duplicate"]}
    assert counts == {"accepted": 1, "duplicate": 1}
    assert m.get("edgemon_messages_total", result="gap") == 1
    assert m.get("edgemon_messages_total", result="invalid_json") == 1
    assert m.get("edgemon_messages_total", result="unknown_topic") == 1
    assert m.get("edgemon_messages_total", result="invalid_event") == 1
    assert m.get("edgemon_messages_total", result="oversized") == 0


def test_daemon_wide_series_clock_offset_and_last_event() -> None:
    """Connection state, build info, process metrics, the clock offset and the last message."""
    rig = Rig()
    rig.send(D, start("s1", D))
    rig.connection.connected = True
    rig.connection.reconnects = 2
    m = rig.scrape()
    assert m.get("edgemon_mqtt_connected") == 1
    assert m.get("edgemon_mqtt_reconnects_total") == 2
    assert m.get("edgemon_build_info", version="1.2.3") == 1
    assert "python_info" in m.families
    assert m.get("edgemon_device_clock_offset_seconds", device="d1") == pytest.approx(5.0)
    assert m.get("edgemon_device_last_event_timestamp_seconds", device="d1") == pytest.approx(
        (D + OFFSET) / 1000
    )
    rig.connection.connected = False
    assert rig.scrape().get("edgemon_mqtt_connected") == 0
    # The registry is private: nothing leaked into prometheus_client's global one.
    assert REGISTRY.get_sample_value("edgemon_mqtt_reconnects_total") is None


def test_every_result_the_daemon_counts_is_exported_from_the_start() -> None:
    """`overloaded` and `internal_error` are results the daemon can count like the others:
    a fresh daemon exports them at 0, so an alert on `increase(...)` works from the start."""
    scrape = Rig().scrape()
    for result in ("overloaded", "internal_error", "accepted", "gap"):
        assert scrape.get("edgemon_messages_total", result=result) == 0.0, result


def test_provisional_underruns_count_only_once_confirmed_and_retractions_are_counted() -> None:
    """docs/semantics.md: a provisional underrun counts neither as an underrun nor as underrun time;
    a late chunk that reached the player before it retracts it
    (`edgemon_underruns_retracted_total`); one the device's time passes is counted."""
    rig = Rig()
    three_chunks(rig)  # s1 runs dry at D+1200
    rig.send(D + 300, start("s2", D + 300))
    rig.send(D + 300, chunk("s2", D + 300, 0, 1_000, eta_ms=100))  # runs dry at D+1300
    rig.advance(D + 1350)
    m = rig.scrape()
    assert m.get("edgemon_underruns_total", device="d1") == 0
    assert m.get("edgemon_underrun_seconds_total", device="d1") == 0
    rig.send(D + 1360, chunk("s1", D + 1150, 3, 500, eta_ms=100))  # late: no underrun at 1200
    m = rig.scrape()
    assert m.get("edgemon_underruns_retracted_total", device="d1") == 1
    assert m.get("edgemon_underruns_total", device="d1") == 0
    rig.send(D + 1400, chunk("s1", D + 1400, 4, 500, eta_ms=100))  # the device is past 1300
    m = rig.scrape()
    assert m.get("edgemon_underruns_total", device="d1") == 1
    assert m.get("edgemon_underrun_seconds_total", device="d1") == 0  # horizon D+400
    rig.send(D + 2400, start("s3", D + 2400))  # horizon D+1400: 100 ms of s2 are settled
    m = rig.scrape()
    assert m.get("edgemon_underrun_seconds_total", device="d1") == pytest.approx(0.1)  # ongoing


def test_a_forgotten_device_has_no_series() -> None:
    """reliability.md: once an idle device is forgotten its series vanish from the next scrape."""
    rig = Rig(config=EngineConfig(limits=Limits(device_idle_ms=60_000)))
    rig.send(D, chunk("s1", D, 0, 100, final=True))
    assert rig.scrape().get("edgemon_chunks_total", device="d1") == 1
    rig.advance(D + 60_000)
    assert "d1" not in rig.scrape().labels("edgemon_chunks_total", "device")
