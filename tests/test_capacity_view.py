"""The capacity object's bounded power at its readers and its publisher (docs/protocol.md,
"Capacity object"), on a real Mosquitto, without vLLM: the shedding middleware's view keeps
each device's object apart and decides by the one that can start soonest, ignores stale
objects, is voided by unreadable ones, clamps `Retry-After`, and says when it hears nothing;
the engine's publisher refreshes its object and bounds the HTTP servers it follows; a refused
subscription is said and counted."""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pytest

from edgemon.broker_url import parse_broker_url
from edgemon.capacity_object import Unreadable, read_capacity
from edgemon.protocol import CAPACITY_MAX_AGE_MS, SHED_BURST
from edgemon.shedding.middleware import CapacityView, EdgemonShedMiddleware, Refusal
from edgemon.shedding.topic import MAX_SHED_SERVERS, CapacityPublisher, TopicConfig

from mqtt_probe import Probe, eventually, probe

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, MutableMapping

    from brokers import Broker

pytestmark = pytest.mark.integration

SLO_MS = 3_000.0
T0_S = 1_764_000_000.0


class Wall:
    """A wall clock the test moves (seconds)."""

    def __init__(self) -> None:
        self.now = T0_S

    def __call__(self) -> float:
        return self.now


def config(broker: Broker, *devices: str) -> TopicConfig:
    """The capacity topics of `devices` on the test's broker, under its prefix."""
    return TopicConfig(parse_broker_url(broker.url), devices, broker.prefix)


@contextmanager
def connected(broker: Broker, wall: Wall | None = None) -> Iterator[CapacityView]:
    """A connected view of devices a and b (on `wall`, if given) for the block."""
    opened = CapacityView(config(broker, "a", "b"), wall=wall or time.time).open()
    assert opened.link.wait_connected(30)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def prefix(mosquitto_broker: Broker) -> str:
    """The test's own topic prefix `P` on the shared broker."""
    return mosquitto_broker.prefix


@pytest.fixture
def view(mosquitto_broker: Broker) -> Iterator[CapacityView]:
    """A connected view of devices a and b."""
    with connected(mosquitto_broker) as opened:
        yield opened


@pytest.fixture
def wall() -> Wall:
    """A wall clock the test moves."""
    return Wall()


@pytest.fixture
def view_on_wall(mosquitto_broker: Broker, wall: Wall) -> Iterator[CapacityView]:
    """A connected view of devices a and b on the test's wall clock."""
    with connected(mosquitto_broker, wall) as opened:
        yield opened


@pytest.fixture
def engine(mosquitto_broker: Broker) -> Iterator[Probe]:
    """A client publishing retained objects as an engine would."""
    with probe(mosquitto_broker.host, mosquitto_broker.port) as client:
        yield client


def capacity(wait_ms: float | None, *, at_s: float | None = None, **more: Any) -> dict[str, Any]:
    """A capacity object stamped `at_s` (now by default)."""
    return {
        "t_ms": (time.time() if at_s is None else at_s) * 1000.0,
        "start_wait_ms": wait_ms,
    } | more


def refuses(view: CapacityView, wait_ms: float | None = None) -> Callable[[], bool]:
    """A check: the view refuses a request now (with this predicted wait, if given)."""

    def check() -> bool:
        refusal = view.judge(SLO_MS)
        return refusal is not None and (wait_ms is None or refusal.start_wait_ms == wait_ms)

    return check


def admits(view: CapacityView) -> Callable[[], bool]:
    """A check: the view admits a request now."""
    return lambda: view.judge(SLO_MS) is None


def test_each_device_speaks_for_itself(view: CapacityView, engine: Probe, prefix: str) -> None:
    """A refusal needs every device's fresh object to predict a wait beyond the SLO: one
    device's object (even a huge wait) never speaks for another (before, whichever object came
    last decided for all)."""
    engine.publish(f"{prefix}/a/capacity", capacity(9_000.0))
    assert eventually(refuses(view, 9_000.0))
    engine.publish(f"{prefix}/b/capacity", capacity(500.0))
    assert eventually(admits(view))
    engine.publish(f"{prefix}/b/capacity", capacity(1e9))
    assert eventually(refuses(view))
    assert view.judge(SLO_MS) == Refusal(9_000.0, SLO_MS)


def test_a_stale_object_is_ignored(view: CapacityView, engine: Probe, prefix: str) -> None:
    """Objects stamped long ago (1970) say nothing, however long the wait they predict; fresh
    ones then count (before, `t_ms` was never looked at: the 1970 object refused)."""
    for device in ("a", "b"):
        engine.publish(f"{prefix}/{device}/capacity", capacity(1e9, at_s=0.001))
    assert eventually(lambda: view.received == 2)
    assert view.readings() == {}
    assert view.judge(SLO_MS) is None
    for device in ("a", "b"):
        engine.publish(f"{prefix}/{device}/capacity", capacity(9_000.0))
    assert eventually(refuses(view, 9_000.0))


def test_an_object_stops_counting_once_it_is_too_old(
    view_on_wall: CapacityView, engine: Probe, wall: Wall, prefix: str
) -> None:
    """An object fresh when it came is ignored once `CAPACITY_MAX_AGE_MS` passed since it
    came, though nothing replaced it (the engine that published it died, its will emptying
    another device's topic)."""
    for device in ("a", "b"):
        engine.publish(f"{prefix}/{device}/capacity", capacity(9_000.0, at_s=T0_S))
    assert eventually(refuses(view_on_wall, 9_000.0))
    wall.now += CAPACITY_MAX_AGE_MS / 1000.0 + 1.0
    assert view_on_wall.readings() == {}
    assert view_on_wall.judge(SLO_MS) is None


@pytest.mark.parametrize(
    "payload",
    [
        b'{"start_wait_ms": ' + b"9" * 400 + b"}",
        b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"start_wait_ms": NaN}',
        b'{"running": -1, "start_wait_ms": 1}',
        b'{"start_wait_ms": 1e300}',
        b"\xff\xfe",
    ],
    ids=["400-digit integer", "nested 100,000 deep", "NaN", "negative", "1e300", "not UTF-8"],
)
def test_an_unreadable_object_voids_the_devices_last_one(
    view: CapacityView, engine: Probe, payload: bytes, prefix: str
) -> None:
    """After a refusing object, an unreadable one leaves nothing known of that device: no
    refusal (before, the reader's exception left the refusal in force for good, and a 1e300
    wait refused with a 298-digit Retry-After)."""
    for device in ("a", "b"):
        engine.publish(f"{prefix}/{device}/capacity", capacity(9_000.0))
    assert eventually(refuses(view, 9_000.0))
    for device in ("a", "b"):
        engine.publish(f"{prefix}/{device}/capacity", payload)
    assert eventually(admits(view))
    assert view.link.errors == 0
    assert isinstance(read_capacity(payload), Unreadable)


def test_an_emptied_topic_removes_the_object(
    view: CapacityView, engine: Probe, prefix: str
) -> None:
    """An empty retained payload (the engine stopped, or its will) removes that device's
    object, and is not counted unreadable."""
    engine.publish(f"{prefix}/a/capacity", capacity(9_000.0))
    engine.publish(f"{prefix}/b/capacity", capacity(500.0))
    assert eventually(admits(view))
    engine.publish(f"{prefix}/b/capacity", b"")
    assert eventually(refuses(view, 9_000.0))
    assert view.unreadable == 0


def test_retry_after_is_at_most_a_few_start_slos() -> None:
    """`Retry-After` is the wait beyond the SLO, at least 1 s and at most 4 start SLOs (12 s
    for 3 s): a forged 1e9 or 1e300 ms is no 11-day or 298-digit header; the message says a
    wait of at most 10 minutes."""
    assert Refusal(3_001.0, SLO_MS).retry_after_s == 1
    assert Refusal(5_001.0, SLO_MS).retry_after_s == 3
    assert Refusal(1e9, SLO_MS).retry_after_s == 12
    assert Refusal(1e300, SLO_MS).retry_after_s == 12
    assert Refusal(1e300, 500.0).retry_after_s == 2
    assert b"600.0 s" in Refusal(1e300, SLO_MS).body()


@pytest.mark.asyncio
async def test_the_middleware_refuses_with_a_bounded_retry_after(
    view: CapacityView, engine: Probe, prefix: str
) -> None:
    """Through the ASGI middleware: with both devices' fresh objects predicting 1e9 ms (11
    days), a completion is refused with 503 and `Retry-After: 12` (before: 999997). (A wait
    beyond 2^53 ms is no number a reader takes: the object is unreadable.)"""
    for device in ("a", "b"):
        engine.publish(f"{prefix}/{device}/capacity", capacity(1e9))
    assert eventually(refuses(view))
    sent: list[dict[str, Any]] = []

    async def app(_scope: Any, _receive: Any, _send: Any) -> None:
        raise AssertionError("a refused request reaches no app")

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    middleware = EdgemonShedMiddleware(app, view=view, slo_ms=SLO_MS)
    await middleware({"type": "http", "method": "POST", "path": "/v1/completions"}, receive, send)
    assert sent[0]["status"] == 503
    assert dict(sent[0]["headers"])[b"retry-after"] == b"12"


def test_a_view_that_hears_nothing_says_so_once(
    view_on_wall: CapacityView, wall: Wall, caplog: pytest.LogCaptureFixture, prefix: str
) -> None:
    """Connected, with no object for longer than `CAPACITY_MAX_AGE_MS` (no engine, or an ACL
    that withholds the topic: Mosquitto's acl_file grants the subscription), a request's
    judgement logs one warning naming the topics; nothing is refused (before: silence)."""
    view = view_on_wall
    with caplog.at_level(logging.WARNING, logger="edgemon.client"):
        assert view.judge(SLO_MS) is None
        assert not caplog.records
        wall.now += CAPACITY_MAX_AGE_MS / 1000.0 + 1.0
        for _ in range(3):
            assert view.judge(SLO_MS) is None
    (warning,) = caplog.records
    assert "no fresh capacity object" in warning.getMessage()
    assert f"{prefix}/a/capacity" in warning.getMessage()


def test_a_refused_subscription_is_an_error_and_a_count(
    subscriptions_denied_broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """A broker whose ACL refuses the capacity topics in its SUBACK: the view's link logs one
    error naming them and counts them (before: nothing said, shedding silently off)."""
    prefix = subscriptions_denied_broker.prefix  # edgemon's default, as the ACL has it
    with caplog.at_level(logging.ERROR, logger="edgemon.client"):
        view = CapacityView(config(subscriptions_denied_broker, "a", "b")).open()
        try:
            assert eventually(lambda: view.link.refused != ())
            assert view.link.refused == (f"{prefix}/a/capacity", f"{prefix}/b/capacity")
            assert view.link.subscriptions_refused == 2
        finally:
            view.close()
    (error,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "refused the subscription" in error.getMessage()
    assert f"{prefix}/a/capacity" in error.getMessage()


def test_the_publisher_refreshes_its_object(mosquitto_broker: Broker) -> None:
    """With nothing changing, the engine's object is published again every `refresh_s`, each
    time with the `t_ms` of that publication (so readers can tell a live engine's object from
    a dead one's)."""
    wall = Wall()
    topic = mosquitto_broker.topic("a", "capacity")
    with probe(mosquitto_broker.host, mosquitto_broker.port, topic) as watcher:
        publisher = CapacityPublisher(
            config(mosquitto_broker, "a"), min_interval_s=0.05, refresh_s=0.2, wall=wall
        ).open()
        try:
            publisher.update(realtime_streams=4, running=1, waiting=0, start_wait_ms=100.0, shed={})
            assert eventually(lambda: len(watcher.seen) >= 1)
            wall.now += 60.0
            assert eventually(lambda: any(m.json()["t_ms"] > T0_S * 1000 + 59_000
                                          for m in watcher.seen))  # fmt: skip
        finally:
            publisher.close()
    objects = [m.json() for m in watcher.seen if m.payload]
    assert len(objects) >= 2
    assert {o["running"] for o in objects} == {1}


def test_the_publisher_bounds_the_http_servers_it_follows(
    mosquitto_broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """Refusal counts from more than `MAX_SHED_SERVERS` servers: the others are ignored, with
    one warning; a count that jumps to 2^53 rises by `SHED_BURST` at most (before: one entry
    per topic, and any count taken)."""
    shed = mosquitto_broker.topic("a", "capacity", "shed")
    publisher = CapacityPublisher(config(mosquitto_broker, "a"), min_interval_s=0.05).open()
    try:
        assert publisher.link.wait_connected(30)
        with (
            caplog.at_level(logging.WARNING, logger="edgemon.client"),
            probe(mosquitto_broker.host, mosquitto_broker.port) as servers,
        ):
            for n in range(MAX_SHED_SERVERS + 4):
                servers.publish(f"{shed}/server-{n}", {"shed_total": 1})
            assert eventually(lambda: publisher.servers_ignored == 4)
            assert publisher.http_shed == MAX_SHED_SERVERS
            servers.publish(f"{shed}/server-0", {"shed_total": 2**53})
            assert eventually(lambda: publisher.http_shed > MAX_SHED_SERVERS)
            assert publisher.http_shed == MAX_SHED_SERVERS + SHED_BURST
        warnings = [r for r in caplog.records if "HTTP servers report refusals" in r.getMessage()]
        assert len(warnings) == 1
    finally:
        publisher.close()
