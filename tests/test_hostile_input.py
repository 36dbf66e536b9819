"""Hostile input (docs/reliability.md): through the real broker into the daemon, and in-process with
Hypothesis. No payload, topic or sequence of messages may crash, stall or slow the daemon
for others; each rejected message or event is counted under `edgemon_messages_total{result}`
and logged at most once per second per (device, reason) with a count of what was suppressed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgemon.adapters.metrics import KNOWN_RESULTS
from edgemon.daemon import Daemon
from edgemon.engine.config import EngineConfig, Limits, SlackPolicy
from edgemon.engine.outputs import StreamEnded, ThrottleChanged, UnderrunBegan
from edgemon.engine.stream import Phase
from edgemon.monitor import Monitor

from clients import device, now_ms, scrape, settings_for, watching
from daemons import PausableClock, logged, rejections, running
from properties import examples
from scrapes import sample, series_names

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, MutableMapping

    from edgemon.engine.device import Device
    from edgemon.engine.outputs import Output

    from brokers import Broker
    from clients import Watcher

P = "edgemon/v1"
YEAR_MS = 365 * 86_400_000.0
#: Results that are not "applied": every one of them comes from hostile input here.
REJECTIONS = (
    "duplicate",
    "after_final",
    "unknown_stream",
    "invalid_json",
    "invalid_event",
    "oversized",
    "unknown_topic",
    "device_limit",
    "stream_limit",
    "internal_error",
)


# ------------------------------------------------------------------ helpers
def ev(kind: str, stream: str, t: float | None = None, **extra: Any) -> dict[str, Any]:
    """An event at wall time now (or `t`)."""
    return {"type": kind, "stream": stream, "t_ms": now_ms() if t is None else t} | extra


def chunk(stream: str, seq: int, audio: float, **extra: Any) -> dict[str, Any]:
    """A chunk at wall time now."""
    return ev("chunk", stream, seq=seq, audio_ms=audio) | extra


def js(value: Any) -> bytes:
    return json.dumps(value).encode()


def nested(depth: int, open_: bytes = b"[", close: bytes = b"]") -> bytes:
    return open_ * depth + close * depth


@dataclass
class Case:
    """Messages from one hostile device and what the daemon must count for them."""

    name: str
    messages: list[tuple[str, bytes]]
    expect: dict[str, int]
    #: At least this many streams started plus chunks applied on its device (checked there,
    #: since the legit device's events are `accepted` too); 0: it must hold no stream.
    applied: int = 0
    device: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def events(prefix: str, dev: str, *payloads: bytes) -> list[tuple[str, bytes]]:
    return [(f"{prefix}/{dev}/events", p) for p in payloads]


def engine(prefix: str, dev: str, *payloads: bytes) -> list[tuple[str, bytes]]:
    return [(f"{prefix}/{dev}/engine", p) for p in payloads]


def cases(prefix: str) -> list[Case]:
    """Every kind of hostile input under the topic prefix `prefix`, one device each (built at
    send time)."""
    good = chunk("ok", 0, 100)
    oversized = b'{"type":"start","stream":"x","t_ms":1,"pad":"' + b"x" * 270_000 + b'"}'
    return [
        Case(
            "malformed JSON",
            events(prefix, "h-json", b'{"type": "chunk", ', b"}{", b""),
            # An empty payload carries no event: a removed retained message (docs/protocol.md).
            {"invalid_json": 2, "deleted": 1},
        ),
        Case(
            "wrong types, validated per event",
            events(
                prefix,
                "h-types",
                js(
                    [
                        {
                            "type": "chunk",
                            "stream": "s",
                            "t_ms": str(now_ms()),
                            "seq": 1.0,
                            "audio_ms": True,
                        },
                        {"type": "start", "stream": 7, "t_ms": now_ms()},
                        ev("pause", "s"),
                        42,
                        good,
                    ]
                ),
                js(None),
                js("start"),
                js([]),
            ),
            {"invalid_event": 7},
            applied=1,
            device="h-types",
        ),
        Case(
            "NaN, Infinity, 1e308",
            events(
                prefix,
                "h-nonfinite",
                b'{"type":"chunk","stream":"s","t_ms":NaN,"seq":0,"audio_ms":10}',
                b'{"type":"chunk","stream":"s","t_ms":1,"seq":0,"audio_ms":Infinity}',
                b'{"type":"chunk","stream":"s","t_ms":-Infinity,"seq":0,"audio_ms":10}',
                b'{"type":"chunk","stream":"s","t_ms":1e308,"seq":0,"audio_ms":10}',
                b'{"type":"chunk","stream":"s","t_ms":1,"seq":0,"audio_ms":1e308}',
                b'{"type":"chunk","stream":"s","t_ms":1,"seq":0,"audio_ms":10,"eta_ms":1e308}',
                b'{"type":"start","stream":"s","t_ms":1,"margin_ms":NaN}',
            ),
            {"invalid_event": 7},
            device="h-nonfinite",
        ),
        Case(
            "zero or negative audio_ms",
            events(
                prefix, "h-audio", js([chunk("s", 0, 0), chunk("s", 0, -5), chunk("s", 0, -1e-300)])
            ),
            {"invalid_event": 3},
            device="h-audio",
        ),
        Case(
            "huge seq",
            events(
                prefix,
                "h-seq",
                js(chunk("s", 2**64, 10)),
                js(chunk("s", -1, 10)),
                b'{"type":"chunk","stream":"s","t_ms":1,"seq":1' + b"0" * 5000 + b',"audio_ms":5}',
            ),
            {"invalid_event": 2, "invalid_json": 1},  # 5000 digits: not even parsed
            device="h-seq",
        ),
        Case(
            "t_ms years away (its own device: accepted, harms no one else)",
            events(
                prefix,
                "h-timewarp",
                js(chunk("future", 0, 100, t_ms=now_ms() + 3 * YEAR_MS)),
                js(chunk("past", 0, 100, t_ms=now_ms() - 3 * YEAR_MS)),
                js(chunk("beyond", 0, 100, t_ms=2.0**60)),
            ),
            {"invalid_event": 1},  # beyond 2**53 ms
            applied=2,
            device="h-timewarp",
        ),
        Case(
            "control characters and 10 kB strings in ids",
            events(
                prefix,
                "h-ids",
                js(ev("start", "a\x00b")),
                js(ev("start", "a\nb")),
                js(ev("start", "\x1b[31mred")),
                js(ev("start", "x" * 10_000)),
                js(ev("end", "s", reason="r" * 10_000)),
            ),
            {"invalid_event": 5},
            device="h-ids",
        ),
        Case(
            "topic levels that are not device names",
            [
                (f"{prefix}/{'d' * 10_000}/events", js(good)),
                (f"{prefix}/dev ice/events", js(good)),
                (f"{prefix}/dév/events", js(good)),
                # Control characters in a topic never get here: Mosquitto drops the publisher
                # ("malformed packet"); the Hypothesis test below covers them in-process.
                (f"{prefix}/{'x' * 65}/engine", js({})),
            ],
            {"unknown_topic": 4},
        ),
        Case(
            "non-UTF-8 bytes",
            events(
                prefix,
                "h-utf8",
                b'\xff\xfe{"type":"start"}',
                b'{"type":"start","stream":"\xc3(","t_ms":1}',
            )
            + engine(prefix, "h-utf8", b"\xff\xfe{}", "{}".encode("utf-16")),
            {"invalid_json": 4},
            device="h-utf8",
        ),
        Case(
            "deeply nested JSON",
            events(prefix, "h-nest", nested(100_000), nested(10_000, b'{"a":', b"}"))
            + events(prefix, "h-nest", js([{"type": "chunk", "deep": json.loads(nested(100))}]))
            + engine(prefix, "h-nest", nested(100_000), b'{"hf_config":' + nested(900) + b"}"),
            {"invalid_json": 3, "invalid_event": 2},
            device="h-nest",
        ),
        Case(
            "payloads over max_payload_bytes",
            events(prefix, "h-big", oversized) + engine(prefix, "h-big", oversized),
            {"oversized": 2},
            device="h-big",
        ),
        Case(
            "batches over max_batch_events",
            events(prefix, "h-batch", js([ev("start", f"s{i}") for i in range(1_001)])),
            {"oversized": 1},
            device="h-batch",
        ),
        Case(
            "replayed and duplicated sequences",
            events(
                prefix,
                "h-replay",
                js([ev("start", "s"), chunk("s", 0, 100), chunk("s", 1, 100)]),  # applied
                js([chunk("s", 0, 100), chunk("s", 1, 100), ev("start", "s")]),  # duplicates
                js(chunk("s", 2, 60_000, final=True)),  # applied: draining for a minute
                js(chunk("s", 3, 100)),  # after final
                js([ev("start", "e"), ev("end", "e")]),  # applied
                js([chunk("e", 1, 100), ev("end", "e")]),  # duplicates of a removed stream
                js(ev("end", "never")),  # unknown stream
            ),
            {"duplicate": 5, "after_final": 1, "unknown_stream": 1},
            applied=5,  # 2 streams started, 3 chunks
            device="h-replay",
        ),
        Case(
            "engine objects with absurd (but representable) geometry",
            engine(
                prefix,
                "h-geom",
                js(
                    {
                        "geometry": {"num_layers": -1, "num_kv_heads": 0, "head_dim": 1},
                        "kv_cache_bytes": 1,
                        "max_model_len": 1,
                    }
                ),  # kept as kv_error: accepted
                js(
                    {
                        "geometry": {
                            "num_layers": 10**18,
                            "num_kv_heads": 10**18,
                            "head_dim": 10**18,
                        },
                        "kv_cache_bytes": 1,
                        "max_model_len": 10**18,
                    }
                ),
                js({"geometry": {"num_layers": 1.5, "num_kv_heads": "2", "head_dim": None}}),
                js({"margin_ms": 1e308}),
                js({"hardware_class": "quantum"}),
                js([{"geometry": {}}]),
            ),
            {"invalid_event": 4},
            device="h-geom",
        ),
    ]


@dataclass
class LegitCycles:
    """A legit device running throttle ON/OFF cycles: chunk 0 (300 ms audio, next chunk in
    50 ms) turns it ON 220 ms later by the timer alone; a 2 s refill turns it OFF after the
    250 ms min-on. Records `(t0, on, off)` per cycle."""

    broker: Broker
    watcher: Watcher
    device_id: str = "legit"
    done: list[tuple[float, dict[str, Any], dict[str, Any]]] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        async with device(self.broker) as client:
            k = 0
            while not stop.is_set():
                before = len(self.watcher.throttles(self.device_id))
                t0 = now_ms()
                stream = f"c{k}"
                await self._send(
                    client, [ev("start", stream, t=t0), chunk(stream, 0, 300, t_ms=t0, eta_ms=50)]
                )
                await self.watcher.until(
                    lambda n=before: len(self.watcher.throttles(self.device_id)) > n
                )
                await self._send(client, [chunk(stream, 1, 2_000, eta_ms=50)])
                await self.watcher.until(
                    lambda n=before: len(self.watcher.throttles(self.device_id)) > n + 1
                )
                await self._send(client, [ev("end", stream)])
                on, off = self.watcher.throttles(self.device_id)[before : before + 2]
                self.done.append((t0, on, off))
                k += 1

    async def _send(self, client: Any, batch: list[dict[str, Any]]) -> None:
        await client.publish(self.broker.topic(self.device_id, "events"), js(batch), qos=1)

    def check(self) -> None:
        """Each cycle's ON came at the timer's instant and its OFF exactly min-on later."""
        for t0, on, off in self.done:
            assert (on["throttle"], off["throttle"]) == (True, False)
            assert on["t_ms"] == pytest.approx(t0 + 220, abs=1e-6)  # device clock: t0 is exact
            assert off["t_ms"] == pytest.approx(on["t_ms"] + 250, abs=1e-6)
            assert on["streams"]
            assert off["streams"] == []


@contextlib.asynccontextmanager
async def legit_alongside(broker: Broker, watcher: Watcher) -> AsyncIterator[LegitCycles]:
    """Run legit throttle cycles for the duration of the block, plus at least one after it."""
    legit = LegitCycles(broker, watcher)
    stop = asyncio.Event()
    task = asyncio.create_task(legit.run(stop), name="legit")
    try:
        yield legit
        boundary = now_ms()
        async with asyncio.timeout(5):
            while not any(t0 > boundary for t0, _, _ in legit.done):
                if task.done():
                    task.result()  # the legit scenario failed: say why
                    pytest.fail("the legit scenario ended early")
                await asyncio.sleep(0.02)
    finally:
        stop.set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def until_counted(daemon: Daemon, expect: Counter[str], within_s: float = 5.0) -> None:
    """Wait until the daemon's rejection counts reach `expect` (never beyond it)."""
    results = daemon.monitor.results
    async with asyncio.timeout(within_s):
        while any(results[r] < n for r, n in expect.items()):  # noqa: ASYNC110 - in-process poll
            await asyncio.sleep(0.005)


# ------------------------------------------------------------------ through the broker
@pytest.mark.integration
@pytest.mark.asyncio
async def test_hostile_messages_are_counted_and_harm_no_one(
    mosquitto_broker: Broker, captured_logs: list[MutableMapping[str, Any]]
) -> None:
    """Each kind of hostile input (malformed JSON, wrong types, non-finite and huge numbers,
    bad `audio_ms`, huge `seq`, `t_ms` years away, control characters and 10 kB ids, bad topic
    levels, non-UTF-8, deep nesting, oversized payloads and batches, replays, absurd engine
    objects) sent through Mosquitto: the daemon keeps running, each message or event is
    counted under exactly its `result` on `/metrics` (no other rejection moves), the valid
    events of a mixed batch are applied, nothing is `internal_error`, each (device, reason)
    is logged at most once per second, and a legit device's throttle ON/OFF objects keep
    arriving at the exact instants throughout and after."""
    broker = mosquitto_broker
    daemon = Daemon(settings_for(broker), environ={}, install_signal_handlers=False)
    expected: Counter[str] = Counter()
    async with (
        watching(broker) as watcher,
        running(daemon, logs=captured_logs) as task,
        device(broker) as hostile,
        legit_alongside(broker, watcher) as legit,
    ):
        for case in cases(broker.prefix):
            for topic, payload in case.messages:
                await hostile.publish(topic, payload, qos=1)
            expected.update(case.expect)
            try:
                await until_counted(daemon, expected)
            except TimeoutError:
                got = dict(daemon.monitor.results)
                pytest.fail(f"{case.name}: counts {got} never reached {dict(expected)}")
            got = {r: daemon.monitor.results[r] for r in REJECTIONS}
            assert got == {r: expected[r] for r in REJECTIONS}, case.name
            if case.device is not None:
                dev = daemon.monitor.engine.device(case.device)
                applied = 0 if dev is None else dev.stats.streams_started + dev.stats.chunks
                assert applied >= case.applied, case.name
                if case.applied == 0:
                    assert dev is None or not dev.streams, case.name
            assert not task.done(), f"the daemon stopped after {case.name}"
        assert daemon.http_port is not None
        status, text = await scrape(daemon.http_port, "/metrics")
    assert status == 200
    for result in REJECTIONS:
        # `internal_error` is exported once counted; it must not have been.
        want = expected[result] if expected[result] or result in KNOWN_RESULTS else None
        assert sample(text, "edgemon_messages_total", {"result": result}) == want, result
    legit.check()
    assert len(legit.done) >= 2
    # Rate limit: per (device, reason), successive lines at least a second apart.
    by_key: dict[tuple[str | None, str], list[float]] = {}
    for t, fields in rejections(captured_logs):
        by_key.setdefault((fields["device"], fields["reason"]), []).append(t)
    assert by_key
    for key, times in by_key.items():
        assert all(b - a >= 0.99 for a, b in itertools.pairwise(times)), key
    assert not logged(captured_logs, "message_failed")


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_burst_of_bad_messages_is_logged_once_per_second(
    mosquitto_broker: Broker, captured_logs: list[MutableMapping[str, Any]]
) -> None:
    """50 identical bad messages from one device within a second give one `message_rejected`
    line (suppressed 0), all 50 counted; another reason of that device and the same reason of
    another device are logged on their own; the next line for the key, a second later, reports
    `suppressed=49`. The burst is within one second of edgemon's clock because the test holds
    that clock still while it sends, however long this machine takes to deliver it."""
    broker = mosquitto_broker
    clock = PausableClock()
    daemon = Daemon(
        settings_for(broker), environ={}, install_signal_handlers=False, clock=clock.wall_clock()
    )
    async with running(daemon, logs=captured_logs), device(broker) as client:
        noisy, other = broker.topic("noisy", "events"), broker.topic("other", "events")
        with clock.paused():
            for _ in range(50):
                await client.publish(noisy, b"{not json", qos=0)
            await client.publish(noisy, b"[]", qos=0)  # another reason
            await client.publish(other, b"{not json", qos=0)  # another device
            await until_counted(daemon, Counter(invalid_json=51, invalid_event=1), within_s=30)
        lines = rejections(captured_logs, "noisy", "invalid_json")
        assert len(lines) == 1
        assert lines[0][1]["suppressed"] == 0
        assert len(rejections(captured_logs, "noisy", "invalid_event")) == 1
        assert len(rejections(captured_logs, "other", "invalid_json")) == 1
        # One more bad message every 50 ms until the key's next line comes (its second).
        sent = 50
        async with asyncio.timeout(30):
            while len(rejections(captured_logs, "noisy", "invalid_json")) < 2:
                await client.publish(noisy, b"{not json", qos=1)
                sent += 1
                await until_counted(daemon, Counter(invalid_json=sent + 1), within_s=30)
                await asyncio.sleep(0.05)
        lines = rejections(captured_logs, "noisy", "invalid_json")
        assert len(lines) == 2
        assert lines[1][1]["suppressed"] == sent - 2  # all but the two logged
        assert sent - 2 >= 49
        assert lines[1][0] - lines[0][0] >= 1.0


@pytest.mark.integration
@pytest.mark.asyncio
async def test_absurd_engine_geometry_does_not_break_metrics(
    mosquitto_broker: Broker,
) -> None:
    """An engine object with a geometry far beyond any real model (integers of hundreds of
    digits) is counted (accepted: a device may send one; its KV figures are refused, with
    the reason kept), and `/metrics` still answers 200 with a page Prometheus can parse,
    twice: no KV series is made of it."""
    broker = mosquitto_broker
    daemon = Daemon(settings_for(broker), environ={}, install_signal_handlers=False)
    bomb = {
        "geometry": {"num_layers": 10**400, "num_kv_heads": 1, "head_dim": 1},
        "kv_cache_bytes": 1,
        "max_model_len": 1,
    }
    async with running(daemon), device(broker) as client:
        await client.publish(broker.topic("kvbomb", "engine"), js(bomb), qos=1)
        async with asyncio.timeout(3):
            while daemon.monitor.engine.device("kvbomb") is None:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert daemon.http_port is not None
        status, text = await scrape(daemon.http_port, "/metrics")
        assert status == 200, text[:200]
        again, _ = await scrape(daemon.http_port, "/metrics")
        dev = daemon.monitor.engine.device("kvbomb")
    assert again == 200
    assert sample(text, "edgemon_messages_total", {"result": "accepted"}) == 1.0
    assert dev is not None
    assert dev.engine_info is not None
    assert dev.engine_info.kv is None
    assert "absurdly large" in (dev.engine_info.kv_error or "")
    kv_series = [
        name
        for name, labels in series_names(text)
        if name.startswith("edgemon_kv") and labels.get("device") == "kvbomb"
    ]
    assert kv_series == []


# ------------------------------------------------------------------ in-process
T0 = 1_700_000_000_000.0


def _deliver(monitor: Monitor, out: list[Output], recv_ms: float, dev: str, value: Any) -> None:
    monitor.advance(recv_ms, out)
    monitor.receive(f"{P}/{dev}/events", js(value), recv_ms, out)
    monitor.advance(recv_ms, out)


def test_a_far_future_t_ms_does_not_wreck_the_devices_other_streams() -> None:
    """A device reports one chunk of a new stream with `t_ms` three years ahead (a bad RTC,
    or hostile). Its healthy stream (a minute of audio buffered) must not underrun or expire
    for it, and a stream the device starts afterwards with a sane `t_ms` must live."""
    monitor = Monitor(EngineConfig())
    out: list[Output] = []
    _deliver(monitor, out, T0, "d", chunk("good", 0, 60_000, t_ms=T0, eta_ms=50))
    _deliver(monitor, out, T0 + 100, "d", chunk("evil", 0, 100, t_ms=T0 + 100 + 3 * YEAR_MS))
    _deliver(monitor, out, T0 + 200, "d", chunk("later", 0, 60_000, t_ms=T0 + 200, eta_ms=50))
    harmed = [
        o
        for o in out
        if isinstance(o, UnderrunBegan | StreamEnded) and o.stream in {"good", "later"}
    ]
    assert harmed == []
    dev = monitor.engine.device("d")
    assert dev is not None
    assert {"good", "later"} <= set(dev.streams)


# ------------------------------------------------------------------ Hypothesis
LIMITS = Limits(
    max_devices=3, max_streams_per_device=4, max_payload_bytes=2_000, max_batch_events=5
)
CONFIG = EngineConfig(
    slack=SlackPolicy(stream_idle_timeout_ms=3_000.0, min_on_ms=100.0), limits=LIMITS
)
DEVICES = ("d0", "d1", "d2", "d3")  # one more than max_devices
STREAMS = ("s0", "s1", "s2", "s3", "s4", "s5")  # more than max_streams_per_device

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
NUMBER = (
    st.integers(-5, 3_000)
    | st.floats()
    | st.sampled_from([0, 1e308, 2**53, 2**53 + 1, 2**64, 600_000, 3_600_000, 60_000])
)
FIELDS = {
    "seq": st.integers(-1, 8) | st.sampled_from([2**53, 2**64]) | NUMBER,
    "audio_ms": NUMBER,
    "eta_ms": NUMBER | st.none(),
    "final": st.booleans() | JSON,
    "audio_total_ms": NUMBER | st.none(),
    "play_start_ms": NUMBER | st.none(),
    "margin_ms": NUMBER | st.none(),
    "player": st.sampled_from(["conceal", "rebuffer", "stall", None]),
    "reason": st.text(max_size=4) | st.none(),
}


@st.composite
def event_value(draw: st.DrawFn, now: float) -> Any:
    """An event-shaped object, its fields often valid, sometimes anything."""
    value: dict[str, Any] = {
        "type": draw(st.sampled_from(["start", "chunk", "end"]) | JSON),
        "stream": draw(st.sampled_from(STREAMS) | st.text(max_size=4)),
        # Around the receipt (jitter, late), occasionally anything.
        "t_ms": draw(st.integers(-500, 50).map(lambda d: now + d) | NUMBER),
    }
    for name in draw(st.sets(st.sampled_from(sorted(FIELDS)))):
        value[name] = draw(FIELDS[name])
    if value["type"] == "chunk" and draw(st.booleans()):
        value.setdefault("seq", draw(st.integers(0, 6)))
        value.setdefault("audio_ms", draw(st.sampled_from([50, 100, 200, 1000])))
    return value


@st.composite
def step(draw: st.DrawFn, now: float) -> tuple[str, bytes]:
    """One message: a topic (mostly ours) and a payload (bytes, any JSON, events, engine)."""
    dev = draw(st.sampled_from(DEVICES))
    topic = draw(
        st.sampled_from([f"{P}/{dev}/events"] * 6 + [f"{P}/{dev}/engine"])
        | st.text(max_size=20)
        | st.text(max_size=10).map(lambda d: f"{P}/{d}/events")
    )
    kind = draw(st.sampled_from(["bytes", "json", "event", "batch", "engine"]))
    if kind == "bytes":
        return topic, draw(st.binary(max_size=64))
    if kind == "json":
        return topic, json.dumps(draw(JSON)).encode()
    if kind == "event":
        return topic, json.dumps(draw(event_value(now))).encode()
    if kind == "batch":
        batch = draw(st.lists(event_value(now) | JSON, max_size=LIMITS.max_batch_events + 2))
        return topic, json.dumps(batch).encode()
    obj = draw(
        st.fixed_dictionaries(
            {},
            optional={
                "margin_ms": NUMBER,
                "hardware_class": st.sampled_from(["cuda", "npu", "quantum"]),
                "kv_cache_bytes": NUMBER,
                "max_model_len": NUMBER,
                "max_num_seqs": NUMBER,
                "geometry": st.fixed_dictionaries(
                    {"num_layers": NUMBER, "num_kv_heads": NUMBER, "head_dim": NUMBER}
                )
                | JSON,
            },
        )
    )
    return topic.replace("/events", "/engine"), json.dumps(obj).encode()


def device_totals(dev: Device) -> tuple[float, ...]:
    """Every cumulative counter of a device (each must never decrease)."""
    s = dev.stats
    return (
        s.chunks,
        s.audio_ms,
        s.streams_started,
        sum(s.finished.values()),
        s.underruns,
        s.underrun_ms,
        s.throttle_engagements,
        s.throttle_ms,
        s.slack_at_arrival.count,
        s.chunk_gap.count,
        s.time_to_first_audio.count,
    )


def check_invariants(monitor: Monitor, before: dict[str, tuple[float, ...]]) -> None:
    """The engine's bookkeeping agrees with its streams, and nothing exceeds its limit."""
    devices = list(monitor.engine.devices())
    assert len(devices) <= LIMITS.max_devices
    for dev in devices:
        streams = list(dev.streams.values())
        assert len(streams) <= LIMITS.max_streams_per_device
        assert len(dev.tombstones) <= 4 * LIMITS.max_streams_per_device
        live = [s for s in streams if s.phase is Phase.LIVE]
        assert dev.live == len(live)
        assert dev.throttle.risk_count == sum(s.risk for s in live)
        assert dev.throttle.unsafe_count == sum(s.unsafe for s in live)
        assert not any(s.risk or s.unsafe for s in streams if s.phase is not Phase.LIVE)
        totals = device_totals(dev)
        previous = before.get(dev.id)
        if previous is not None:
            assert all(b >= a for a, b in zip(previous, totals, strict=True)), dev.id
        assert all(not math.isnan(x) for x in totals)
        before[dev.id] = totals


@pytest.mark.slow  # a property: many generated examples
@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_arbitrary_input_never_raises_and_keeps_invariants(data: st.DataObject) -> None:
    """Arbitrary bytes, arbitrary JSON, fuzzed events and engine objects on arbitrary topics,
    at arbitrary receipt times, fed to `Monitor.receive` and `advance` (as the daemon does):
    no exception escapes; after every step each device's live and at-risk counts equal its
    streams' flags, no limit is exceeded, no counter decreases, each message is counted at
    least once, and each device's throttle objects alternate ON/OFF in time order."""
    monitor = Monitor(CONFIG)
    out: list[Output] = []
    totals: dict[str, tuple[float, ...]] = {}
    throttles: dict[str, list[ThrottleChanged]] = {}
    now = T0
    for _ in range(data.draw(st.integers(1, 25), label="steps")):
        now += data.draw(st.sampled_from([0, 1, 50]) | st.integers(0, 5_000), label="dt")
        topic, payload = data.draw(step(now), label="message")
        counted = sum(monitor.results.values())
        results = Counter(monitor.results)
        messages = monitor.messages
        monitor.engine.advance(now, out, inclusive=False)  # as the daemon's _on_message
        monitor.receive(topic, payload, now, out)
        monitor.advance(now, out)
        assert monitor.messages == messages + 1
        assert sum(monitor.results.values()) >= counted + 1
        assert all(monitor.results[r] >= n for r, n in results.items())
        check_invariants(monitor, totals)
        if data.draw(st.booleans(), label="idle"):
            now += data.draw(st.integers(0, 10_000), label="idle_ms")
            monitor.advance(now, out)
            check_invariants(monitor, totals)
        for o in out:
            if isinstance(o, ThrottleChanged):
                throttles.setdefault(o.device, []).append(o)
        out.clear()
    for changes in throttles.values():
        assert [c.active for c in changes] == [i % 2 == 0 for i in range(len(changes))]
        assert all(a.t_ms <= b.t_ms for a, b in itertools.pairwise(changes))
