"""`edgemon run` as a real process: systemd notify on a real socket, SIGTERM, config errors,
and the embedded broker."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import aiomqtt
import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from brokers import Broker

pytestmark = pytest.mark.integration

P = "edgemon/v1"


def write_config(path: Path, broker: Broker) -> Path:
    path.write_text(
        f'[mqtt]\nurl = "{broker.url}"\nclient_id = "{broker.client_id("proc")}"\n'
        f'topic_prefix = "{broker.prefix}"\n'
        '[http]\nlisten = "127.0.0.1:0"\n[log]\nformat = "json"\n',
        encoding="utf-8",
    )
    return path


@contextlib.contextmanager
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A unix datagram socket bound where NOTIFY_SOCKET will point."""
    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(path)
        server.setblocking(False)
        yield server, path


async def datagrams_until(server: socket.socket, wanted: str, seen: list[str]) -> None:
    loop = asyncio.get_running_loop()
    while not any(wanted in message for message in seen):
        seen.append((await loop.sock_recv(server, 4096)).decode())


def spawn(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "edgemon", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.asyncio
async def test_notify_and_sigterm(mosquitto_broker: Broker, tmp_path: Path) -> None:
    """As a systemd service: READY=1 once subscribed and WATCHDOG=1 repeatedly arrive on a
    real unix datagram socket; SIGTERM sends STOPPING=1, releases the throttled device,
    publishes `offline`, and the process exits 0 within 5 s."""
    broker = mosquitto_broker
    config = write_config(tmp_path / "edgemon.toml", broker)
    seen: list[str] = []
    watched: list[tuple[str, dict[str, Any]]] = []
    with notify_socket(tmp_path) as (server, path):
        process = spawn(
            "run", "--config", str(config),
            env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"},
        )  # fmt: skip
        try:
            async with asyncio.timeout(10):
                await datagrams_until(server, "READY=1", seen)
                watcher = broker.client_id("watch")
                async with aiomqtt.Client(broker.host, broker.port, identifier=watcher) as client:
                    await client.subscribe(broker.topic("#"), qos=1)
                    now = time.time() * 1000
                    chunk = {"type": "chunk", "stream": "s", "t_ms": now, "seq": 0}
                    await client.publish(
                        broker.topic("devp", "events"), json.dumps(chunk | {"audio_ms": 30}), qos=1
                    )
                    async for message in client.messages:
                        assert isinstance(message.payload, bytes)
                        watched.append((message.topic.value, json.loads(message.payload)))
                        if message.topic.value == broker.topic("devp", "throttle"):
                            break
                    await datagrams_until(server, "WATCHDOG=1", seen)
                    started = time.monotonic()
                    process.send_signal(signal.SIGTERM)
                    async for message in client.messages:
                        assert isinstance(message.payload, bytes)
                        watched.append((message.topic.value, json.loads(message.payload)))
                        if watched[-1][1].get("state") == "offline":
                            break
                    await datagrams_until(server, "STOPPING=1", seen)
                    code = await asyncio.to_thread(process.wait, 5)
                    elapsed = time.monotonic() - started
        finally:
            if process.poll() is None:
                process.kill()
            _, stderr = process.communicate()
    assert code == 0, stderr.decode()
    assert elapsed < 5.0
    assert any(m.startswith("READY=1\nSTATUS=") for m in seen)
    throttles = [obj["throttle"] for topic, obj in watched if topic.endswith("/throttle")]
    assert throttles == [True, False]
    assert [obj["state"] for topic, obj in watched if topic.endswith("/status")][-1] == "offline"
    assert stderr == b""


def test_bad_config_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """A config the daemon cannot use: one line on stderr naming the problem, exit 2."""
    config = tmp_path / "bad.toml"
    config.write_text("[slack]\ndefault_margin_ms = -1\n", encoding="utf-8")
    process = spawn("run", "--config", str(config))
    _, stderr = process.communicate(timeout=20)
    assert process.returncode == 2
    lines = stderr.decode().splitlines()
    assert len(lines) == 1
    assert "slack.default_margin_ms" in lines[0]


def test_bad_broker_flag_is_exit_2() -> None:
    """`--broker` that is not an MQTT URL is a usage error (flags override the file), blamed
    on the flag in one line."""
    process = spawn("run", "--broker", "http://x", "--listen", "127.0.0.1:0")
    _, stderr = process.communicate(timeout=20)
    assert process.returncode == 2
    lines = stderr.decode().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("edgemon run: --broker http://x:")


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.asyncio
async def test_embedded_broker(tmp_path: Path) -> None:
    """`--broker embedded` runs on a bare machine: the daemon starts a broker on
    127.0.0.1:1883, announces `online` there, and stops cleanly on SIGTERM."""
    pytest.importorskip("amqtt")
    if not _port_free(1883):
        pytest.skip("127.0.0.1:1883 is taken")
    seen: list[str] = []
    with notify_socket(tmp_path) as (server, path):
        process = spawn(
            "run", "--broker", "embedded", "--listen", "127.0.0.1:0",
            env={"NOTIFY_SOCKET": path, "EDGEMON_STATE__DIR": str(tmp_path)},
        )  # fmt: skip
        try:
            async with asyncio.timeout(15):
                await datagrams_until(server, "READY=1", seen)
                async with aiomqtt.Client("127.0.0.1", 1883) as client:
                    await client.subscribe(f"{P}/_edgemon/+/status", qos=1)
                    async for message in client.messages:
                        assert isinstance(message.payload, bytes)
                        assert json.loads(message.payload)["state"] == "online"
                        break
                process.send_signal(signal.SIGTERM)
                code = await asyncio.to_thread(process.wait, 5)
        finally:
            if process.poll() is None:
                process.kill()
            _, stderr = process.communicate()
    assert code == 0, stderr.decode()
