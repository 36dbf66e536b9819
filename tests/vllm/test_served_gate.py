"""A user's path, end to end: vLLM's OpenAI server started with the documented command line
(`EdgemonRealtimeScheduler`, the gate following one device) with `EDGEMON_DEADLINES=off`, the
schedulers' default, in which the gate holds (the shipped `shed` holds nothing on edgemon's
throttle: docs/client.md; `test_vllm_server.py` serves the command whole), a real
`edgemon run` and Mosquitto, a player reporting through `Reporter`. While edgemon throttles
the device a new request's first token waits, the running stream decoding on; once the
throttle is off it comes. A tiny Llama with dummy weights, made here; nothing downloaded.

On vLLM's CPU engine scheduling is never asynchronous: `vllm/platforms/cpu.py` sets
`scheduler_config.async_scheduling = False` whatever the command line says, so there is no
asynchronous path to serve here; `EdgemonAsyncScheduler` is tested on vLLM's real
`AsyncScheduler` in process (`test_vllm_scheduler.py`)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.request
from typing import TYPE_CHECKING

import pytest

pytest.importorskip("vllm.entrypoints.openai.api_server", exc_type=ImportError)
pytest.importorskip("tokenizers")
pytest.importorskip("transformers")

from edgemon.client import GateState, Reporter, ThrottleGate

from brokers import end_process
from processes import edgemon_run, poll
from served import documented_command, start_server, waiting

if TYPE_CHECKING:
    from pathlib import Path

    from brokers import Broker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

T = 60.0
SCHEDULER = "edgemon.integrations.vllm_realtime.EdgemonRealtimeScheduler"
HOLD_MS = 600_000
"""`EDGEMON_GATE_MAX_HOLD_MS` for this test: no hold ends by its length while it runs."""
STEPS_HELD = 40
"""Decode steps the running stream takes while the new request is seen waiting."""
SHORT_TOKENS = 8


class Streamed(threading.Thread):
    """One streaming completion in the background: each token's arrival, `time.monotonic()`,
    from the usage every chunk carries (a chunk may carry more than one token)."""

    def __init__(self, port: int, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.max_tokens = max_tokens
        self.tokens: list[float] = []

    def run(self) -> None:
        body = {
            "model": "m", "prompt": "w1 w2 w3", "max_tokens": self.max_tokens,
            "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }  # fmt: skip
        ask = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/completions",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        with contextlib.suppress(OSError), urllib.request.urlopen(ask, timeout=T) as answer:
            for raw in answer:
                line = raw.decode().strip()
                if not line.startswith("data: {"):
                    continue
                usage = json.loads(line[6:]).get("usage") or {}
                now = time.monotonic()
                while len(self.tokens) < int(usage.get("completion_tokens", 0)):
                    self.tokens.append(now)


def held(state: GateState) -> bool:
    return state.active


def released(state: GateState) -> bool:
    return state.connected and state.throttle is False


def test_a_new_request_waits_while_edgemon_throttles_and_starts_once_it_stops(
    served_model: Path, private_broker: Broker, tmp_path: Path
) -> None:
    """The documented command in the gate's mode (no middleware, `EDGEMON_DEADLINES=off`),
    its broker the test's and a hold that never times out: three short streams are served in
    full; with a long stream decoding, a reported stream gets one 1.5 s chunk and runs dry, and
    edgemon throttles the device; a new request then waits in vLLM's queue with no token while
    the long stream decodes 40 more steps; the stream's end lifts the throttle and the new
    request's tokens come, all after that end was reported."""
    documented = documented_command()
    assert SCHEDULER in documented.argv
    assert "EDGEMON_GATE_BROKER" in documented.env
    command = documented.without("--middleware")
    device = command.env["EDGEMON_GATE_DEVICE"]
    host, port = private_broker.host, private_broker.port
    url = f"mqtt://{host}:{port}"
    env = {
        "EDGEMON_GATE_BROKER": url,
        "EDGEMON_GATE_MAX_HOLD_MS": str(HOLD_MS),
        "EDGEMON_DEADLINES": "off",
    }
    (tmp_path / "server").mkdir()
    with (
        edgemon_run(private_broker, tmp_path),
        (tmp_path / "server.log").open("wb") as log,
        ThrottleGate(url, device) as gate,
        Reporter(url, device, client_id="served-player") as reporter,
    ):
        process, http = start_server(command, served_model, tmp_path / "server", log, env)
        try:
            assert gate.wait_until(lambda s: s.connected and s.edgemon_online, T)
            for _ in range(3):
                short = Streamed(http, SHORT_TOKENS)
                short.start()
                short.join(T)
                assert len(short.tokens) == SHORT_TOKENS
            running = Streamed(http, 3_000)
            running.start()
            assert poll(lambda: len(running.tokens) >= 1, T)

            reporter.start("dry")
            reporter.chunk("dry", audio_ms=1_500, eta_ms=0)
            assert gate.wait_until(held, T)
            assert gate.state.streams == ("dry",)
            # The engine's gate heard the same message from the same broker: a few steps on,
            # it holds as well.
            seen = len(running.tokens)
            assert poll(lambda: len(running.tokens) >= seen + 5, T)

            late = Streamed(http, SHORT_TOKENS)
            late.start()
            assert poll(lambda: waiting(http) >= 1, T)
            seen = len(running.tokens)
            assert poll(lambda: len(running.tokens) >= seen + STEPS_HELD, T)
            assert late.tokens == []
            assert waiting(http) >= 1
            assert gate.state.throttle is True

            ended_at = time.monotonic()
            reporter.end("dry")
            assert gate.wait_until(released, T)
            late.join(T)
            assert len(late.tokens) == SHORT_TOKENS
            assert late.tokens[0] > ended_at
        finally:
            end_process(process, timeout=30)
