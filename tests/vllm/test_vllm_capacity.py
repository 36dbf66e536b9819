"""The capacity object from vLLM's real scheduler on a real Mosquitto, and waiting requests
that edgemon ends (finish_reason abort, stop_reason edgemon:start_deadline)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("vllm.v1.core.sched.scheduler", exc_type=ImportError)

from realtime_cases import ModelClock, steps

from edgemon.integrations._vllm_report import SHED_STOP_REASON
from edgemon.integrations.vllm import EdgemonScheduler
from edgemon.integrations.vllm_realtime import EdgemonRealtimeScheduler
from edgemon.policy.realtime import RealtimeAdmission
from edgemon.shedding.topic import CapacityPublisher, TopicConfig

from brokers import free_port
from harness import build_scheduler, make_request, run_step, talker_classes, waiting_ids
from mqtt_probe import Probe, Seen, probe

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from brokers import Broker

pytestmark = pytest.mark.integration

T = 30.0  # generous: a loaded machine
DEVICE = "box-1"
CAPACITY = f"edgemon/v1/{DEVICE}/capacity"


@pytest.fixture(params=talker_classes(), ids=lambda cls: cls.__name__)
def flavour(request: pytest.FixtureRequest) -> type[Any]:
    """The scheduler class under test."""
    cls: type[Any] = request.param
    return cls


@pytest.fixture
def engine_env(private_broker: Broker, monkeypatch: pytest.MonkeyPatch) -> str:
    """The engine process's environment names the device and the test's broker (its URL)."""
    host, port = private_broker.host, private_broker.port
    url = f"mqtt://{host}:{port}"
    monkeypatch.setenv("EDGEMON_GATE_DEVICE", DEVICE)
    monkeypatch.setenv("EDGEMON_GATE_BROKER", url)
    monkeypatch.delenv("EDGEMON_GATE_TOPIC_PREFIX", raising=False)
    return url


@pytest.fixture
def watcher(private_broker: Broker) -> Iterator[Probe]:
    """A probe following the device's capacity topic."""
    with probe(private_broker.host, private_broker.port, CAPACITY) as seen:
        yield seen


def _latest(seen: list[Seen]) -> dict[str, Any] | None:
    objects = [m for m in seen if m.topic == CAPACITY and m.payload]
    return objects[-1].json() if objects else None


def _shows(predicate: Callable[[dict[str, Any]], bool]) -> Callable[[list[Seen]], bool]:
    def check(seen: list[Seen]) -> bool:
        latest = _latest(seen)
        return latest is not None and predicate(latest)

    return check


def test_the_scheduler_publishes_what_it_runs_and_what_waits(
    tiny_model: Path,
    engine_env: str,
    watcher: Probe,
    private_broker: Broker,
    flavour: type[Any],
) -> None:
    """From its start (idle: nothing runs, nothing waits), then after the steps that admitted
    two requests and kept a third waiting (max_num_seqs 2), then once all finished: the
    scheduler's figures reach the capacity topic, retained; shutdown empties it."""
    scheduler = build_scheduler(flavour, tiny_model, max_num_seqs=2)
    try:
        assert watcher.wait_for(_shows(lambda c: c["running"] == 0 and c["waiting"] == 0), T)
        first = _latest(watcher.seen)
        assert first is not None
        assert first["shed_total"] == 0
        assert isinstance(first["t_ms"], int)
        assert abs(first["t_ms"] - time.time() * 1000) < 3_600_000  # the epoch clock, in ms
        for i in range(3):
            scheduler.add_request(make_request(f"r{i}", 8, max_tokens=4))
        run_step(scheduler)
        assert watcher.wait_for(_shows(lambda c: (c["running"], c["waiting"]) == (2, 1)), T)
        # A router that comes later:
        with probe(private_broker.host, private_broker.port, CAPACITY) as late:
            assert late.wait_for(lambda seen: any(m.retain and m.payload for m in seen), T)
        for _ in range(30):
            run_step(scheduler)
        assert not scheduler.has_unfinished_requests()
        # The last change is published although the engine, idle now, steps no more.
        assert watcher.wait_for(_shows(lambda c: (c["running"], c["waiting"]) == (0, 0)), T)
    finally:
        scheduler.shutdown()
    assert watcher.wait_for(lambda seen: seen[-1].topic == CAPACITY and not seen[-1].payload, T)


def test_at_most_once_a_second(tiny_model: Path, engine_env: str, watcher: Probe) -> None:
    """Steps that change the figures every time are published at most once a second (plus
    the first), and the last figures always arrive."""
    scheduler = build_scheduler(EdgemonScheduler, tiny_model, max_num_seqs=16)
    try:
        begun = time.monotonic()
        for i in range(40):
            scheduler.add_request(make_request(f"r{i}", 8, max_tokens=60))
            run_step(scheduler)
        assert watcher.wait_for(_shows(lambda c: c["running"] == 16 and c["waiting"] == 24), T)
        elapsed = time.monotonic() - begun
        published = [m for m in watcher.seen if m.topic == CAPACITY and m.payload]
        assert len(published) <= elapsed + 2  # the idle object, then ≤ 1 per second
        assert scheduler.edgemon_stats.errors == 0
    finally:
        scheduler.shutdown()


def test_the_real_time_batch_is_published(
    tiny_model: Path, engine_env: str, watcher: Probe
) -> None:
    """`realtime_streams` is the batch real-time admission measured (absent until known)."""
    clock = ModelClock()
    scheduler = build_scheduler(
        EdgemonRealtimeScheduler,
        tiny_model,
        max_num_seqs=16,
        edgemon_realtime=RealtimeAdmission(80.0),
        edgemon_clock=clock,
    )
    try:
        assert watcher.wait_for(_shows(lambda c: "realtime_streams" not in c), T)
        for i in range(16):
            scheduler.add_request(make_request(f"r{i}", 8, max_tokens=200))
            for _ in steps(scheduler, clock, 3):
                pass
        limit = scheduler.edgemon_realtime.limit
        assert limit is not None
        assert watcher.wait_for(_shows(lambda c: c.get("realtime_streams") == limit), T)
    finally:
        scheduler.shutdown()


def test_ended_waiting_requests_reach_the_client_and_the_count(
    tiny_model: Path, engine_env: str, watcher: Probe, flavour: type[Any]
) -> None:
    """Waiting requests edgemon ends leave the queue at once, and the step's outputs give
    each one finish_reason abort and stop_reason edgemon:start_deadline (what the API server
    turns into the response); running requests go on; shed_total counts them."""
    scheduler = build_scheduler(flavour, tiny_model, max_num_seqs=1)
    try:
        for name in ("running", "w1", "w2"):
            scheduler.add_request(make_request(name, 8, max_tokens=5))
        assert run_step(scheduler).admitted == ["running"]
        assert sorted(scheduler.edgemon_end_waiting(["w1", "w2", "unknown"])) == ["w1", "w2"]
        assert waiting_ids(scheduler) == []
        step = run_step(scheduler)
        assert step.reasons == {
            "w1": ("abort", SHED_STOP_REASON),
            "w2": ("abort", SHED_STOP_REASON),
        }
        assert "running" in step.produced
        assert scheduler.edgemon_end_waiting(["w1"]) == []  # already ended: nothing twice
        assert watcher.wait_for(_shows(lambda c: c["shed_total"] == 2 and c["waiting"] == 0), T)
        assert scheduler.edgemon_stats.errors == 0
    finally:
        scheduler.shutdown()


def test_http_refusals_are_added_to_shed_total(
    tiny_model: Path, engine_env: str, watcher: Probe, private_broker: Broker
) -> None:
    """Each HTTP server's retained refusal count is added to the scheduler's own; a server
    that goes away (its count emptied) stays counted, so the total never goes down."""
    scheduler = build_scheduler(EdgemonScheduler, tiny_model, max_num_seqs=1)
    server = f"{CAPACITY}/shed/api-1"
    try:
        with probe(private_broker.host, private_broker.port) as api:
            api.publish(server, {"shed_total": 5})
            assert watcher.wait_for(_shows(lambda c: c["shed_total"] == 5), T)
            scheduler.add_request(make_request("a", 8))
            scheduler.add_request(make_request("b", 8))
            run_step(scheduler)
            scheduler.edgemon_end_waiting(["b"])
            run_step(scheduler)
            assert watcher.wait_for(_shows(lambda c: c["shed_total"] == 6), T)
            api.publish(server, b"")
            api.publish(f"{CAPACITY}/shed/api-2", {"shed_total": 1})
            assert watcher.wait_for(_shows(lambda c: c["shed_total"] == 7), T)
            latest = _latest(watcher.seen)
            assert latest is not None
            assert latest["shed_reasons"] == {"http": 6, "arrival": 0, "queued": 1}
    finally:
        scheduler.shutdown()


def test_an_unreachable_broker_never_stops_a_step(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the broker unreachable, steps run as vLLM's own and nothing is counted as an
    error in the step (the publisher waits for a connection in the background)."""
    monkeypatch.setenv("EDGEMON_GATE_DEVICE", DEVICE)
    monkeypatch.setenv("EDGEMON_GATE_BROKER", f"mqtt://127.0.0.1:{free_port()}")
    scheduler = build_scheduler(EdgemonScheduler, tiny_model)
    try:
        scheduler.add_request(make_request("r", 8, max_tokens=3))
        finished = [r for _ in range(10) for r in run_step(scheduler).finished]
        assert finished == ["r"]
        assert scheduler.edgemon_stats.errors == 0
    finally:
        scheduler.shutdown()


def test_a_plus_device_or_none_publishes_nothing() -> None:
    """No EDGEMON_GATE_DEVICE, or `+` (no device to publish for): no publisher; a bad prefix
    is refused naming the variable."""
    assert CapacityPublisher.from_environ({}) is None
    assert TopicConfig.from_environ({"EDGEMON_GATE_DEVICE": "+"}) is None
    config = TopicConfig.from_environ({"EDGEMON_GATE_DEVICE": "b, a"})
    assert config is not None
    assert config.capacity_topics() == ("edgemon/v1/a/capacity", "edgemon/v1/b/capacity")
    assert config.shed_filter() == "edgemon/v1/a/capacity/shed/+"
    with pytest.raises(ValueError, match="EDGEMON_GATE_TOPIC_PREFIX"):
        TopicConfig.from_environ({"EDGEMON_GATE_DEVICE": "a", "EDGEMON_GATE_TOPIC_PREFIX": "x/#"})
