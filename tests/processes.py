"""`edgemon run` as a process of its own, as an operator starts it, for the tests that need the
real process (a console script, its signals, its exit): `edgemon_run` starts it on a test
broker and waits until it is ready; `get` and `poll` read its HTTP endpoints."""

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

from ports import end_process, free_port

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

#: How long to wait for the process (only waited in full on failure): a loaded machine.
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
    """Poll `check()` every 50 ms until it holds or `timeout` s have passed; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()
