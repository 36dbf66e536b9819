"""The daemon in-process on a real Mosquitto: throttle objects, timers, HTTP, stop, reload,
record and replay. Each test runs `Daemon.run()` as a task and stops it like SIGTERM would
(`request_stop()`, the signal handler's own call): `daemons.running()`."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

import pytest

from edgemon.daemon import Daemon
from edgemon.replay import replay
from edgemon.settings import Settings, load_settings
from edgemon.trace import TraceMark, read_trace

from clients import (
    P,
    Watcher,
    chunk,
    device,
    now_ms,
    scrape,
    send,
    settings_for,
    throttle_on_then_off,
    watching,
)
from daemons import PausableClock, running
from scrapes import sample

if TYPE_CHECKING:
    from pathlib import Path

    from brokers import Broker
    from ports import MosquittoServer

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

# The helpers once defined here live in `clients` and `scrapes`; they stay importable from
# here for tests written against them (new tests import them from their modules).
__all__ = [
    "P",
    "Watcher",
    "chunk",
    "device",
    "now_ms",
    "sample",
    "scrape",
    "send",
    "settings_for",
    "throttle_on_then_off",
    "watching",
]


async def test_scenario_publishes_throttle_on_then_off(mosquitto_broker: Broker) -> None:
    """A device's stream running low turns its throttle on at the timer's instant (no message
    needed) and a refill turns it off after min-on: the subscriber sees retained QoS 1 objects
    `true` then `false` with increasing `seq`, and `online` status first. The onset is
    stamped with the crossing instant on the device's clock: chunk 0's `t_ms` + 220 ms (not
    when the timer happened to fire on a loaded machine)."""
    broker = mosquitto_broker
    daemon = Daemon(settings_for(broker), environ={}, install_signal_handlers=False)
    async with watching(broker) as watcher:
        async with running(daemon):
            await watcher.until(lambda: "online" in watcher.statuses())
            t0 = await throttle_on_then_off(broker, watcher, "dev1")
            on, off = watcher.throttles("dev1")
        # Stopped: the offline status is on its way through the broker to the watcher.
        await watcher.until(lambda: watcher.statuses()[-1:] == ["offline"])
    assert watcher.statuses()[0] == "online"
    assert (on["throttle"], off["throttle"]) == (True, False)
    assert on["seq"] < off["seq"]
    assert on["device"] == "dev1"
    assert on["streams"] == ["s1"]
    assert on["margin_ms"] == 80.0
    assert on["min_headroom_ms"] == pytest.approx(80.0, abs=1e-6)  # the crossing instant
    assert on["t_ms"] == pytest.approx(t0 + 220, abs=1e-6)
    assert off["t_ms"] == pytest.approx(on["t_ms"] + 250, abs=1e-6)  # released at min-on
    assert off["streams"] == []


async def test_deadline_lateness_is_exported(mosquitto_broker: Broker) -> None:
    """Every transition the deadline task fires counts in `edgemon_deadline_lateness_seconds`
    (docs/runbook.md): after a timer-driven throttle onset the histogram has observations, each in a
    finite bucket (no deadline here is served a second late)."""
    broker = mosquitto_broker
    daemon = Daemon(settings_for(broker), environ={}, install_signal_handlers=False)
    async with watching(broker) as watcher, running(daemon):
        await watcher.until(lambda: "online" in watcher.statuses())
        await throttle_on_then_off(broker, watcher, "dev1")
        assert daemon.http_port is not None
        status, text = await scrape(daemon.http_port, "/metrics")
    assert status == 200
    name = "edgemon_deadline_lateness_seconds"
    count = sample(text, f"{name}_count", {})
    assert count is not None
    assert count >= 1
    assert sample(text, f"{name}_bucket", {"le": "1.0"}) == count
    assert sample(text, f"{name}_sum", {}) is not None


async def test_throttle_objects_are_retained(mosquitto_broker: Broker) -> None:
    """A subscriber arriving later gets the device's last throttle object (retained)."""
    broker = mosquitto_broker
    daemon = Daemon(settings_for(broker), environ={}, install_signal_handlers=False)
    async with running(daemon), watching(broker) as early, device(broker) as client:
        await send(client, "dev9", chunk("s", 0, 30, 50))  # at risk at once
        await early.until(lambda: len(early.throttles("dev9")) >= 1)  # published
        async with watching(broker) as late:
            await late.until(lambda: len(late.throttles("dev9")) >= 1)
            retained = [r for t, _, r in late.seen if t == broker.topic("dev9", "throttle")]
            assert retained[0] is True
            assert late.throttles("dev9")[0]["throttle"] is True


async def test_underrun_detected_by_timer_alone(mosquitto_broker: Broker) -> None:
    """A stream whose audio runs out with no further message is counted as an underrun from
    the timers alone (it runs dry, and with no late chunk it is confirmed allowed_lateness_ms
    later, docs/semantics.md): `/metrics` (parsed as Prometheus would) shows it, `/api/v1/streams`
    too."""
    broker = mosquitto_broker
    daemon = Daemon(settings_for(broker), environ={}, install_signal_handlers=False)
    async with running(daemon), device(broker) as client:
        await send(client, "dev2", chunk("s", 0, 150, 50))
        assert daemon.http_port is not None
        status, text = await scrape(daemon.http_port, "/metrics")
        assert status == 200
        assert sample(text, "edgemon_underruns_total", {"device": "dev2"}) in {None, 0.0}
        for _ in range(200):  # confirmed 1 s after it ran dry; generous for a loaded machine
            await asyncio.sleep(0.05)
            _, text = await scrape(daemon.http_port, "/metrics")
            if sample(text, "edgemon_underruns_total", {"device": "dev2"}) == 1.0:
                break
        assert sample(text, "edgemon_underruns_total", {"device": "dev2"}) == 1.0
        assert sample(text, "edgemon_mqtt_connected", {}) == 1.0
        status, body = await scrape(daemon.http_port, "/api/v1/streams")
        assert status == 200
        (dev,) = json.loads(body)["devices"]
        assert dev["device"] == "dev2"
        assert dev["streams"][0]["underruns"] == 1


async def test_readyz_follows_the_broker(mosquitto_server: MosquittoServer) -> None:
    """`/readyz` is 200 while subscribed, 503 once the broker is gone, 200 again after it is
    back (reconnected with backoff); stream state survives and reconnects are counted."""
    daemon = Daemon(
        settings_for(mosquitto_server.broker), environ={}, install_signal_handlers=False
    )
    async with running(daemon):
        port = daemon.http_port
        assert port is not None
        async with device(mosquitto_server.broker) as client:
            await send(client, "dev3", chunk("s", 0, 60_000, 50))
        assert (await scrape(port, "/readyz"))[0] == 200
        mosquitto_server.stop()
        async with asyncio.timeout(3):
            while (await scrape(port, "/readyz"))[0] != 503:  # noqa: ASYNC110 - polling HTTP
                await asyncio.sleep(0.05)
        assert (await scrape(port, "/healthz"))[0] == 200
        mosquitto_server.start()
        async with asyncio.timeout(5):
            while (await scrape(port, "/readyz"))[0] != 200:  # noqa: ASYNC110 - polling HTTP
                await asyncio.sleep(0.05)
        _, text = await scrape(port, "/metrics")
        assert sample(text, "edgemon_mqtt_reconnects_total", {}) == 1.0
        assert sample(text, "edgemon_streams_active", {"device": "dev3"}) == 1.0


async def test_stop_releases_throttles_then_goes_offline(
    mosquitto_broker: Broker,
) -> None:
    """On stop (SIGTERM's handler) every throttled device gets `throttle: false`, then the
    status goes `offline`, and `run()` returns 0 (within a generous 10 s: how fast is not
    judged on a shared machine)."""
    broker = mosquitto_broker
    daemon = Daemon(settings_for(broker), environ={}, install_signal_handlers=False)
    async with watching(broker) as watcher, running(daemon) as task:
        async with device(broker) as client:
            await send(client, "dev4", chunk("a", 0, 30, 50))
            await send(client, "dev5", chunk("b", 0, 30, 50))
        await watcher.until(lambda: watcher.throttles("dev4") and watcher.throttles("dev5"))
        daemon.request_stop()
        async with asyncio.timeout(10):
            assert await task == 0
        await watcher.until(lambda: watcher.statuses()[-1:] == ["offline"])
    for dev in ("dev4", "dev5"):
        on, off = watcher.throttles(dev)
        assert (on["throttle"], off["throttle"]) == (True, False)
        assert off["seq"] > on["seq"]
    last_release = max(i for i, (t, o, _) in enumerate(watcher.seen) if t.endswith("throttle"))
    assert watcher.seen[last_release + 1 :][-1][1]["state"] == "offline"


async def test_reload_adopts_a_valid_file_and_keeps_the_running_one_otherwise(
    mosquitto_broker: Broker, tmp_path: Path
) -> None:
    """SIGHUP's reload takes a new margin into the running engine (streams kept: the live
    stream becomes at risk and the throttle goes on); an invalid file changes nothing."""
    broker = mosquitto_broker
    config = tmp_path / "edgemon.toml"
    config.write_text(
        f'[mqtt]\nurl = "{broker.url}"\nclient_id = "{broker.client_id("reload")}"\n'
        f'topic_prefix = "{broker.prefix}"\n[http]\nlisten = "127.0.0.1:0"\n',
        encoding="utf-8",
    )

    def load() -> Settings:
        return load_settings(config, environ={})

    daemon = Daemon(load(), environ={}, reload=load, install_signal_handlers=False)
    async with watching(broker) as watcher, running(daemon), device(broker) as client:
        await send(client, "dev6", chunk("s", 0, 60_000, 50))
        async with asyncio.timeout(10):
            while (dev6 := daemon.monitor.engine.device("dev6")) is None or not dev6.streams:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        assert not dev6.throttle_on  # 60 s of audio: far from the 80 ms margin
        assert watcher.throttles("dev6") == []
        config.write_text(config.read_text() + "[slack]\ndefault_margin_ms = -5\n")
        assert not daemon.reload()
        assert daemon.settings.slack.default_margin_ms == 80.0
        config.write_text(config.read_text().replace("-5", "100000"))
        daemon.request_reload()
        await watcher.until(lambda: len(watcher.throttles("dev6")) == 1)
        assert daemon.settings.slack.default_margin_ms == 100_000.0
        assert watcher.throttles("dev6")[0]["margin_ms"] == 100_000.0
        assert sum(len(d.streams) for d in daemon.monitor.engine.devices()) == 1


async def test_recorded_trace_replays_to_the_same_throttle_transitions(
    mosquitto_broker: Broker, tmp_path: Path
) -> None:
    """`--record` writes every received message; replaying the file through the engine gives
    the same throttle transitions (active, t_ms) that the daemon published live."""
    broker = mosquitto_broker
    trace = tmp_path / "trace.jsonl"
    with trace.open("a", encoding="utf-8", buffering=1) as record:
        daemon = Daemon(
            settings_for(broker), environ={}, record=record, install_signal_handlers=False
        )
        async with watching(broker) as watcher, running(daemon):
            await throttle_on_then_off(broker, watcher, "dev7")
            async with device(broker) as client:
                await send(client, "dev7", {"type": "hello"})  # rejected, recorded all the same
                await send(client, "dev8", chunk("x", 0, 100, 30))  # at risk at once
                await send(client, "dev8", chunk("x", 1, 300, 500, final=True))
            # dev8 at risk at once (on), then its final chunk plays out: off.
            await watcher.until(
                lambda: [o["throttle"] for o in watcher.throttles("dev8")][-1:] == [False]
            )
        live = [
            (o["device"], o["throttle"], o["t_ms"])
            for topic, o, _ in watcher.seen
            if topic.endswith("/throttle")
        ]
    records = list(read_trace(trace.read_text(encoding="utf-8").splitlines()))
    assert [r.mark for r in records if isinstance(r, TraceMark)] == ["stop"]  # the farewell
    assert len(records) - 1 == daemon.monitor.messages
    replayed = [
        (line["device"], line["active"], line["t_ms"])
        for line in replay(records, daemon.settings.engine_config(), sample_ms=None)
        if line["kind"] == "throttle"
    ]
    assert len(live) >= 4
    assert replayed == live


async def test_an_outage_confirms_no_underrun_that_late_chunks_retract(
    mosquitto_server: MosquittoServer,
) -> None:
    """semantics.md across a broker outage longer than `allowed_lateness_ms`: the buffer runs dry
    by what edgemon knows while the broker is down, but the device had its next chunk in time
    and the broker delivers it after the outage. edgemon holds confirmations while its input is
    lost, so the underrun it announced is retracted, not counted. The test holds edgemon's
    clock still from the chunk until edgemon knows the broker is gone, so the outage begins
    before the lateness runs out on edgemon's clock however slowly this machine runs."""
    clock = PausableClock()
    daemon = Daemon(
        settings_for(mosquitto_server.broker),
        environ={},
        install_signal_handlers=False,
        clock=clock.wall_clock(),
    )
    async with running(daemon):
        with clock.paused():
            t0 = now_ms()
            async with device(mosquitto_server.broker) as client:
                await send(
                    client, "late1", {"type": "chunk", "stream": "s", "t_ms": t0, "seq": 0,
                                      "audio_ms": 600, "eta_ms": 100},
                )  # fmt: skip
            dev = None
            async with asyncio.timeout(10):
                while dev is None or dev.stats.chunks < 1:
                    await asyncio.sleep(0.02)
                    dev = daemon.monitor.engine.device("late1")
            mosquitto_server.stop()
            async with asyncio.timeout(30):
                while daemon.connection.ready:  # noqa: ASYNC110 - a plain flag
                    await asyncio.sleep(0.02)
            # The buffer runs dry at t0 + 600 by what edgemon knows; the lateness (1 s) runs
            # out at t0 + 1600, on the device's clock: edgemon knew its input lost before.
            lateness_ends = t0 + 1_600
            assert dev.clock.now(daemon.clock.now_ms()) < lateness_ends
        # Until edgemon's clock is past the end of the lateness with no timer left due by then.
        async with asyncio.timeout(30):
            while True:
                due = dev.clock.to_wall(lateness_ends)
                deadline = daemon.monitor.next_deadline()
                if daemon.clock.now_ms() > due and (deadline is None or deadline > due):
                    break
                await asyncio.sleep(0.02)
        assert dev.stats.underruns == 0, "confirmed during the outage"
        mosquitto_server.start()
        async with asyncio.timeout(30):
            while not daemon.connection.subscribed:  # noqa: ASYNC110 - a plain flag
                await asyncio.sleep(0.02)
        async with device(mosquitto_server.broker) as client:
            await send(  # the chunk that reached the player at t0 + 500, delivered late
                client, "late1", {"type": "chunk", "stream": "s", "t_ms": t0 + 500, "seq": 1,
                                  "audio_ms": 600, "final": True},
            )  # fmt: skip
        async with asyncio.timeout(10):
            while dev.stats.chunks < 2:  # noqa: ASYNC110 - the engine has no event to await
                await asyncio.sleep(0.02)
        assert dev.stats.underruns_retracted == 1
        assert dev.stats.underruns == 0
