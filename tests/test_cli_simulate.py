"""`edgemon simulate`: runs against a broker and ends with a JSON summary; bad flags are one line
and exit 2; an unreachable broker is one line and exit 1; SIGTERM stops it cleanly."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import pytest

from edgemon.cli.main import main

from mqtt_probe import Probe

if TYPE_CHECKING:
    from brokers import Broker


def _simulate(*args: str) -> list[str]:
    return [sys.executable, "-m", "edgemon", "simulate", *args]


@pytest.mark.integration
def test_runs_for_the_duration_and_prints_a_summary(mosquitto_broker: Broker) -> None:
    """`--duration 1` against Mosquitto: exit 0, nothing on stderr, one JSON summary line."""
    broker = mosquitto_broker
    began = time.monotonic()
    done = subprocess.run(
        _simulate(f"--broker={broker.url}", f"--topic-prefix={broker.prefix}", "--duration=1",
                  "--devices=2", "--streams=2", "--rtf=0.1,0.5", "--stall-rate=0.1", "--seed=3"),
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert time.monotonic() - began < 10
    (line,) = done.stdout.splitlines()
    summary = json.loads(line)
    assert summary["seed"] == 3
    assert summary["rtf"] == [0.1, 0.5]
    assert summary["streams"] >= 4
    assert summary["events"] >= summary["streams"] + summary["chunks"]
    assert summary["messages"] == summary["events"]


@pytest.mark.integration
def test_sigterm_stops_cleanly(mosquitto_broker: Broker) -> None:
    """Without `--duration` it runs until SIGTERM, then cancels open streams, prints the
    summary and exits 0."""
    broker = mosquitto_broker
    probe = Probe(broker.host, broker.port, broker.topic("+", "events"))
    process = subprocess.Popen(
        _simulate(f"--broker={broker.url}", f"--topic-prefix={broker.prefix}", "--seed=1"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # Signal once it is publishing (a loaded machine takes over a second to start it).
        assert probe.wait_for(bool, timeout=30), "the simulator published nothing"
    finally:
        probe.close()
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=10)
    assert process.returncode == 0, stderr
    assert json.loads(stdout)["streams"] >= 1


def test_unreachable_broker_is_one_line_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing listens on the port: exit 1 and one line naming the broker."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code = main(["simulate", f"--broker=mqtt://127.0.0.1:{port}", "--duration=1"])
    err = capsys.readouterr().err
    assert code == 1
    assert len(err.splitlines()) == 1
    assert f"127.0.0.1:{port}" in err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ([], "--broker"),
        (["--broker=http://127.0.0.1:1883"], "mqtt://"),
        (["--broker=mqtt://"], "must be mqtt://host[:port]"),
        (["--broker=mqtts://h"], "no TLS"),
        (["--broker=mqtt://host:99999"], "--broker"),
        (["--broker=mqtt://user:pw@host"], "must not hold credentials"),
        (["--broker=mqtt://h", "--devices=0"], "--devices"),
        (["--broker=mqtt://h", "--devices=x"], "--devices"),
        (["--broker=mqtt://h", "--streams=1000"], "--streams"),
        (["--broker=mqtt://h", "--rtf=fast"], "--rtf"),
        (["--broker=mqtt://h", "--rtf=0"], "--rtf"),
        (["--broker=mqtt://h", "--rtf=0.1,0.2", "--devices=3"], "3 devices"),
        (["--broker=mqtt://h", "--stall-rate=1.5"], "--stall-rate"),
        (["--broker=mqtt://h", "--duration=0"], "--duration"),
        (["--broker=mqtt://h", "--duration=nan"], "--duration"),
        (["--broker=mqtt://h", "--device-prefix=a/b"], "--device-prefix"),
        (["--broker=mqtt://h", "--topic-prefix=a/#"], "--topic-prefix"),
    ],
)
def test_bad_flags_are_one_line_exit_2(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each bad flag: exit 2, one line on stderr naming what is wrong, before any connection."""
    try:
        code: int | str | None = main(["simulate", *args])
    except SystemExit as exc:  # argparse's own errors (missing flag, not an int)
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert needle in err
