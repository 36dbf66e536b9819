"""vLLM's OpenAI server started from the command line the documentation prints, for the tests
that serve it: `documented_command` reads that line (the shipped policy, the same text on
every page: tests/documented.py), `start_server` runs it on a test model (dummy weights) and
a free port and waits until it answers, `post` and `waiting` speak to it. Nothing here
imports vLLM."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

import pytest

from brokers import end_process, free_port
from documented import CPU_OPTIONS, engine_block, words
from processes import poll
from scrapes import total

if TYPE_CHECKING:
    from pathlib import Path

START_S = 240.0
"""How long a start may take on a loaded 2-core machine (20-60 s on a quiet one)."""
TEST_OPTIONS = (
    "--served-model-name", "m", "--load-format", "dummy", "--enforce-eager",
    *CPU_OPTIONS, "--max-model-len", "4096",
)  # fmt: skip
"""What the tests add to the documented command line: the test model's name in requests, its
dummy weights, eager mode, what the vLLM CPU how-to adds (fp32) and a context that fits it."""
_ASSIGNMENT = re.compile(r"^[A-Z][A-Z0-9_]*=")


@dataclass(frozen=True, slots=True)
class Command:
    """A documented command line: its `NAME=value` prefix and its words."""

    env: dict[str, str]
    argv: tuple[str, ...]

    def without(self, option: str) -> Command:
        """The command without `option` and its value."""
        at = self.argv.index(option)
        return Command(self.env, self.argv[:at] + self.argv[at + 2 :])

    def plus(self, *words: str) -> Command:
        """The command with `words` added."""
        return Command(self.env, (*self.argv, *words))


def documented_command() -> Command:
    """The engine command line as the documentation prints it; `python` in it is this
    interpreter."""
    command = words(engine_block())
    prefix = 0
    while prefix < len(command) and _ASSIGNMENT.match(command[prefix]):
        prefix += 1
    env = dict(word.split("=", 1) for word in command[:prefix])
    argv = tuple(sys.executable if w == "python" else w for w in command[prefix:])
    return Command(env, argv)


def uncovered() -> dict[str, str]:
    """This environment without coverage's subprocess start: a vLLM server, or a script that
    starts them, is not measured. Tracing the imports of a server's three processes (API
    server, engine core, worker) added about 30 s to every start (17 s → 25 s per `import
    vllm...api_server`), and the tier's in-process tests measure the edgemon code it runs."""
    return {k: v for k, v in os.environ.items() if not k.startswith("COVERAGE_PROCESS_")}


def start_server(
    command: Command, model: Path, tmp: Path, log: IO[bytes], env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], int]:
    """Run `command` on `model` (its `<model>`) with `TEST_OPTIONS`, a free port, its caches
    in `tmp` and `env` over its own variables; (process, port) once `/health` answers."""
    port = free_port()
    argv = [str(model) if word == "<model>" else word for word in command.argv]
    caches = {"VLLM_CACHE_ROOT": str(tmp), "TORCHINDUCTOR_CACHE_DIR": str(tmp)}
    process = subprocess.Popen(
        [*argv, *TEST_OPTIONS, "--port", str(port)],
        env=uncovered() | caches | command.env | env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    poll(lambda: healthy(port) or process.poll() is not None, START_S)
    if not healthy(port):
        end_process(process)
        pytest.fail(f"the server did not start: see {log.name}")
    return process, port


def healthy(port: int) -> bool:
    """Whether the server's `/health` answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
            return True
    except OSError:
        return False


def post(
    port: int, path: str, body: dict[str, Any], timeout: float
) -> tuple[int, dict[str, str], str]:
    """POST JSON; (status, headers, body text), error statuses included."""
    data = json.dumps(body).encode()
    ask = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data, {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(ask, timeout=timeout) as answer:
            return answer.status, dict(answer.headers), answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read().decode()


def waiting(port: int) -> float:
    """Requests in the server's waiting queue, from its `/metrics`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return total(answer.read().decode(), "vllm:num_requests_waiting")
