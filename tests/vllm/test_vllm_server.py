"""vLLM's own OpenAI server, started as a user starts it, with edgemon's real-time scheduler
and the deadline policy: what a client receives for a request ended before its first token,
and the 503 the shedding middleware answers once the box's capacity object says it is full.

A tiny Llama with dummy weights and a word-level tokenizer made here; nothing downloaded."""

from __future__ import annotations

import http.client
import json
import time
from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("vllm.entrypoints.openai.api_server", exc_type=ImportError)
pytest.importorskip("tokenizers")
pytest.importorskip("transformers")

from brokers import end_process
from served import documented_command, post, start_server

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from brokers import Broker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

T = 60.0
TEACH_S = 600.0
"""How long the request that teaches the policy may take on a loaded machine."""
DEVICE = "server-box"
REASON = "edgemon:start_deadline"
SCHEDULER = "edgemon.integrations.vllm_realtime.EdgemonRealtimeScheduler"
MIDDLEWARE = "--middleware"


@pytest.fixture
def served(
    served_model: Path, private_broker: Broker, tmp_path: Path, request: Any
) -> Iterator[int]:
    """The server as the documentation runs it (the shipped policy, the same command line
    on every page), one seat (`--max-num-seqs 1`), without the middleware unless the test is
    parametrized so; its port."""
    command = documented_command()
    assert SCHEDULER in command.argv
    assert MIDDLEWARE in command.argv
    if not request.param:
        command = command.without(MIDDLEWARE)
    host, broker_port = private_broker.host, private_broker.port
    env = {
        "EDGEMON_GATE_DEVICE": DEVICE,
        "EDGEMON_GATE_BROKER": f"mqtt://{host}:{broker_port}",
        # This test's clients are plain HTTP clients, not players: nothing is prebuffered, so
        # a start is the first token (the defaults are a player's 200 ms and second chunk).
        "EDGEMON_DEADLINE_PREBUFFER_MS": "0",
        "EDGEMON_DEADLINE_SECOND_CHUNK_FRAMES": "0",
    }
    assert set(command.env) >= {"EDGEMON_GATE_DEVICE", "EDGEMON_DEADLINES"}
    command = command.plus("--max-num-seqs", "1")
    with (tmp_path / "server.log").open("wb") as log:
        process, port = start_server(command, served_model, tmp_path, log, env)
        try:
            yield port
        finally:
            end_process(process, timeout=30)


def _post(port: int, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], str]:
    """POST JSON; (status, headers, body text), error statuses included."""
    return post(port, path, body, T)


LONG = {"model": "m", "prompt": "w1 w2 w3", "max_tokens": 3000, "ignore_eos": True}
"""A request that runs its 3,000 tokens (`ignore_eos`: the test model's dummy weights may
sample its EOS)."""


@pytest.fixture
def seat_taken(served: int) -> Iterator[None]:
    """A long request takes the server's only seat (max-num-seqs 1): sent, its answer never
    read. The deadline policy predicts lengths from finished requests, not from `max_tokens`,
    so one such request runs to its end first: the policy then expects the one holding the
    seat to run as long. Its connection is closed before the server stops, so vLLM aborts it
    and the server ends at once; left open, vLLM's shutdown (its engine killed first) kept the
    server waiting 30 s for that connection."""
    status, _, text = post(served, "/v1/completions", LONG, TEACH_S)
    assert status == 200, text
    assert json.loads(text)["usage"]["completion_tokens"] == LONG["max_tokens"]
    connection = http.client.HTTPConnection("127.0.0.1", served, timeout=T)
    connection.request(
        "POST", "/v1/completions", json.dumps(LONG), {"Content-Type": "application/json"}
    )
    try:
        yield
    finally:
        connection.close()


SHORT = {"model": "m", "prompt": "w4 w5", "max_tokens": 20, "ignore_eos": True}


def _full(port: int) -> bool:
    """Whether a short request is ended (or refused) rather than served: the box is full."""
    status, _, text = _post(port, "/v1/completions", SHORT)
    return status == 503 or REASON in text


def _eventually(check: Any, timeout: float = T) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


@pytest.mark.parametrize("served", [False], indirect=True, ids=["engine"])
@pytest.mark.usefixtures("seat_taken")
def test_what_a_client_sees_of_a_request_ended_before_its_first_token(served: int) -> None:
    """With the only seat taken for thousands of steps, a new request cannot start within 3 s:
    the scheduler ends it at arrival. Not streaming: 200 with an empty text, finish_reason
    abort and stop_reason edgemon:start_deadline; streaming: only `data: [DONE]`; chat
    streaming: the role chunk, then `data: [DONE]` (as docs/client.md says)."""
    assert _eventually(lambda: _full(served))
    status, _, text = _post(served, "/v1/completions", SHORT)
    assert status == 200
    (choice,) = json.loads(text)["choices"]
    assert (choice["text"], choice["finish_reason"], choice["stop_reason"]) == ("", "abort", REASON)
    assert json.loads(text)["usage"]["completion_tokens"] == 0
    status, _, text = _post(served, "/v1/completions", SHORT | {"stream": True})
    assert (status, text.strip()) == (200, "data: [DONE]")
    chat = {"model": "m", "messages": [{"role": "user", "content": "w6"}], "max_tokens": 9}
    status, _, text = _post(served, "/v1/chat/completions", chat | {"stream": True})
    events = [line for line in text.splitlines() if line.startswith("data: ")]
    assert status == 200
    assert events[-1] == "data: [DONE]"
    assert [json.loads(e[6:])["choices"][0]["delta"] for e in events[:-1]] == [
        {"role": "assistant", "content": ""}
    ]


@pytest.mark.parametrize("served", [True], indirect=True, ids=["middleware"])
@pytest.mark.usefixtures("seat_taken")
def test_the_middleware_answers_503_once_the_box_is_full(served: int) -> None:
    """With `--middleware edgemon.integrations.shed.EdgemonShedMiddleware`, once the
    scheduler's capacity object predicts a start wait over 3 s, completions are refused with
    503, Retry-After and vLLM's error shape."""
    assert _eventually(lambda: _post(served, "/v1/completions", SHORT)[0] == 503)
    status, headers, text = _post(served, "/v1/completions", SHORT)
    assert status == 503
    assert int(headers["retry-after"]) >= 1
    error = json.loads(text)["error"]
    assert (error["type"], error["code"]) == ("ServiceUnavailableError", 503)
    assert "start SLO" in error["message"]
