"""Helpers for benchmarks that run real processes: Mosquitto, edgemon, /proc, /metrics.

Linux only: CPU time and RSS come from /proc (utime + stime, VmRSS), the way `top` and
`ps` read them, so no dependency is needed and the figures mean what operators see.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import multiprocessing as mp
import os
import resource
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from multiprocessing.connection import Connection
    from multiprocessing.synchronize import Event as MpEvent

ROOT = Path(__file__).resolve().parents[1]
# The tests' helper modules (starting Mosquitto, parsing /metrics) serve the benchmarks too.
sys.path.insert(0, str(ROOT / "tests"))

from brokers import (  # noqa: E402 - after the path that finds it
    end_process,
    free_port,
    launch_mosquitto,
    plain_listener,
)
from scrapes import samples_by_label_text  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def mosquitto(directory: Path, *, options: str = "") -> Iterator[int]:
    """A fresh Mosquitto on 127.0.0.1 and a free port, anonymous, no persistence: its port.

    `options` are added to its config (e.g. queue limits); its log is `directory/mosquitto.log`.
    """
    process, (port,) = launch_mosquitto(directory, lambda ports: plain_listener(ports[0]) + options)
    try:
        yield port
    finally:
        stop(process)


def stop(process: subprocess.Popen[bytes], timeout: float = 10.0) -> int:
    """Terminate `process` (SIGTERM, then SIGKILL after `timeout`); its exit code."""
    return end_process(process, timeout)


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) `pid` has used so far, all its threads, in seconds."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:  # noqa: PTH123
        fields = stat.read().rpartition(")")[2].split()
    # After the command name: state is field 3 of proc(5), utime 14 and stime 15.
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_bytes(pid: int) -> int:
    """Resident set size of `pid` now (VmRSS), in bytes."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:  # noqa: PTH123
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """GET `url`: (status, body); status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError:
        return 0, ""


def samples(text: str, name: str) -> dict[str, float]:
    """The samples of metric `name` in a Prometheus text page, by label set (`""` if none)."""
    return samples_by_label_text(text, name)


def _limit_files(limit: int) -> None:
    """In the child before it runs edgemon: `ulimit -n limit` (soft and hard)."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


class Edgemon:
    """`python -m edgemon run` as a subprocess, its CPU time, memory and message counts."""

    def __init__(
        self,
        directory: Path,
        broker_port: int,
        *,
        config: str = "",
        profile: Path | None = None,
        mqtt: str = "",
        client_id: str = "edgemon-bench",
        log_level: str = "warning",
        http: str = "",
        nofile: int | None = None,
        agent: bool = False,
    ) -> None:
        """Start it on the broker at 127.0.0.1:`broker_port`, HTTP on a free port, logging
        at `log_level` (warnings only by default) to `directory/edgemon.log`, state in
        `directory`; `config` adds lines to `[state]` and then TOML sections, `mqtt` lines to
        `[mqtt]`, `http` lines to `[http]`; `profile` runs it under cProfile; `nofile` is its
        limit of open files (`ulimit -n`); `agent` answers the agent check on a free port."""
        self.http_port = free_port()
        #: The agent check's port (`agent`), else None.
        self.agent_port = free_port() if agent else None
        if self.agent_port is not None:
            http += f'agent_listen = "127.0.0.1:{self.agent_port}"\n'

        config_path = directory / "edgemon.toml"
        config_path.write_text(
            f'[mqtt]\nurl = "mqtt://127.0.0.1:{broker_port}"\nclient_id = "{client_id}"\n{mqtt}'
            f'[http]\nlisten = "127.0.0.1:{self.http_port}"\n{http}'
            f'[log]\nlevel = "{log_level}"\nformat = "json"\n'
            f'[state]\ndir = "{directory}"\n{config}',
            encoding="utf-8",
        )
        self._log = (directory / "edgemon.log").open("wb")
        profiler = [] if profile is None else ["-m", "cProfile", "-o", str(profile)]
        self.process = subprocess.Popen(
            [sys.executable, *profiler, "-m", "edgemon", "run", "--config", str(config_path)],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            preexec_fn=None if nofile is None else functools.partial(_limit_files, nofile),  # noqa: PLW1509 - setrlimit only
        )
        self.pid = self.process.pid
        self.log_path = directory / "edgemon.log"

    def ready(self, timeout: float = 30) -> None:
        """Wait until it is subscribed (`/readyz` 200)."""
        deadline = time.monotonic() + timeout
        while http_get(f"http://127.0.0.1:{self.http_port}/readyz", 1)[0] != 200:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"edgemon did not become ready; see {self.log_path}")
            time.sleep(0.05)

    def cpu(self) -> float:
        """CPU seconds used so far."""
        return cpu_seconds(self.pid)

    def results(self) -> dict[str, float]:
        """`edgemon_messages_total` by `result` label."""
        status, text = http_get(f"http://127.0.0.1:{self.http_port}/metrics")
        if status != 200:
            raise RuntimeError(f"/metrics answered {status}")
        return samples(text, "edgemon_messages_total")

    def close(self) -> int:
        """SIGTERM, as systemd stops it; the exit code."""
        code = stop(self.process)
        self._log.close()
        return code


@dataclass(slots=True)
class Window:
    """CPU used by edgemon for a known number of processed messages (or events)."""

    edgemon: Edgemon
    scrape_cpu: float
    cpu0: float = 0.0
    total0: float = 0.0
    accepted0: float = 0.0

    def open(self) -> None:
        """Start: the counts, then (once the scrape is over) the CPU time."""
        results = self.edgemon.results()
        self.total0 = sum(results.values())
        self.accepted0 = results.get('result="accepted"', 0.0)
        time.sleep(0.05)
        self.cpu0 = self.edgemon.cpu()

    def close(self, expected: int, timeout: float = 60) -> tuple[float, float]:
        """Wait until `expected` more are counted and edgemon idles: (CPU s, accepted).

        CPU is read when no tick was used in 100 ms (idle), before the scrape that confirms
        the count; a scrape that found the count short is subtracted at its measured cost.
        """
        early = 0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            before = self.edgemon.cpu()
            time.sleep(0.1)
            after = self.edgemon.cpu()
            if after != before:
                continue
            results = self.edgemon.results()
            if sum(results.values()) - self.total0 >= expected:
                accepted = results.get('result="accepted"', 0.0) - self.accepted0
                return after - self.cpu0 - early * self.scrape_cpu, accepted
            early += 1
        raise RuntimeError(f"edgemon did not process {expected} messages in time")


def scrape_cost(edgemon: Edgemon, scrapes: int = 20) -> float:
    """CPU seconds edgemon spends on one /metrics scrape (idle otherwise)."""
    time.sleep(0.1)
    cpu0 = edgemon.cpu()
    for _ in range(scrapes):
        edgemon.results()
    time.sleep(0.1)
    return (edgemon.cpu() - cpu0) / scrapes


def dumps(value: object) -> bytes:
    """Compact JSON, as devices send it."""
    return json.dumps(value, separators=(",", ":")).encode()


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[max(0, math.ceil(p / 100.0 * len(ordered)) - 1)]


class JobProcess:
    """A load process of its own, and the main process's handle on it: `main(port, conn, stop)`
    sends "ready" once connected, then answers each job received over `conn` until it gets
    None; `stop` (an event) asks the running job to end."""

    def __init__(
        self, main: Callable[[int, Connection, MpEvent], None], port: int, *, name: str
    ) -> None:
        context = mp.get_context("spawn")
        self._conn, child = context.Pipe()
        self.stop = context.Event()
        self._process = context.Process(
            target=main, args=(port, child, self.stop), name=name, daemon=True
        )
        self._process.start()

    def ready(self, timeout: float = 30) -> None:
        """Wait until it said it is connected."""
        if not self._conn.poll(timeout) or self._conn.recv() != "ready":
            raise RuntimeError(f"{self._process.name}: the load process did not start")

    def send(self, job: Any) -> None:
        """Begin a job (the stop event cleared first)."""
        self.stop.clear()
        self._conn.send(job)

    def result(self, timeout: float) -> Any:
        """Wait for the running job's answer."""
        if not self._conn.poll(timeout):
            raise RuntimeError(f"{self._process.name}: no answer")
        return self._conn.recv()

    def close(self) -> None:
        """End the process."""
        with contextlib.suppress(OSError):
            self._conn.send(None)
        self._process.join(10)
        if self._process.is_alive():
            self._process.terminate()
