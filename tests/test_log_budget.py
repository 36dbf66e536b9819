"""The daemon's log stays within its budget in every state: `LogBudget` and the
per-device summaries (`DeviceDigest`) on an injected clock, then an underrun storm through a
real Mosquitto into a real daemon."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import aiomqtt
import pytest
import structlog
from structlog.testing import capture_logs

from edgemon.daemon import Daemon
from edgemon.daemon.digest import BEGAN, CONFIRMED, KINDS, RETRACTED, DeviceDigest
from edgemon.daemon.logs import BURST, LINES_PER_S, LogBudget
from edgemon.settings import HttpSettings, MqttSettings, Settings

from daemons import logged, running

if TYPE_CHECKING:
    from collections.abc import MutableMapping

    from structlog.typing import EventDict

    from brokers import Broker


def _within_budget(stamps_s: list[float], slack: int = 0) -> bool:
    """Whether lines written at `stamps_s` (seconds, in order) keep to the budget: in every
    span, at most `BURST` lines plus `LINES_PER_S` per second of the span (`slack` more)."""
    return all(
        j - i + 1 <= BURST + LINES_PER_S * (stamps_s[j] - stamps_s[i]) + slack
        for i in range(len(stamps_s))
        for j in range(i, len(stamps_s))
    )


def test_the_budget_bounds_every_line_and_counts_what_it_held_back() -> None:
    """5 s of 2,000 info lines a second and a warning every 500 ms: within the budget in
    every span of time; every warning is written although info lines take their share
    first; lines written plus those counted as suppressed are exactly all lines asked for;
    debug lines below the level are neither written nor counted."""
    now = [0.0]

    def stamp(_logger: object, _method: str, line: EventDict) -> EventDict:
        line["now_s"] = now[0] / 1000.0
        return line

    asked: Counter[str] = Counter()
    with capture_logs(processors=[stamp]) as lines:
        budget = LogBudget(structlog.get_logger(), now_ms=lambda: now[0], level="info")
        for n in range(10_000):
            budget.info(f"transition_{n % 3}", n=n)
            budget.debug("detail", n=n)
            asked[f"transition_{n % 3}"] += 1
            if n % 1000 == 999:
                budget.warning("important", n=n)
                asked["important"] += 1
            now[0] += 0.5
        now[0] += 1000.0
        budget.flush()
    assert _within_budget([line["now_s"] for line in lines])
    assert len(lines) >= LINES_PER_S * 5
    written = Counter(line["event"] for line in lines)
    assert written["important"] == asked["important"]
    assert "detail" not in written
    suppressed: Counter[str] = Counter()
    summaries = [line for line in lines if line["event"] == "log_lines_suppressed"]
    assert 5 <= len(summaries) <= 7  # one a second at most, the last one flushed
    for summary in summaries:
        assert sum(summary["suppressed"].values()) == summary["total"]
        suppressed.update(summary["suppressed"])
    assert "detail" not in suppressed
    del written["log_lines_suppressed"]
    assert written + suppressed == asked


def test_debug_lines_are_written_when_asked_for_and_budgeted_too(
    captured_logs: list[MutableMapping[str, Any]],
) -> None:
    """At level debug the detail is written, within the same budget, and leaves room for
    lines at info."""
    now = [0.0]
    budget = LogBudget(structlog.get_logger(), now_ms=lambda: now[0], level="debug")
    for n in range(100):
        budget.debug("detail", n=n)
    budget.info("config_reloaded")
    now[0] += 1000.0
    budget.flush()
    written = [line["event"] for line in captured_logs]
    assert 0 < written.count("detail") < BURST
    assert "config_reloaded" in written
    summaries = logged(captured_logs, "log_lines_suppressed")
    assert sum(summary["total"] for summary in summaries) == 100 - written.count("detail")


def test_a_device_summary_comes_at_most_every_5_s_with_exact_counts(
    captured_logs: list[MutableMapping[str, Any]],
) -> None:
    """20 s of transitions on 5 devices, flushed every second as the daemon does: each
    device's summaries are at least 5 s apart, at most 2 come per flush, the counts add up
    to exactly what was noted, by kind, and the worst stream is the one with the most
    confirmed underruns."""
    now = [0.0]
    digest = DeviceDigest(
        LogBudget(structlog.get_logger(), now_ms=lambda: now[0], burst=1000),
        now_ms=lambda: now[0],
    )
    noted: Counter[tuple[str, str]] = Counter()
    flushed: list[tuple[float, MutableMapping[str, Any]]] = []
    for ms in range(0, 20_000, 10):
        now[0] = float(ms)
        for d in range(5):
            digest.count(f"d{d}", "calm", BEGAN)
            digest.count(f"d{d}", "calm", RETRACTED)
            noted[f"d{d}", KINDS[BEGAN]] += 1
            noted[f"d{d}", KINDS[RETRACTED]] += 1
            if ms % 50 == 0:
                digest.count(f"d{d}", "bad", BEGAN)
                digest.count(f"d{d}", "bad", CONFIRMED)
                noted[f"d{d}", KINDS[BEGAN]] += 1
                noted[f"d{d}", KINDS[CONFIRMED]] += 1
        if ms % 1000 == 0:
            before = len(captured_logs)
            digest.flush()
            assert len(captured_logs) - before <= 2
            flushed.extend((now[0], line) for line in captured_logs[before:])
    for ms in range(20_000, 40_000, 1000):  # the storm is over: what was counted comes out
        now[0] = float(ms)
        before = len(captured_logs)
        digest.flush()
        flushed.extend((now[0], line) for line in captured_logs[before:])
    assert {line["device"] for _, line in flushed} == {f"d{d}" for d in range(5)}
    summed: Counter[tuple[str, str]] = Counter()
    last: dict[str, float] = {}
    for at, line in flushed:
        device = line["device"]
        assert line["event"] == "device_summary"
        assert at - last.get(device, -5000.0) >= 5000.0
        assert line["interval_s"] >= 5.0
        assert line["worst_stream"] == "bad"
        last[device] = at
        for kind in KINDS:
            summed[device, kind] += line[kind]
    assert summed == noted


def test_a_stop_summarises_what_is_left(captured_logs: list[MutableMapping[str, Any]]) -> None:
    """Counts younger than 5 s wait for their interval, and `close` (a clean stop) writes
    them all, whatever their age and however many devices."""
    now = [0.0]
    budget = LogBudget(structlog.get_logger(), now_ms=lambda: now[0], burst=1000)
    digest = DeviceDigest(budget, now_ms=lambda: now[0])
    for d in range(5):
        digest.count(f"d{d}", "s", CONFIRMED)
    now[0] = 1000.0
    digest.flush()
    assert logged(captured_logs, "device_summary") == []
    digest.close()
    summaries = logged(captured_logs, "device_summary")
    assert [(s["device"], s["underruns_confirmed"]) for s in summaries] == [
        (f"d{d}", 1) for d in range(5)
    ]


#: The storm lasts until every device has had its summary (about 7 s), or this long.
STORM_S = 30.0


def _settings(broker: Broker) -> Settings:
    return Settings(
        mqtt=MqttSettings(
            url=broker.url, client_id=broker.client_id("edgemon-storm"), topic_prefix=broker.prefix
        ),
        http=HttpSettings(listen="127.0.0.1:0"),
    )


def _chunks(streams: int, seq: int, audio_ms: float) -> bytes:
    t_ms = time.time() * 1000.0
    return json.dumps([
        {"type": "chunk", "stream": f"s{i}", "t_ms": t_ms, "seq": seq, "audio_ms": audio_ms,
         "eta_ms": audio_ms}
        for i in range(streams)
    ]).encode()  # fmt: skip


@pytest.mark.integration
@pytest.mark.asyncio
async def test_an_underrun_storm_writes_no_more_than_the_budget(
    mosquitto_broker: Broker, captured_logs: list[MutableMapping[str, Any]]
) -> None:
    """4 devices × 16 streams, each stream 25 ms of audio every 25 ms: every chunk leaves its
    buffer empty as the next one is due, so underruns begin, are confirmed or retracted, and
    end, thousands of them, and every message is accepted. While it lasts, until every device
    has had its summary: the lines keep to the budget (10 a second, 20 at once) in every span
    of time, no per-stream line at info, each device's summaries (the last ones at the stop)
    counting its transitions, every confirmed underrun exactly once.
    (A line per transition would be about 2,600 a second.)"""
    broker = mosquitto_broker
    daemon = Daemon(_settings(broker), environ={})
    devices = [f"storm{d}" for d in range(4)]
    async with (
        running(daemon, logs=captured_logs),
        aiomqtt.Client(
            broker.host, broker.port, identifier=broker.client_id("storm-players")
        ) as players,
    ):
        began = time.monotonic()
        sent = rounds = 0
        while time.monotonic() - began < STORM_S and {
            s["device"] for s in logged(captured_logs, "device_summary")
        } != set(devices):
            for device in devices:
                payload = _chunks(16, rounds, 25.0)
                await players.publish(broker.topic(device, "events"), payload, qos=1)
                sent += 1
            rounds += 1
            # The players' pace (a chunk every 25 ms on average), not a wait for a result.
            await asyncio.sleep(max(0.0, began + 0.025 * rounds - time.monotonic()))
        ended = time.monotonic()
        async with asyncio.timeout(30):
            while sum(daemon.monitor.results.values()) < 16 * sent:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
    results = daemon.monitor.results
    assert results == {"accepted": 16 * sent}, results
    during = [line for line in captured_logs if began <= line["monotonic_s"] <= ended]
    stamps = [line["monotonic_s"] for line in during]
    assert _within_budget(stamps, slack=1), Counter(line["event"] for line in during)
    assert not {"underrun_began", "underrun_confirmed", "underrun_retracted"} & {
        line["event"] for line in captured_logs
    }
    summaries = logged(captured_logs, "device_summary")
    assert {s["device"] for s in summaries} == set(devices)
    transitions = sum(s["underruns_began"] + s["underruns_confirmed"] for s in summaries)
    assert transitions >= 1000
    for line in captured_logs:
        if line["event"] == "device_summary":
            assert line["interval_s"] >= 5.0 or line["monotonic_s"] > ended  # at the stop
            assert line["worst_stream"] in {f"s{i}" for i in range(16)}
    # The stop summarised what was left: every confirmed underrun was counted once.
    confirmed = sum(device.stats.underruns for device in daemon.monitor.engine.devices())
    assert sum(s["underruns_confirmed"] for s in summaries) == confirmed > 0
