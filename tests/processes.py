"""`edgemon run` as a process of its own, as an operator starts it, for the tests that need the
real process (a console script, its signals, its exit): `edgemon_process` starts it on a test
broker with more config if asked and waits until it is ready (its HTTP port, process and
log), `edgemon_run` does so with the default config and yields its HTTP port; `get`, `poll`
and `samples` read its HTTP endpoints."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from ports import end_process, free_port
from scrapes import Labels
from scrapes import samples as parsed_samples

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from brokers import Broker

#: How long to wait for the process (only waited in full on failure): a loaded machine.
T = 30.0


@dataclass(frozen=True, slots=True)
class EdgemonProcess:
    """A running `edgemon run`."""

    http_port: int
    process: subprocess.Popen[bytes]
    log: Path


@contextlib.contextmanager
def edgemon_process(
    broker: Broker, tmp_path: Path, *, config: str = "", client_id: str = "edgemon-loop"
) -> Iterator[EdgemonProcess]:
    """`edgemon run --broker ... --listen ...` as a process on `broker` (its topic prefix;
    `client_id` made the test's own), ready (`/readyz` 200). `config` is more TOML, after
    `[mqtt] client_id` and `topic_prefix`, `[log] format` and `[state] dir` (so it may add
    `[mqtt]` keys before any section of its own)."""
    http_port = free_port()
    path = tmp_path / "edgemon.toml"
    path.write_text(
        f'[mqtt]\nclient_id = "{broker.client_id(client_id)}"\n'
        f'topic_prefix = "{broker.prefix}"\n{config}\n[log]\nformat = "json"\n'
        f'[state]\ndir = "{tmp_path}"\n',
        encoding="utf-8",
    )
    log = tmp_path / "edgemon.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_", "WATCHDOG_"))}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                sys.executable, "-m", "edgemon", "run", "--config", str(path),
                "--broker", broker.url,
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
def edgemon_run(broker: Broker, tmp_path: Path) -> Iterator[int]:
    """`edgemon_process` with the default config; yields its HTTP port."""
    with edgemon_process(broker, tmp_path) as edgemon:
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


def samples(port: int, name: str) -> dict[Labels, float]:
    """Every sample called `name` on edgemon's /metrics, keyed by its sorted labels."""
    text = get(port, "/metrics")
    assert isinstance(text, str)
    return parsed_samples(text, name)
