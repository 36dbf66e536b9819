"""The servers tests start: a free loopback port, whether it accepts yet, a clean end, the
JSON APIs they answer, a Mosquitto a test can stop and start again (`MosquittoServer`, the
`mosquitto_server` fixture), a named group of them (`Servers`, the `servers` fixture), a
TCP link between two of them that a test can cut (`TcpProxy`), and `edgemon run` itself as a
process (`edgemon_process`, `edgemon_run`) with the HTTP helpers the client tests use."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path


MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
#: How long a Mosquitto may take to accept connections.
MOSQUITTO_START_S = 5.0


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


def end_process(process: subprocess.Popen[bytes]) -> None:
    """Terminate a server the test started; kill it if it does not exit within 5 s."""
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


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
        self._conf = directory / "mosquitto-restartable.conf"
        stored = (
            f"persistence true\npersistence_location {directory}/\n"
            "persistence_file mosquitto.db\n" + ("user root\n" if os.geteuid() == 0 else "")
            # As root Mosquitto would drop to user `mosquitto`, who cannot write tmp_path.
            if persistence
            else "persistence false\n"
        )
        self._conf.write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\n{stored}log_dest stderr\n"
            + options,
            encoding="utf-8",
        )
        self._log = directory / "mosquitto-restartable.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """`mqtt://host:port`."""
        return f"mqtt://{self.host}:{self.port}"

    def start(self) -> None:
        """Start it and wait until it accepts connections."""
        assert self._process is None, "already running"
        with self._log.open("ab") as log_file:
            self._process = subprocess.Popen(
                [MOSQUITTO, "-c", str(self._conf)],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
            )
        deadline = time.monotonic() + MOSQUITTO_START_S
        while time.monotonic() < deadline and self._process.poll() is None:
            if accepts(self.port):
                return
            time.sleep(0.02)
        self.stop()
        pytest.fail(f"mosquitto did not start; its log:\n{self._log.read_text()}")

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


# ------------------------------------------------------------------ edgemon run
#: How long `poll` waits by default (generous: a loaded machine).
T = 30.0


@dataclass(frozen=True, slots=True)
class EdgemonProcess:
    """A running `edgemon run`."""

    http_port: int
    process: subprocess.Popen[bytes]
    log: Path


@contextlib.contextmanager
def edgemon_process(
    broker_port: int, tmp_path: Path, *, config: str = ""
) -> Iterator[EdgemonProcess]:
    """`edgemon run --broker ... --listen ...` as a process, ready (`/readyz` 200). `config`
    is more TOML, after `[mqtt] client_id`, `[log] format` and `[state] dir` (so it may add
    `[mqtt]` keys before any section of its own)."""
    http_port = free_port()
    path = tmp_path / "edgemon.toml"
    path.write_text(
        f'[mqtt]\nclient_id = "edgemon-loop"\n{config}\n[log]\nformat = "json"\n'
        f'[state]\ndir = "{tmp_path}"\n',
        encoding="utf-8",
    )
    log = tmp_path / "edgemon.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_", "WATCHDOG_"))}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                sys.executable, "-m", "edgemon", "run", "--config", str(path),
                "--broker", f"mqtt://127.0.0.1:{broker_port}",
                "--listen", f"127.0.0.1:{http_port}",
            ],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    try:
        if not poll(lambda: get(http_port, "/readyz") == 200 or process.poll() is not None):
            pytest.fail(f"edgemon did not get ready; its log:\n{log.read_text()[-3000:]}")
        assert process.poll() is None, log.read_text()[-3000:]
        yield EdgemonProcess(http_port, process, log)
    finally:
        end_process(process)


@contextlib.contextmanager
def edgemon_run(broker_port: int, tmp_path: Path) -> Iterator[int]:
    """`edgemon_process` with the default config; yields its HTTP port."""
    with edgemon_process(broker_port, tmp_path) as edgemon:
        yield edgemon.http_port


def get(port: int, path: str) -> int | str:
    """The body of a 200 response (the status code of any other), or -1 when unreachable."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.read().decode() if path == "/metrics" else int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return -1


def poll(check: Callable[[], bool], timeout: float = T) -> bool:
    """Whether `check()` holds within `timeout` s (checked every 50 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def samples(port: int, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample called `name` on edgemon's /metrics, keyed by its sorted labels."""
    text = get(port, "/metrics")
    assert isinstance(text, str)
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }
