"""Starting a Mosquitto, written once for the tests' fixtures and the benchmarks.

`launch_mosquitto` writes a config for free ports, starts Mosquitto and waits until every
listener accepts connections, trying other ports if one was taken meanwhile. It does not
know pytest: a fixture finds the program with `tools.require_tool("mosquitto")` and turns
`MosquittoStartError` into a failure; a benchmark lets it propagate. `Broker` is what a
test's fixture gives it: where the broker listens, and the topic prefix and client ids that
are the test's own on it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgemon.client import Reporter, ThrottleGate
from edgemon.protocol import TOPIC_PREFIX

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

#: Where Mosquitto is (on PATH, else where Debian puts it); it may not exist.
MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
#: How long a Mosquitto may take to accept connections.
MOSQUITTO_START_S = 5.0
#: Free ports found, then taken by something else before Mosquitto bound them: try again.
MOSQUITTO_TRIES = 3
#: As root Mosquitto would drop to user `mosquitto`, who cannot use the test's directory.
RUN_AS_ROOT = "user root\n" if os.geteuid() == 0 else ""


@dataclass(frozen=True, slots=True)
class Broker:
    """A broker a test talks to: `host` and `port`, the topic prefix `P` its clients use
    (edgemon's default on a broker of its own; one of the test's own on the worker's shared
    Mosquitto, so that it sees no other test's retained or live messages) and `tag`, which
    `client_id` puts before every client id (so no two tests' clients share one)."""

    host: str
    port: int
    prefix: str = TOPIC_PREFIX
    tag: str = ""

    @property
    def url(self) -> str:
        """`mqtt://host:port`."""
        return f"mqtt://{self.host}:{self.port}"

    def topic(self, *levels: str) -> str:
        """`P/level/...`: a topic (or filter) under the test's prefix."""
        return "/".join((self.prefix, *levels))

    def client_id(self, name: str) -> str:
        """The client id `name` made the test's own (`tag` + `name`)."""
        return self.tag + name

    def reporter(self, device: str, client_id: str | None = None, **options: Any) -> Reporter:
        """A `Reporter` of `device` on this broker, under its prefix; `client_id` (made the
        test's own) or the Reporter's unique default."""
        name = None if client_id is None else self.client_id(client_id)
        return Reporter(self.url, device, topic_prefix=self.prefix, client_id=name, **options)

    def gate(self, device: str, **options: Any) -> ThrottleGate:
        """A `ThrottleGate` following `device` on this broker, under its prefix (its client
        id is the gate's unique default)."""
        return ThrottleGate(self.url, device, topic_prefix=self.prefix, **options)


class MosquittoStartError(RuntimeError):
    """Mosquitto exited or never listened (its log is in the message)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def accepts(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:`port`."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def end_process(process: subprocess.Popen[bytes], timeout: float = 5.0) -> int:
    """Terminate a process the test started; kill it if it does not exit within `timeout`
    seconds. Its exit code."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


def plain_listener(port: int) -> str:
    """Config lines of an anonymous Mosquitto without persistence on 127.0.0.1:`port`."""
    return f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nlog_dest stderr\n"


def ws_listener(ports: Sequence[int]) -> str:
    """An anonymous Mosquitto without persistence with a WebSocket listener (ws://) on
    127.0.0.1:`ports[1]`, and a plain one on `ports[0]` (Mosquitto 2.0.11 refuses to start
    with WebSocket listeners alone)."""
    return plain_listener(ports[0]) + f"listener {ports[1]} 127.0.0.1\nprotocol websockets\n"


def launch_mosquitto(
    directory: Path,
    config: Callable[[Sequence[int]], str],
    *,
    listeners: int = 1,
    name: str = "mosquitto",
    ports: Sequence[int] | None = None,
) -> tuple[subprocess.Popen[bytes], list[int]]:
    """Start Mosquitto with the config `config(ports)` for `listeners` free ports (or the
    `ports` given, tried once) and wait until each accepts connections: (process, ports).

    Config and log are `directory/<name>.conf` and `<name>.log` (appended to).
    """
    conf = directory / f"{name}.conf"
    log = directory / f"{name}.log"
    for _ in range(1 if ports is not None else MOSQUITTO_TRIES):
        chosen = list(ports) if ports is not None else [free_port() for _ in range(listeners)]
        conf.write_text(config(chosen), encoding="utf-8")
        with log.open("ab") as log_file:
            process = subprocess.Popen(
                [MOSQUITTO, "-c", str(conf)],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
            )
        deadline = time.monotonic() + MOSQUITTO_START_S
        while process.poll() is None and time.monotonic() < deadline:
            if all(accepts(port) for port in chosen):
                return process, chosen
            time.sleep(0.02)
        end_process(process)  # exited (a port taken meanwhile?) or never listened
    text = log.read_text(encoding="utf-8") if log.exists() else "(no log)"
    raise MosquittoStartError(f"mosquitto did not start; its log ({log}):\n{text}")
