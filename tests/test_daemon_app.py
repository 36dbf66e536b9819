"""The daemon in-process on a real Mosquitto: throttle objects, timers, HTTP, stop, reload,
record and replay. Each test runs `Daemon.run()` as a task and stops it like SIGTERM would
(`request_stop()`, the signal handler's own call): `daemons.running()`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import TYPE_CHECKING, Any

import aiohttp
import aiomqtt
import pytest
from prometheus_client.parser import text_string_to_metric_families

from edgemon.daemon import Daemon
from edgemon.replay import replay
from edgemon.settings import HttpSettings, MqttSettings, Settings, load_settings
from edgemon.trace import TraceMark, read_trace

from daemons import running

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from ports import MosquittoServer

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

P = "edgemon/v1"


def settings_for(port: int, client_id: str = "edgemon-test", **sections: Any) -> Settings:
    return Settings(
        mqtt=MqttSettings(url=f"mqtt://127.0.0.1:{port}", client_id=client_id),
        http=HttpSettings(listen="127.0.0.1:0"),
        **sections,
    )


class Watcher:
    """A subscriber to every throttle and status topic, collecting (topic, object, retained)."""

    def __init__(self, client: aiomqtt.Client) -> None:
        self.client = client
        self.seen: list[tuple[str, dict[str, Any], bool]] = []
        self._changed = asyncio.Event()

    async def run(self) -> None:
        async for message in self.client.messages:
            assert isinstance(message.payload, bytes)
            self.seen.append((message.topic.value, json.loads(message.payload), message.retain))
            self._changed.set()

    def throttles(self, device: str) -> list[dict[str, Any]]:
        return [obj for topic, obj, _ in self.seen if topic == f"{P}/{device}/throttle"]

    def statuses(self) -> list[str]:
        return [obj["state"] for topic, obj, _ in self.seen if topic.endswith("/status")]

    async def until(self, predicate: Any, within_s: float = 3.0) -> None:
        async with asyncio.timeout(within_s):
            while not predicate():
                self._changed.clear()
                await self._changed.wait()


@contextlib.asynccontextmanager
async def watching(port: int) -> AsyncIterator[Watcher]:
    async with aiomqtt.Client("127.0.0.1", port, identifier=f"watch-{time.monotonic_ns()}") as c:
        await c.subscribe([(f"{P}/+/throttle", 1), (f"{P}/_edgemon/+/status", 1)])
        watcher = Watcher(c)
        task = asyncio.create_task(watcher.run())
        try:
            yield watcher
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


@contextlib.asynccontextmanager
async def device(port: int) -> AsyncIterator[aiomqtt.Client]:
    async with aiomqtt.Client("127.0.0.1", port, identifier=f"dev-{time.monotonic_ns()}") as c:
        yield c


async def send(client: aiomqtt.Client, device_id: str, *events: dict[str, Any]) -> None:
    payload = json.dumps(list(events) if len(events) > 1 else events[0])
    await client.publish(f"{P}/{device_id}/events", payload, qos=1)


def now_ms() -> float:
    return time.time() * 1000.0


def chunk(stream: str, seq: int, audio: float, eta: float, **extra: Any) -> dict[str, Any]:
    event = {"type": "chunk", "stream": stream, "t_ms": now_ms(), "seq": seq, "audio_ms": audio}
    return event | {"eta_ms": eta} | extra


async def scrape(port: int, path: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        return response.status, await response.text()


def sample(text: str, name: str, labels: dict[str, str]) -> float | None:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


async def throttle_on_then_off(port: int, watcher: Watcher, device_id: str) -> None:
    """Chunk 0 (300 ms audio, next chunk in 50 ms): headroom reaches the 80 ms margin 220 ms
    later with no message (timer → ON); chunk 1 brings 2 s of audio (→ OFF after min-on)."""
    async with device(port) as client:
        await send(client, device_id, {"type": "start", "stream": "s1", "t_ms": now_ms()})
        await send(client, device_id, chunk("s1", 0, 300, 50))
        await watcher.until(lambda: len(watcher.throttles(device_id)) >= 1)
        await send(client, device_id, chunk("s1", 1, 2000, 50))
        await watcher.until(lambda: len(watcher.throttles(device_id)) >= 2)
        await send(client, device_id, {"type": "end", "stream": "s1", "t_ms": now_ms()})


async def test_scenario_publishes_throttle_on_then_off(mosquitto_broker: tuple[str, int]) -> None:
    """A device's stream running low turns its throttle on at the timer's instant (no message
    needed) and a refill turns it off after min-on: the subscriber sees retained QoS 1 objects
    `true` then `false` with increasing `seq`, and `online` status first."""
    _, port = mosquitto_broker
    daemon = Daemon(settings_for(port), environ={}, install_signal_handlers=False)
    async with watching(port) as watcher, running(daemon):
        await watcher.until(lambda: "online" in watcher.statuses())
        t0 = now_ms()
        await throttle_on_then_off(port, watcher, "dev1")
        on, off = watcher.throttles("dev1")
    assert (on["throttle"], off["throttle"]) == (True, False)
    assert on["seq"] < off["seq"]
    assert on["device"] == "dev1"
    assert on["streams"] == ["s1"]
    assert on["margin_ms"] == 80.0
    assert on["min_headroom_ms"] == pytest.approx(80.0, abs=1e-6)  # the crossing instant
    assert on["t_ms"] == pytest.approx(t0 + 220, abs=30)
    assert off["t_ms"] == pytest.approx(on["t_ms"] + 250, abs=1e-6)  # released at min-on
    assert off["streams"] == []
    assert watcher.statuses()[-1] == "offline"  # clean stop


async def test_deadline_lateness_is_exported(mosquitto_broker: tuple[str, int]) -> None:
    """Every transition the deadline task fires counts in `edgemon_deadline_lateness_seconds`
    (docs/runbook.md): after a timer-driven throttle onset the histogram has observations, each in a
    finite bucket (no deadline here is served a second late)."""
    _, port = mosquitto_broker
    daemon = Daemon(settings_for(port), environ={}, install_signal_handlers=False)
    async with watching(port) as watcher, running(daemon):
        await watcher.until(lambda: "online" in watcher.statuses())
        await throttle_on_then_off(port, watcher, "dev1")
        assert daemon.http_port is not None
        status, text = await scrape(daemon.http_port, "/metrics")
    assert status == 200
    name = "edgemon_deadline_lateness_seconds"
    count = sample(text, f"{name}_count", {})
    assert count is not None
    assert count >= 1
    assert sample(text, f"{name}_bucket", {"le": "1.0"}) == count
    assert sample(text, f"{name}_sum", {}) is not None


async def test_throttle_objects_are_retained(mosquitto_broker: tuple[str, int]) -> None:
    """A subscriber arriving later gets the device's last throttle object (retained)."""
    _, port = mosquitto_broker
    daemon = Daemon(settings_for(port), environ={}, install_signal_handlers=False)
    async with running(daemon), device(port) as client:
        await send(client, "dev9", chunk("s", 0, 30, 50))  # at risk at once
        await asyncio.sleep(0.3)
        async with watching(port) as late:
            await late.until(lambda: len(late.throttles("dev9")) >= 1)
            retained = [r for t, _, r in late.seen if t == f"{P}/dev9/throttle"]
            assert retained[0] is True
            assert late.throttles("dev9")[0]["throttle"] is True


async def test_underrun_detected_by_timer_alone(mosquitto_broker: tuple[str, int]) -> None:
    """A stream whose audio runs out with no further message is counted as an underrun from
    the timers alone (it runs dry, and with no late chunk it is confirmed allowed_lateness_ms
    later, docs/semantics.md): `/metrics` (parsed as Prometheus would) shows it, `/api/v1/streams`
    too."""
    _, port = mosquitto_broker
    daemon = Daemon(settings_for(port), environ={}, install_signal_handlers=False)
    async with running(daemon), device(port) as client:
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
    daemon = Daemon(settings_for(mosquitto_server.port), environ={}, install_signal_handlers=False)
    async with running(daemon):
        port = daemon.http_port
        assert port is not None
        async with device(mosquitto_server.port) as client:
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
    mosquitto_broker: tuple[str, int],
) -> None:
    """On stop (SIGTERM's handler) every throttled device gets `throttle: false`, then the
    status goes `offline`, and `run()` returns 0 well within 5 s."""
    _, port = mosquitto_broker
    daemon = Daemon(settings_for(port), environ={}, install_signal_handlers=False)
    async with watching(port) as watcher, running(daemon) as task:
        async with device(port) as client:
            await send(client, "dev4", chunk("a", 0, 30, 50))
            await send(client, "dev5", chunk("b", 0, 30, 50))
        await watcher.until(lambda: watcher.throttles("dev4") and watcher.throttles("dev5"))
        started = time.monotonic()
        daemon.request_stop()
        async with asyncio.timeout(5):
            assert await task == 0
        elapsed = time.monotonic() - started
        await watcher.until(lambda: watcher.statuses()[-1:] == ["offline"])
    assert elapsed < 2.0
    for dev in ("dev4", "dev5"):
        on, off = watcher.throttles(dev)
        assert (on["throttle"], off["throttle"]) == (True, False)
        assert off["seq"] > on["seq"]
    last_release = max(i for i, (t, o, _) in enumerate(watcher.seen) if t.endswith("throttle"))
    assert watcher.seen[last_release + 1 :][-1][1]["state"] == "offline"


async def test_reload_adopts_a_valid_file_and_keeps_the_running_one_otherwise(
    mosquitto_broker: tuple[str, int], tmp_path: Path
) -> None:
    """SIGHUP's reload takes a new margin into the running engine (streams kept: the live
    stream becomes at risk and the throttle goes on); an invalid file changes nothing."""
    _, port = mosquitto_broker
    config = tmp_path / "edgemon.toml"
    config.write_text(
        f'[mqtt]\nurl = "mqtt://127.0.0.1:{port}"\nclient_id = "reload"\n'
        '[http]\nlisten = "127.0.0.1:0"\n',
        encoding="utf-8",
    )

    def load() -> Settings:
        return load_settings(config, environ={})

    daemon = Daemon(load(), environ={}, reload=load, install_signal_handlers=False)
    async with watching(port) as watcher, running(daemon), device(port) as client:
        await send(client, "dev6", chunk("s", 0, 60_000, 50))
        await asyncio.sleep(0.1)
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
    mosquitto_broker: tuple[str, int], tmp_path: Path
) -> None:
    """`--record` writes every received message; replaying the file through the engine gives
    the same throttle transitions (active, t_ms) that the daemon published live."""
    _, port = mosquitto_broker
    trace = tmp_path / "trace.jsonl"
    with trace.open("a", encoding="utf-8", buffering=1) as record:
        daemon = Daemon(
            settings_for(port), environ={}, record=record, install_signal_handlers=False
        )
        async with watching(port) as watcher, running(daemon):
            await throttle_on_then_off(port, watcher, "dev7")
            async with device(port) as client:
                await send(client, "dev7", {"type": "hello"})  # rejected, recorded all the same
                await send(client, "dev8", chunk("x", 0, 100, 30))  # at risk at once
                await send(client, "dev8", chunk("x", 1, 300, 500, final=True))
            await asyncio.sleep(0.7)
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
        for line in replay(records, Settings().engine_config(), sample_ms=None)
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
    lost, so the underrun it announced is retracted, not counted (before, the lateness timer
    confirmed it during the outage)."""
    daemon = Daemon(settings_for(mosquitto_server.port), environ={}, install_signal_handlers=False)
    async with running(daemon):
        t0 = time.time() * 1000.0
        async with device(mosquitto_server.port) as client:
            await send(
                client, "late1", {"type": "chunk", "stream": "s", "t_ms": t0, "seq": 0,
                                  "audio_ms": 600, "eta_ms": 100},
            )  # fmt: skip
        dev = None
        async with asyncio.timeout(5):
            while dev is None or dev.stats.chunks < 1:
                await asyncio.sleep(0.02)
                dev = daemon.monitor.engine.device("late1")
        mosquitto_server.stop()
        # The buffer runs dry at t0 + 600 by what edgemon knows; the lateness (1 s) runs out
        # at t0 + 1600 while the broker is still away.
        await asyncio.sleep(max(0.0, (t0 + 2_000 - time.time() * 1000.0) / 1000.0))
        assert dev.stats.underruns == 0, "confirmed during the outage"
        mosquitto_server.start()
        async with asyncio.timeout(30):
            while not daemon.connection.subscribed:  # noqa: ASYNC110 - a plain flag
                await asyncio.sleep(0.02)
        async with device(mosquitto_server.port) as client:
            await send(  # the chunk that reached the player at t0 + 500, delivered late
                client, "late1", {"type": "chunk", "stream": "s", "t_ms": t0 + 500, "seq": 1,
                                  "audio_ms": 600, "final": True},
            )  # fmt: skip
        async with asyncio.timeout(5):
            while dev.stats.chunks < 2:  # noqa: ASYNC110 - the engine has no event to await
                await asyncio.sleep(0.02)
        assert dev.stats.underruns_retracted == 1
        assert dev.stats.underruns == 0
