"""The servers tests start: a free loopback port, whether it accepts yet, a clean end, the
JSON APIs they answer, a Mosquitto a test can stop and start again (`MosquittoServer`, the
`mosquitto_server` fixture), a named group of them (`Servers`, the `servers` fixture) and a
TCP link between two of them that a test can cut (`TcpProxy`)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any

import pytest

# Where the servers are started, kept importable from here (their home is `brokers`).
from brokers import (
    MOSQUITTO,
    MOSQUITTO_START_S,
    RUN_AS_ROOT,
    Broker,
    MosquittoStartError,
    accepts,
    end_process,
    free_port,
    launch_mosquitto,
)
from tools import require_tool

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

__all__ = [
    "MOSQUITTO",
    "MOSQUITTO_START_S",
    "MosquittoServer",
    "Servers",
    "TcpProxy",
    "accepts",
    "end_process",
    "free_port",
    "get_json",
    "reachable",
]


# ------------------------------------------------------------------ HTTP APIs of servers
def reachable(url: str) -> bool:
    """Whether a GET of `url` answers 200 now."""
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def get_json(url: str, **params: str) -> Any:
    """GET a Prometheus-style API URL (Prometheus, VictoriaMetrics, vmalert): its `data`,
    asserting `status` is `success`."""
    if params:
        url = f"{url}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]


# ------------------------------------------------------------------ a group of processes
class MosquittoServer:
    """A Mosquitto on one fixed port that a test can stop and start again (broker loss).

    With `persistence`, its database lives in `directory`, so sessions (edgemon's, with what
    is queued for it) survive a stop and start, as on a real edge box. `options` are more
    lines of its config (queue limits, say).
    """

    def __init__(self, directory: Path, *, persistence: bool = False, options: str = "") -> None:
        self.host = "127.0.0.1"
        self.port = free_port()
        self._directory = directory
        self._stored = (
            f"persistence true\npersistence_location {directory}/\n"
            f"persistence_file mosquitto.db\n{RUN_AS_ROOT}"
            if persistence
            else "persistence false\n"
        )
        self._options = options
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """`mqtt://host:port`."""
        return f"mqtt://{self.host}:{self.port}"

    @property
    def broker(self) -> Broker:
        """Where it listens, as a `Broker` (edgemon's default topic prefix: it is the test's
        own)."""
        return Broker(self.host, self.port)

    def start(self) -> None:
        """Start it and wait until it accepts connections (on its one port, every time)."""
        assert self._process is None, "already running"
        require_tool("mosquitto")
        try:
            self._process, _ = launch_mosquitto(
                self._directory,
                lambda ports: (
                    f"listener {ports[0]} 127.0.0.1\nallow_anonymous true\n{self._stored}"
                    f"log_dest stderr\n{self._options}"
                ),
                name="mosquitto-restartable",
                ports=[self.port],
            )
        except MosquittoStartError as error:
            pytest.fail(str(error))

    def stop(self) -> None:
        """Terminate it (idempotent); with persistence it writes its database first."""
        process, self._process = self._process, None
        if process is None:
            return
        end_process(process)


class Servers:
    """The processes one test starts, by name, each logging to `directory/<name>.log`.

    `stop_all` (the fixture calls it) ends them in the reverse order of their start, so the
    ones that feed others stop after the ones that read them.
    """

    def __init__(self, directory: Path, env: dict[str, str] | None = None) -> None:
        self.directory = directory
        self.env = env if env is not None else dict(os.environ)
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(self, name: str, *argv: str, env: dict[str, str] | None = None) -> None:
        """Start `argv` as `name` (a name may be reused once its process has ended)."""
        previous = self.processes.get(name)
        assert previous is None or previous.poll() is not None, f"{name} is running"
        with self.log_path(name).open("ab") as log:
            self.processes[name] = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**self.env, **(env or {})},
            )

    def log_path(self, name: str) -> Path:
        return self.directory / f"{name}.log"

    def log(self, name: str, tail: int = 3000) -> str:
        """The last `tail` characters of `name`'s log."""
        path = self.log_path(name)
        return path.read_text(errors="replace")[-tail:] if path.exists() else "(no log)"

    def wait_until(self, name: str, check: Callable[[], bool], timeout_s: float = 20) -> None:
        """Poll `check()` until it holds; fail with `name`'s log if it does not within
        `timeout_s` or the process exits first."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if check():
                return
            if self.processes[name].poll() is not None:
                break
            time.sleep(0.1)
        pytest.fail(f"{name} did not come up; its log:\n{self.log(name)}")

    def assert_running(self) -> None:
        """Fail with its log if any process has exited."""
        for name, process in self.processes.items():
            assert process.poll() is None, f"{name} exited: {self.log(name)}"

    def stop(self, name: str) -> None:
        """End `name` (terminate, kill after 5 s); nothing if it has already ended."""
        process = self.processes.get(name)
        if process is not None and process.poll() is None:
            end_process(process)

    def kill(self, name: str) -> None:
        """SIGKILL `name`, as a crash would, and reap it."""
        process = self.processes[name]
        process.kill()
        process.wait()

    def stop_all(self) -> None:
        for name in reversed(list(self.processes)):
            self.stop(name)


# ------------------------------------------------------------------ a link the test can cut
class TcpProxy:
    """A TCP relay on a free loopback port to `127.0.0.1:target`, standing for a network link
    (a box's uplink). `cut()` drops every open connection and resets new ones until
    `restore()`, as a broken uplink does to the connections across it."""

    def __init__(self, target: int) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._cut = False
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="tcp-proxy", daemon=True)
        self._thread.start()

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            for sock in self._open:
                _shut(sock)

    def restore(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._listener.close()
        self._thread.join(timeout=5)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self._cut:
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    client.close()  # an RST: the connection is refused across the cut
                    continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open.update((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            _shut(sink)
            with self._lock:
                self._open.discard(source)
            source.close()


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
