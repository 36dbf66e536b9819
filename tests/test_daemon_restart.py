"""Restart and crash with live streams on a real Mosquitto (reliability.md, docs/reliability.md).

A publisher keeps three healthy streams going on two devices (QoS 1, one 300 ms chunk per
stream every 200 ms, `eta_ms` and `audio_total_ms` on each, `t_ms` = wall ms) while edgemon is
stopped cleanly (in-process, `request_stop()` as SIGTERM does) or killed (a real process,
SIGKILL), and started again with the same state directory and client id (persistent session:
the broker queues what arrives meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

import aiohttp
import aiomqtt
import pytest

from edgemon.daemon import Daemon
from edgemon.settings import HttpSettings, MqttSettings, Settings, StateSettings

from amqtt_broker import AMQTT_NO_SESSION
from daemons import logged, running, start, stop
from scrapes import total

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, MutableMapping
    from pathlib import Path

    from brokers import Broker

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

PERIOD_S = 0.2
AUDIO_MS = 300.0
ETA_MS = 200.0
STREAMS = (("d0", "s0"), ("d0", "s1"), ("d1", "s2"))
#: Polls of `/api/v1/streams` after a restart, each at least 50 ms after the last.
POLLS = 10

Key = tuple[str, str]


def now_ms() -> float:
    return time.time() * 1000.0


class Publisher:
    """One QoS 1 chunk per stream every PERIOD_S until `finish()`, then a `final` chunk each.

    `sent[key]` holds the `t_ms` of each chunk of the stream (index = seq), appended as it is
    published (on a loaded machine edgemon can apply a chunk before this process has read the
    broker's PUBACK); once `finish()` returns, the broker has acknowledged every one.
    """

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.sent: dict[Key, list[float]] = {key: [] for key in STREAMS}
        self._finish = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def finish(self) -> None:
        self._finish.set()

    @property
    def count(self) -> int:
        return sum(len(times) for times in self.sent.values())

    def implied_slack(self, key: Key, chunks: int, device_ms: float) -> float:
        """The slack at device time `device_ms` that the stream's first `chunks` chunks imply
        (the player started with the first one, at its `t_ms`)."""
        return AUDIO_MS * chunks - (device_ms - self.sent[key][0])

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        broker = self.broker
        identifier = broker.client_id(f"pub-{time.monotonic_ns()}")
        async with aiomqtt.Client(broker.host, broker.port, identifier=identifier) as client:
            tick = loop.time()
            while True:
                final = self._finish.is_set()
                for device, stream in STREAMS:
                    times = self.sent[device, stream]
                    seq, t = len(times), now_ms()
                    chunk = {
                        "type": "chunk",
                        "stream": stream,
                        "t_ms": t,
                        "seq": seq,
                        "audio_ms": AUDIO_MS,
                        "eta_ms": ETA_MS,
                        "audio_total_ms": AUDIO_MS * (seq + 1),
                        "final": final,
                    }
                    times.append(t)  # edgemon may apply it before our PUBACK is read
                    topic = broker.topic(device, "events")
                    await client.publish(topic, json.dumps(chunk), qos=1)
                if final:
                    return
                tick += PERIOD_S
                await asyncio.sleep(max(0.0, tick - loop.time()))


@contextlib.asynccontextmanager
async def publishing(broker: Broker) -> AsyncIterator[Publisher]:
    publisher = Publisher(broker)
    publisher.task = task = asyncio.create_task(publisher.run(), name="publisher")
    try:
        yield publisher
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def finish(publisher: Publisher) -> None:
    """Send the final chunks and wait until the broker has acknowledged them."""
    publisher.finish()
    assert publisher.task is not None
    async with asyncio.timeout(5):
        await asyncio.shield(publisher.task)


async def get(port: int, path: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        return response.status, await response.text()


async def streams(http_port: int) -> tuple[float, dict[Key, dict[str, Any]]]:
    """`/api/v1/streams`: edgemon's wall time, and each stream by (device, stream), with its
    device's time (`device_ms`: the instant the view shows, on the device's clock)."""
    status, body = await get(http_port, "/api/v1/streams")
    assert status == 200
    view = json.loads(body)
    found = {
        (device["device"], stream["stream"]): stream | {"device_ms": device["t_ms"]}
        for device in view["devices"]
        for stream in device["streams"]
    }
    return view["wall_ms"], found


async def watch_streams(http_port: int, publisher: Publisher, polls: int = POLLS) -> int:
    """Poll the streams `polls` times, 50 ms apart at least: every stream is there at every
    poll, live, without an underrun, with the slack its chunks imply on the device's clock —
    exactly: `audio_ms` × the chunks edgemon counted − (the view's device time − the first
    chunk's `t_ms`), so the stream kept its start and its buffer across the restart. Polls
    made (each one checked)."""
    for poll in range(polls):
        _, found = await streams(http_port)
        assert set(found) == set(STREAMS), f"poll {poll}: streams {sorted(found)}"
        for key in STREAMS:
            stream = found[key]
            assert stream["phase"] == "live"
            assert stream["underruns"] == 0
            slack = publisher.implied_slack(key, stream["chunks"], stream["device_ms"])
            assert stream["slack_ms"] == pytest.approx(slack, abs=1e-6), (
                f"{key}: slack {stream['slack_ms']} ms shown, {slack} ms implied by its "
                f"{stream['chunks']} chunks at device time {stream['device_ms']}"
            )
        await asyncio.sleep(0.05)
    return polls


async def until_streams(http_port: int, within_s: float = 10.0) -> None:
    """Wait until every stream has a chunk applied."""
    async with asyncio.timeout(within_s):
        while set((await streams(http_port))[1]) != set(STREAMS):  # noqa: ASYNC110 - HTTP
            await asyncio.sleep(0.02)


async def until_published(publisher: Publisher, more: int, within_s: float = 20.0) -> None:
    """Wait until the publisher has sent `more` chunks more than now (edgemon away: the broker
    queues them for its session)."""
    target = publisher.count + more
    async with asyncio.timeout(within_s):
        while publisher.count < target:  # noqa: ASYNC110 - a counter of the publisher task
            await asyncio.sleep(0.02)


async def until_completed(http_port: int, within_s: float = 20.0) -> None:
    """Wait until every stream has played out its final chunk and been removed."""
    async with asyncio.timeout(within_s):
        while (await streams(http_port))[1]:  # noqa: ASYNC110 - polling HTTP
            await asyncio.sleep(0.05)


# ---------------------------------------------------------------------- clean restart
def restart_settings(broker: Broker, state_dir: Path) -> Settings:
    return Settings(
        mqtt=MqttSettings(
            url=broker.url,
            client_id=broker.client_id("edgemon-restart"),
            topic_prefix=broker.prefix,
        ),
        http=HttpSettings(listen="127.0.0.1:0"),
        # Only the snapshot written on stop can carry the state across.
        state=StateSettings(dir=state_dir, snapshot_interval_s=3600),
    )


async def test_clean_restart_continues_every_stream_with_exact_totals(
    mosquitto_broker: Broker, tmp_path: Path, captured_logs: list[MutableMapping[str, Any]]
) -> None:
    """SIGTERM's stop mid-stream, down while chunks keep coming (five periods' worth),
    start again with the same state directory and client id: every stream is present at
    every poll after the restart with the slack its chunks imply on the device's clock
    (exactly), then completes; no underrun, no extra stream start, no throttle, and chunks
    and audio totals equal what the broker accepted."""
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    settings = restart_settings(mosquitto_broker, state_dir)
    daemon = Daemon(settings, environ={}, install_signal_handlers=False)
    task = await start(daemon, logs=captured_logs)
    try:
        async with publishing(mosquitto_broker) as publisher:
            assert daemon.http_port is not None
            await until_streams(daemon.http_port)
            await watch_streams(daemon.http_port, publisher)
            await stop(daemon, task, logs=captured_logs)
            first = captured_logs[:]  # the first daemon's lines
            assert (state_dir / "snapshot.json").is_file()
            at_stop = publisher.count
            await until_published(publisher, 5 * len(STREAMS))  # down: the broker queues
            queued = publisher.count - at_stop
            daemon = Daemon(settings, environ={}, install_signal_handlers=False)
            task = await start(daemon, logs=captured_logs)
            http = daemon.http_port
            assert http is not None
            polls = await watch_streams(http, publisher)
            await finish(publisher)
            await until_completed(http)
            _, metrics = await get(http, "/metrics")
    finally:
        if not task.done():
            await stop(daemon, task, logs=captured_logs)
    second = captured_logs[len(first) :]
    published = publisher.count
    assert queued >= 5 * len(STREAMS)
    assert polls == POLLS
    assert logged(second, "state_restored") == [{"devices": 2, "streams": 3}]
    assert not logged(second, "state_restore_failed")
    assert not logged(first, "snapshot_failed")
    assert not logged(second, "snapshot_failed")
    assert total(metrics, "edgemon_chunks_total") == published
    assert total(metrics, "edgemon_audio_seconds_total") == pytest.approx(
        published * AUDIO_MS / 1000, abs=1e-9
    )
    assert total(metrics, "edgemon_streams_started_total") == len(STREAMS)
    assert total(metrics, "edgemon_underruns_total") == 0
    assert total(metrics, "edgemon_throttle_engagements_total") == 0
    assert total(metrics, "edgemon_streams_finished_total", reason="completed") == len(STREAMS)
    assert total(metrics, "edgemon_streams_finished_total") == len(STREAMS)
    assert total(metrics, "edgemon_messages_total", result="gap") == 0


# ---------------------------------------------------------------------- crash
class Process:
    """`python -m edgemon run --config … --record …`, its JSON log in a file."""

    def __init__(self, config: Path, record: Path, log: Path) -> None:
        self.config, self.record, self.log = config, record, log
        self.process: asyncio.subprocess.Process | None = None
        self.http_port: int | None = None

    async def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "edgemon", "run",
                "--config", str(self.config), "--record", str(self.record),
                stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
            )  # fmt: skip
        async with asyncio.timeout(20):
            while (port := self._logged_port()) is None:
                assert self.process.returncode is None, self.log.read_text()
                await asyncio.sleep(0.05)
            self.http_port = port
            while True:
                with contextlib.suppress(aiohttp.ClientError):
                    if (await get(port, "/readyz"))[0] == 200:
                        return
                await asyncio.sleep(0.05)

    def events(self, name: str) -> list[dict[str, Any]]:
        found = []
        for line in self.log.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if isinstance(entry, dict) and entry.get("event") == name:
                    found.append(entry)
        return found

    def _logged_port(self) -> int | None:
        listening = self.events("http_listening") if self.log.exists() else []
        return int(listening[-1]["port"]) if listening else None

    async def signal(self, number: int) -> int:
        assert self.process is not None
        self.process.send_signal(number)
        async with asyncio.timeout(6):
            return await self.process.wait()

    async def kill_if_running(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()


def received(trace: Path) -> list[tuple[float, Key, int]]:
    """(recv_ms, (device, stream), seq) of every chunk message a `--record` file holds."""
    chunks = []
    for line in trace.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        device = record["topic"].split("/")[-2]
        event = json.loads(record["payload"])
        chunks.append((record["recv_ms"], (device, event["stream"]), event["seq"]))
    return chunks


async def test_crash_loses_nothing_with_the_write_ahead_log(
    any_broker: Broker, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """SIGKILL mid-stream (no snapshot taken yet: the write-ahead log, on by default, is all
    there is), chunks keep coming, start again on the same state directory and client id.
    Every chunk the broker accepted is applied exactly once: `edgemon_chunks_total` and the
    audio total equal what was published, no `gap` (nothing lost: what the killed process
    applied is replayed from the log), no `duplicate` (what it applied but had not
    acknowledged, or whose PUBACK was still on its way, is redelivered by the broker and
    recognised), every stream survives with the slack its chunks imply, no underrun, 3
    streams started and completed (without the log every chunk the killed process had
    applied would be lost, its streams started again and counted twice). On Mosquitto and on
    amqtt (`any_broker`)."""
    if request.node.callspec.params["any_broker"] == "amqtt":
        request.applymarker(AMQTT_NO_SESSION)
    port = any_broker.port
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    interval_s = 3600  # no snapshot before the kill
    config = tmp_path / "edgemon.toml"
    config.write_text(
        f'[mqtt]\nurl = "mqtt://127.0.0.1:{port}"\nclient_id = "edgemon-crash"\n'
        '[http]\nlisten = "127.0.0.1:0"\n[log]\nformat = "json"\n'
        f'[state]\ndir = "{state_dir}"\nsnapshot_interval_s = {interval_s}\n',
        encoding="utf-8",
    )
    first = Process(config, tmp_path / "first.jsonl", tmp_path / "first.log")
    second = Process(config, tmp_path / "second.jsonl", tmp_path / "second.log")
    try:
        await first.start()
        async with publishing(any_broker) as publisher:
            assert first.http_port is not None
            await until_streams(first.http_port)
            await until_published(publisher, 3 * len(STREAMS))  # a few periods applied
            assert await first.signal(signal.SIGKILL) == -signal.SIGKILL
            assert not (state_dir / "snapshot.json").exists()
            await until_published(publisher, 2 * len(STREAMS))  # the broker queues these
            await second.start()
            http = second.http_port
            assert http is not None
            polls = await watch_streams(http, publisher)
            await finish(publisher)
            await until_completed(http)
            # No wait for "late" redeliveries: the broker redelivers what was unacknowledged
            # at the session's start, before the final chunks `until_completed` saw applied.
            _, metrics = await get(http, "/metrics")
        assert await second.signal(signal.SIGTERM) == 0
    finally:
        await first.kill_if_running()
        await second.kill_if_running()
    published = publisher.count
    by_first = received(first.record)
    replayed = [event["records"] for event in second.events("wal_replayed")]
    counted = total(metrics, "edgemon_chunks_total")
    print(  # the figures, for the report (pytest -s)
        f"crash: published {published}, received by the killed process {len(by_first)}, "
        f"replayed from the log {replayed}, counted {counted}"
    )
    assert polls == POLLS
    assert by_first
    assert second.events("state_restored")[0]["streams"] == len(STREAMS)
    assert not second.events("state_restore_failed")
    assert counted == published
    assert total(metrics, "edgemon_audio_seconds_total") == pytest.approx(
        published * AUDIO_MS / 1000, abs=1e-9
    )
    assert total(metrics, "edgemon_messages_total", result="gap") == 0
    assert total(metrics, "edgemon_messages_total", result="duplicate") == 0
    assert total(metrics, "edgemon_messages_total", result="accepted") == published
    assert total(metrics, "edgemon_underruns_total") == 0
    assert total(metrics, "edgemon_streams_started_total") == len(STREAMS)
    assert total(metrics, "edgemon_streams_finished_total", reason="completed") == len(STREAMS)


# ---------------------------------------------------------------------- broker down at start
async def test_a_broker_down_at_start_keeps_the_snapshot_and_the_streams_clocks(
    tmp_path: Path,
) -> None:
    """With the broker unreachable, nothing is restored yet (the devices' clocks have not
    resumed, so the wait costs no buffer) and periodic snapshots do not overwrite the last
    one with an empty state; stopping leaves it as it was."""
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    snapshot = {
        "engine": {"format": 1, "wall_ms": 0.0, "devices": []},
        "results": {"accepted": 7},
        "messages": 7,
        "events": 7,
    }
    (state_dir / "snapshot.json").write_text(json.dumps(snapshot))
    settings = Settings(
        mqtt=MqttSettings(url="mqtt://127.0.0.1:9", client_id="edgemon-down"),  # nothing there
        http=HttpSettings(listen="127.0.0.1:0"),
        state=StateSettings(dir=state_dir, snapshot_interval_s=0.1),
    )
    daemon = Daemon(settings, environ={}, install_signal_handlers=False)
    assert daemon.state is not None
    state = daemon.state
    attempts: list[int | None] = []
    take = state.snapshot

    async def counted(now_ms: float) -> int | None:
        size = await take(now_ms)
        attempts.append(size)
        return size

    state.snapshot = counted  # type: ignore[method-assign]  # a spy on the periodic snapshots
    async with running(daemon, until="started"):
        async with asyncio.timeout(30):
            while len(attempts) < 3:  # noqa: ASYNC110 - the daemon's own timer
                await asyncio.sleep(0.02)
        assert attempts[:3] == [None, None, None]  # none written
        assert daemon.monitor.messages == 0  # not restored: not subscribed yet
    assert json.loads((state_dir / "snapshot.json").read_text()) == snapshot
