"""A restarted `edgemon run` decides first, then publishes each device's throttle as of now
(docs/reliability.md, "After a restart"; docs/protocol.md, the throttle object's `t_ms`).

A device's stream is at risk, so edgemon throttles it; edgemon is stopped (SIGTERM: its
farewell releases the throttle; SIGKILL: the retained `true` stays) while the stream goes on,
healthy, into the broker's queue for edgemon's persistent session. Started again on the same
state directory and client id, edgemon applies the log and that backlog before it publishes:
one object for the device, `throttle: false`, stamped no earlier than the last chunk queued.
The restored state is not published first: its `true`, stamped where the device's clock
resumed (seconds in the past), would hold the device's requests back for nothing.
"""

from __future__ import annotations

import asyncio
import signal
import time
from typing import TYPE_CHECKING, Any

import pytest

from edgemon.daemon import Daemon
from edgemon.replay import replay
from edgemon.settings import HttpSettings, MqttSettings, Settings, StateSettings
from edgemon.trace import read_trace

from daemons import start, stop
from mqtt_probe import probe
from processes import edgemon_process

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from brokers import Broker
    from mqtt_probe import Probe, Seen

pytestmark = pytest.mark.integration

DEVICE = "resumed"
#: How long edgemon is down while the stream goes on (chunks every 100 ms).
DOWN_S = 1.5


class StampingClock:
    """Wall milliseconds, as the Reporter's default clock; keeps the last one it gave."""

    def __init__(self) -> None:
        self.last = 0.0

    def __call__(self) -> float:
        self.last = time.time() * 1000.0
        return self.last


def objects(watch: Probe, after: int, topic: str) -> list[dict[str, Any]]:
    """The throttle objects on `topic` the probe saw from index `after` on (empty payloads
    skipped)."""
    return [seen.json() for seen in watch.seen[after:] if seen.topic == topic and seen.payload]


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_restart_publishes_the_state_as_of_now_once(
    mosquitto_broker: Broker, tmp_path: Path, stop: signal.Signals
) -> None:
    """Throttled, stopped (`stop`), down 1.5 s while the stream's queued chunks make it safe,
    started again: the restarted edgemon's first throttle object for the device is its
    only one until then, says `false`, and carries a `t_ms` no earlier than the last chunk
    queued while it was down (not a stale `true` followed by `false`)."""
    broker = mosquitto_broker
    topic = broker.topic(DEVICE, "throttle")
    clock = StampingClock()
    with (
        probe(broker.host, broker.port, topic) as watch,
        broker.reporter(DEVICE, "resumed-reporter", clock=clock) as reporter,
    ):
        with edgemon_process(broker, tmp_path) as first:
            reporter.start("s")
            reporter.chunk("s", audio_ms=300, eta_ms=2000)  # due long after it runs dry
            assert reporter.flush(15)
            assert watch.wait_for(
                lambda _: any(o["throttle"] for o in objects(watch, 0, topic)), timeout=30
            ), objects(watch, 0, topic)
            first.process.send_signal(stop)
            first.process.wait(timeout=10)
            while_down = time.monotonic()
            while time.monotonic() - while_down < DOWN_S:
                reporter.chunk("s", audio_ms=1000, eta_ms=50)  # well ahead: safe again
                time.sleep(0.1)
            assert reporter.flush(15)
            last_queued = clock.last
        before = len(watch.seen)
        with edgemon_process(broker, tmp_path):
            assert watch.wait_for(lambda _: bool(objects(watch, before, topic)), timeout=30)
            published = objects(watch, before, topic)
            first_object = published[0]
            assert first_object["throttle"] is False, published
            assert first_object["t_ms"] >= last_queued, (first_object, last_queued)
            reporter.end("s")
            assert reporter.flush(15)
        assert not any(o["throttle"] for o in objects(watch, before, topic)), objects(
            watch, before, topic
        )


@pytest.mark.asyncio
async def test_replay_of_a_trace_recorded_across_a_restart_gives_what_was_published(
    mosquitto_broker: Broker, tmp_path: Path
) -> None:
    """The same story with an in-process daemon recording (`record`, as `run --record`
    does) into one file across the clean stop and the restart: `edgemon replay`'s throttle
    lines for that trace are the throttle objects the daemons published, in order, with the
    same state and `t_ms` (`true`; the farewell's `false`; after the restart, the state as of
    then, `false`): the trace's marks carry the stop, the restart's cut and the moment the
    restarted daemon published. (The stream ends in the second run: nothing runs on.)"""
    broker = mosquitto_broker
    url, topic = broker.url, broker.topic(DEVICE, "throttle")
    state_dir = tmp_path / "state"
    trace = tmp_path / "trace.jsonl"
    settings = Settings(
        mqtt=MqttSettings(
            url=url,
            client_id=broker.client_id("edgemon-resume-record"),
            topic_prefix=broker.prefix,
        ),
        http=HttpSettings(listen="127.0.0.1:0"),
        state=StateSettings(dir=state_dir, snapshot_interval_s=3600),
    )

    async def run_until(done: Callable[[], bool], first: Callable[[], object] = int) -> None:
        """A daemon recording into `trace`: started, `first()`, stopped once `done()`."""
        with trace.open("a", encoding="utf-8", buffering=1) as record:
            daemon = Daemon(settings, environ={}, record=record, install_signal_handlers=False)
            task = await start(daemon)
            try:
                first()
                assert await asyncio.to_thread(watch.wait_for, lambda _: done(), 30)
            finally:
                await stop(daemon, task)

    with (
        probe(broker.host, broker.port, topic) as watch,
        broker.reporter(DEVICE, "recorded-reporter") as reporter,
    ):

        def at_risk() -> None:
            reporter.start("s")
            reporter.chunk("s", audio_ms=300, eta_ms=2000)

        await run_until(lambda: any(o["throttle"] for o in objects(watch, 0, topic)), at_risk)
        while_down = time.monotonic()
        while time.monotonic() - while_down < DOWN_S:
            reporter.chunk("s", audio_ms=1000, eta_ms=50)
            await asyncio.sleep(0.1)
        assert await asyncio.to_thread(reporter.flush, 15)
        before = len(objects(watch, 0, topic))
        await run_until(lambda: len(objects(watch, 0, topic)) > before, lambda: reporter.end("s"))
    published = [(o["throttle"], o["t_ms"]) for o in objects(watch, 0, topic)]
    with trace.open(encoding="utf-8") as lines:
        replayed = [
            (line["active"], line["t_ms"])
            for line in replay(read_trace(lines), settings.engine_config(), sample_ms=None)
            if line["kind"] == "throttle"
        ]
    assert [active for active, _ in published] == [True, False, False]
    assert replayed == [(active, pytest.approx(t_ms, abs=1e-6)) for active, t_ms in published]


def test_online_comes_only_after_the_fresh_throttle_objects(
    mosquitto_broker: Broker, tmp_path: Path
) -> None:
    """Throttled, SIGKILLed (the retained `throttle: true` stays, and the will says
    `offline`), started again with its stream still at risk: on the wire, as a subscriber
    sees it, the restarted process (its own `started_ms`) says `online` only after the
    device's fresh throttle object (a higher `seq`) has come. Until then its status says
    `offline`, so no gate takes the stale `true` for the word of a live instance."""
    broker = mosquitto_broker
    topic = broker.topic(DEVICE, "throttle")
    status = broker.topic("_edgemon", broker.client_id("edgemon-loop"), "status")
    with (
        probe(broker.host, broker.port, topic, status) as watch,
        broker.reporter(DEVICE, "announced-reporter") as reporter,
    ):
        with edgemon_process(broker, tmp_path) as first:
            reporter.start("s")
            reporter.chunk("s", audio_ms=300, eta_ms=2000)  # due long after it runs dry
            assert reporter.flush(15)
            assert watch.wait_for(
                lambda _: any(o["throttle"] for o in objects(watch, 0, topic)), timeout=30
            ), objects(watch, 0, topic)
            first.process.kill()
            first.process.wait(timeout=10)
        stale = objects(watch, 0, topic)[-1]
        assert stale["throttle"] is True
        killed = {s.json()["started_ms"] for s in watch.seen if s.topic == status}
        assert len(killed) == 1

        def restarted(seen: list[Seen]) -> list[tuple[int, dict[str, Any]]]:
            """(index, object) of the restarted process's statuses, in order."""
            return [
                (i, m.json())
                for i, m in enumerate(seen)
                if m.topic == status and m.json()["started_ms"] not in killed
            ]

        def said_online(seen: list[Seen]) -> bool:
            return any(obj["state"] == "online" for _, obj in restarted(seen))

        def fresh(seen: list[Seen]) -> list[int]:
            """Where the device's objects published after the kill are."""
            return [
                i
                for i, m in enumerate(seen)
                if m.topic == topic and m.payload and m.json()["seq"] > stale["seq"]
            ]

        with edgemon_process(broker, tmp_path):
            assert watch.wait_for(lambda s: said_online(s) and bool(fresh(s)), 30), watch.seen
            seen = list(watch.seen)
        reporter.end("s")
    online = next(i for i, obj in restarted(seen) if obj["state"] == "online")
    first_fresh = fresh(seen)[0]
    assert first_fresh < online, [(m.topic, m.json()) for m in seen]
    assert {obj["state"] for i, obj in restarted(seen) if i < first_fresh} == {"offline"}
