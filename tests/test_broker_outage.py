"""Broker outage (reliability.md): the test stops and restarts its real Mosquitto (persistence on)
while a device publishes chunks at QoS 1 to a persistent-session edgemon, and counts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import TYPE_CHECKING, Any

import aiomqtt
import pytest

from edgemon.daemon import Daemon
from edgemon.settings import HttpSettings, MqttSettings, Settings, StateSettings

from clients import scrape
from daemons import logged, running
from ports import MosquittoServer
from scrapes import samples

if TYPE_CHECKING:
    from collections.abc import Iterator, MutableMapping
    from pathlib import Path

    from edgemon.adapters.connection_state import ConnectionState

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

P = "edgemon/v1"
DEVICES = ("out1", "out2")
CHUNKS_PER_DEVICE = 150
#: Between two publishes of the device (each waits for its PUBACK first).
PUBLISH_EVERY_S = 0.008
#: The device gives up on a PUBACK after this long and publishes the same chunk again.
PUBACK_TIMEOUT_S = 0.5


@pytest.fixture
def persistent_mosquitto(tmp_path: Path) -> Iterator[MosquittoServer]:
    """A running Mosquitto with persistence in `tmp_path`, restartable by the test."""
    server = MosquittoServer(tmp_path, persistence=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Device:
    """Publishes its chunks in order at QoS 1, each until the broker acknowledges it: a failed
    or unacknowledged publish is sent again, same seq, same bytes, on a new connection."""

    def __init__(self, port: int, messages: list[tuple[str, bytes]]) -> None:
        self._port = port
        self._messages = messages
        self.acked = 0
        #: Acknowledged while edgemon had no session: queued for it by the broker.
        self.acked_while_edgemon_away = 0
        self.retries = 0
        self.progress = asyncio.Event()

    async def run(self, edgemon: ConnectionState) -> None:
        messages = self._messages
        while self.acked < len(messages):
            try:
                async with aiomqtt.Client("127.0.0.1", self._port, timeout=1) as client:
                    while self.acked < len(messages):
                        topic, payload = messages[self.acked]
                        await client.publish(topic, payload, qos=1, timeout=PUBACK_TIMEOUT_S)
                        self.acked += 1
                        self.acked_while_edgemon_away += not edgemon.connected
                        self.progress.set()
                        await asyncio.sleep(PUBLISH_EVERY_S)
            except aiomqtt.MqttError:
                self.retries += 1
                await asyncio.sleep(0.05)

    async def until_acked(self, count: int) -> None:
        while self.acked < count:
            self.progress.clear()
            await self.progress.wait()


def chunks() -> list[tuple[str, bytes]]:
    """Both devices' streams interleaved: a start, then chunks of 200 ms audio, seq 0, 1, …"""
    messages = []
    t0 = time.time() * 1000.0
    for device in DEVICES:
        start = {"type": "start", "stream": "s", "t_ms": t0}
        messages.append((f"{P}/{device}/events", json.dumps(start).encode()))
    for seq in range(CHUNKS_PER_DEVICE):
        for device in DEVICES:
            chunk = {
                "type": "chunk", "stream": "s", "t_ms": t0 + seq * 10, "seq": seq,
                "audio_ms": 200, "eta_ms": 5000,
            }  # fmt: skip
            messages.append((f"{P}/{device}/events", json.dumps(chunk).encode()))
    return messages


async def chunks_counted(http_port: int) -> float:
    return sum(samples((await scrape(http_port, "/metrics"))[1], "edgemon_chunks_total").values())


async def test_broker_outage_loses_and_doubles_nothing(
    persistent_mosquitto: MosquittoServer,
    tmp_path: Path,
    captured_logs: list[MutableMapping[str, Any]],
) -> None:
    """While a device publishes 300 chunks at QoS 1, its Mosquitto (persistence on) is stopped
    and started again. During the outage `/readyz` is 503 and `edgemon_mqtt_connected` 0, and
    edgemon retries with growing jittered delays; the broker is restarted while edgemon waits
    out a delay, so chunks the device publishes then are queued for edgemon's persistent
    session. Afterwards `/readyz` is 200, one reconnect is counted (and no session lost),
    both streams are the ones
    started before (no new stream, no underrun), and `edgemon_chunks_total` summed over the
    devices equals exactly the number of chunks the device got PUBACKs for: the ones it
    published twice (no PUBACK in time) are counted as `duplicate`, not as chunks."""
    broker = persistent_mosquitto
    settings = Settings(
        mqtt=MqttSettings(url=f"mqtt://127.0.0.1:{broker.port}", client_id="edgemon-outage"),
        http=HttpSettings(listen="127.0.0.1:0"),
        state=StateSettings(dir=tmp_path / "no-state"),
    )
    assert settings.mqtt.persistent_session
    assert settings.mqtt.qos == 1
    daemon = Daemon(settings, environ={}, install_signal_handlers=False)
    messages = chunks()
    chunk_count = len(DEVICES) * CHUNKS_PER_DEVICE
    device_task: asyncio.Task[None] | None = None
    async with (
        running(daemon, start_within_s=20, stop_within_s=6, logs=captured_logs),
        asyncio.timeout(20),
    ):
        try:
            http = daemon.http_port
            assert http is not None
            device = Device(broker.port, messages)
            device_task = asyncio.create_task(device.run(daemon.connection), name="device")
            await device.until_acked(100)

            broker.stop()  # ------------------------------------------------ outage
            stopped_at = time.monotonic()
            while (await scrape(http, "/readyz"))[0] != 503:  # noqa: ASYNC110 - polling HTTP
                await asyncio.sleep(0.01)
            metrics = (await scrape(http, "/metrics"))[1]
            assert samples(metrics, "edgemon_mqtt_connected") == {(): 0.0}
            # Restart while edgemon waits out a delay of at least 1 s (its third or later
            # retry), so the device's next chunks reach the broker before edgemon does.
            while not any(
                d["delay_s"] >= 1.0 for d in logged(captured_logs, "mqtt_reconnect_scheduled")
            ):
                assert (await scrape(http, "/readyz"))[0] == 503
                assert (await scrape(http, "/healthz"))[0] == 200
                await asyncio.sleep(0.02)
            acked_during_outage = device.acked
            broker.start()  # ------------------------------------------------ back
            outage_s = time.monotonic() - stopped_at
            while (await scrape(http, "/readyz"))[0] != 200:  # noqa: ASYNC110 - polling HTTP
                await asyncio.sleep(0.02)

            await device_task
            while await chunks_counted(http) < chunk_count:  # noqa: ASYNC110 - polling HTTP
                await asyncio.sleep(0.02)
            # No wait for a "late" duplicate: the device sent each message only after the
            # previous one's PUBACK, so the broker delivered every copy of the earlier ones
            # before the last chunk, which was just counted.
            metrics = (await scrape(http, "/metrics"))[1]
            received = daemon.monitor.messages
        finally:
            if device_task is not None:
                device_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await device_task

    chunks_total = samples(metrics, "edgemon_chunks_total")
    results = {dict(k)["result"]: v for k, v in samples(metrics, "edgemon_messages_total").items()}
    print(  # the numbers behind the claim, shown with -s
        f"outage {outage_s:.2f} s; acked before {acked_during_outage}, while edgemon away "
        f"{device.acked_while_edgemon_away}; device retries {device.retries}; results {results}"
    )
    assert device.acked == len(messages)  # every start and chunk, each acknowledged once
    assert sum(chunks_total.values()) == chunk_count
    assert chunks_total == {(("device", d),): float(CHUNKS_PER_DEVICE) for d in DEVICES}
    assert results.get("gap", 0.0) == 0.0
    assert results["accepted"] == len(messages)
    # Every copy beyond the first of a message is a `duplicate`, never a chunk; at most one
    # per retry of the device.
    assert results.get("duplicate", 0.0) == received - len(messages)
    assert received - len(messages) <= device.retries
    assert device.acked_while_edgemon_away > 0, "nothing was queued for edgemon's session"
    assert samples(metrics, "edgemon_mqtt_connected") == {(): 1.0}
    assert samples(metrics, "edgemon_mqtt_reconnects_total") == {(): 1.0}
    assert samples(metrics, "edgemon_mqtt_sessions_lost_total") == {(): 0.0}  # it persisted
    assert samples(metrics, "edgemon_streams_started_total") == {
        (("device", d),): 1.0 for d in DEVICES
    }
    assert samples(metrics, "edgemon_streams_active") == {(("device", d),): 1.0 for d in DEVICES}
    assert set(samples(metrics, "edgemon_underruns_total").values()) == {0.0}
    delays = [fields["delay_s"] for fields in logged(captured_logs, "mqtt_reconnect_scheduled")]
    assert len(delays) >= 2
    for attempt, delay in enumerate(delays):  # Backoff: 0.5 s × 2ⁿ × uniform(0.5, 1)
        assert 0.25 * 2**attempt - 1e-3 <= delay <= 0.5 * 2**attempt + 1e-3, delays
