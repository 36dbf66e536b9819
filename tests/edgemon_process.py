"""`edgemon run` as a process on a given broker, and how a test reads its HTTP endpoints:
`edgemon_run` (ready, its HTTP port yielded), `get`, `samples` (one metric's samples) and
`poll` (a condition awaited with a generous deadline)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ports import end_process, free_port

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

T = 30.0  # generous: a loaded machine


@contextlib.contextmanager
def edgemon_run(broker_port: int, tmp_path: Path) -> Iterator[int]:
    """`edgemon run --broker ... --listen ...` as a process, ready; yields its HTTP port."""
    http_port = free_port()
    config = tmp_path / "edgemon.toml"
    config.write_text(
        '[mqtt]\nclient_id = "edgemon-loop"\n[log]\nformat = "json"\n'
        f'[state]\ndir = "{tmp_path}"\n',
        encoding="utf-8",
    )
    log = tmp_path / "edgemon.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_", "WATCHDOG_"))}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                sys.executable, "-m", "edgemon", "run", "--config", str(config),
                "--broker", f"mqtt://127.0.0.1:{broker_port}",
                "--listen", f"127.0.0.1:{http_port}",
            ],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    try:
        if not poll(lambda: get(http_port, "/readyz") == 200 or process.poll() is not None):
            pytest.fail(f"edgemon did not get ready; its log:\n{log.read_text()[-3000:]}")
        assert process.poll() is None, log.read_text()[-3000:]
        yield http_port
    finally:
        end_process(process)


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
