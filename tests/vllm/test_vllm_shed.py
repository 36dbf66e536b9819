"""Shedding at arrival: the ASGI middleware in vLLM's own app (through vLLM's `--middleware`
option) and in a plain Starlette app, following the capacity object on a real Mosquitto."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("vllm.entrypoints.launchers.app", exc_type=ImportError)

from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient
from vllm.entrypoints.launchers.app import build_app
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser

from edgemon.shedding.middleware import (
    GENERATION_PATHS,
    CapacityView,
    EdgemonShedMiddleware,
    Refusal,
)
from edgemon.shedding.topic import TopicConfig

from brokers import free_port
from mqtt_probe import Probe, probe

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from starlette.requests import Request

    from brokers import Broker

pytestmark = pytest.mark.integration

T = 30.0  # generous: a loaded machine
DEVICE = "box-1"
CAPACITY = f"edgemon/v1/{DEVICE}/capacity"
SHED = f"{CAPACITY}/shed/+"
MIDDLEWARE = "edgemon.integrations.shed.EdgemonShedMiddleware"


def eventually(check: Callable[[], bool], timeout: float = T) -> bool:
    """Whether `check()` became true within `timeout` seconds (polled)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture
def server_env(private_broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    """The API server's environment: the device, the test's broker, the default start SLO."""
    host, port = private_broker.host, private_broker.port
    monkeypatch.setenv("EDGEMON_GATE_DEVICE", DEVICE)
    monkeypatch.setenv("EDGEMON_GATE_BROKER", f"mqtt://{host}:{port}")
    monkeypatch.delenv("EDGEMON_SLO_START_MS", raising=False)


@pytest.fixture
def engine(private_broker: Broker) -> Iterator[Probe]:
    """A probe playing the engine's capacity publisher, watching the refusal counts."""
    with probe(private_broker.host, private_broker.port, SHED) as publisher:
        yield publisher


@pytest.fixture
def shedding(server_env: None) -> Iterator[EdgemonShedMiddleware]:
    """The middleware around a plain app, from the environment; its view closed after."""
    middleware = EdgemonShedMiddleware(_plain_app())
    assert middleware.view is not None
    yield middleware
    middleware.view.close()


def _generate(_request: Request) -> PlainTextResponse:
    return PlainTextResponse("generated")


def _plain_app() -> Starlette:
    """An app answering 200 on every generation path (and /v1/models)."""
    routes = [Route(path, _generate, methods=["GET", "POST"]) for path in GENERATION_PATHS]
    return Starlette(routes=[*routes, Route("/v1/models", _generate, methods=["GET", "POST"])])


def _capacity(engine: Probe, start_wait_ms: float, **more: Any) -> None:
    """The engine's object, stamped now (readers ignore one older than 15 s)."""
    engine.publish(CAPACITY, {"t_ms": time.time() * 1000, "running": 9, "waiting": 4} | more | {
        "start_wait_ms": start_wait_ms
    })  # fmt: skip


def test_vllms_middleware_option_puts_it_in_front(server_env: None, engine: Probe) -> None:
    """vLLM's own app built from `--middleware edgemon.integrations.shed.EdgemonShedMiddleware`
    (vLLM's parser and build_app): with the predicted start wait over the SLO a completion is
    refused with 503, Retry-After (the wait beyond the SLO, rounded up) and vLLM's error shape
    naming the reason; GET /v1/models is not; once the wait is back within the SLO the request
    reaches vLLM's handler; the refusals are published for the engine's shed_total."""
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--middleware", MIDDLEWARE])
    app = build_app(args, supported_tasks=("generate",))
    _capacity(engine, 4_200)
    client = TestClient(app, raise_server_exceptions=False)  # no lifespan: no engine here
    try:
        body = {"model": "m", "prompt": "hello", "max_tokens": 4}
        assert eventually(lambda: client.post("/v1/completions", json=body).status_code == 503)
        refused = client.post("/v1/completions", json=body)
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "2"
        error = refused.json()["error"]
        assert error["type"] == "ServiceUnavailableError"
        assert error["code"] == 503
        assert error["param"] is None
        assert "start SLO" in error["message"]
        assert "4.2 s > 3.0 s" in error["message"]
        assert client.get("/v1/models").status_code != 503
        assert engine.wait_for(
            lambda seen: any(m.payload and m.json()["shed_total"] >= 2 for m in seen), T
        )
        _capacity(engine, 2_000)
        # vLLM's handler, without an engine behind this app, answers 500: not a refusal.
        assert eventually(lambda: client.post("/v1/completions", json=body).status_code != 503)
    finally:
        _shed_view(app.middleware_stack).close()


def _shed_view(node: Any) -> CapacityView:
    """The view of the shedding middleware inside a built Starlette middleware stack."""
    while not isinstance(node, EdgemonShedMiddleware):
        node = node.app
    assert node.view is not None
    return node.view


def test_every_generation_path_and_only_those(
    shedding: EdgemonShedMiddleware, engine: Probe
) -> None:
    """Completions, chat completions and vLLM-Omni's speech are refused; other paths, and
    other methods on those paths, pass; a root path in front is allowed for."""
    view = shedding.view
    assert view is not None
    _capacity(engine, 10_000)
    client = TestClient(shedding)
    assert eventually(lambda: view.latest is not None)
    for path in sorted(GENERATION_PATHS):
        answer = client.post(path, json={})
        assert (answer.status_code, answer.headers["retry-after"]) == (503, "7"), path
        assert client.get(path).text == "generated"
    assert client.post("/v1/models").text == "generated"
    rooted = TestClient(shedding, root_path="/api")
    assert rooted.post("/api/v1/completions", json={}).status_code == 503
    assert view.refused_total == 4


def test_fails_open(shedding: EdgemonShedMiddleware, engine: Probe) -> None:
    """Nothing is refused before a capacity object arrives, without start_wait_ms, after the
    object is emptied (the engine went away), nor by a view not connected to its broker."""
    view = shedding.view
    assert view is not None
    client = TestClient(shedding)
    assert view.link.wait_connected(T)
    assert client.post("/v1/completions").text == "generated"
    engine.publish(CAPACITY, {"t_ms": time.time() * 1000, "running": 3})
    assert eventually(lambda: view.latest is not None)
    assert client.post("/v1/completions").text == "generated"
    _capacity(engine, 9_000)
    assert eventually(lambda: client.post("/v1/completions").status_code == 503)
    engine.publish(CAPACITY, b"")
    assert eventually(lambda: view.latest is None)
    assert client.post("/v1/completions").text == "generated"
    config = TopicConfig.from_environ(
        {"EDGEMON_GATE_DEVICE": DEVICE, "EDGEMON_GATE_BROKER": f"mqtt://127.0.0.1:{free_port()}"}
    )
    assert config is not None
    unreachable = CapacityView(config).open()
    try:
        known = {"t_ms": time.time() * 1000, "start_wait_ms": 9_000.0}
        unreachable.receive(CAPACITY, json.dumps(known).encode())  # known, but not connected
        assert unreachable.latest is not None
        assert unreachable.judge(3_000.0) is None
    finally:
        unreachable.close()


def test_without_a_device_it_is_a_pass_through(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without EDGEMON_GATE_DEVICE the middleware follows nothing and refuses nothing; a bad
    start SLO stops the server's start naming the variable."""
    monkeypatch.delenv("EDGEMON_GATE_DEVICE", raising=False)
    monkeypatch.delenv("EDGEMON_SLO_START_MS", raising=False)
    middleware = EdgemonShedMiddleware(_plain_app())
    assert middleware.view is None
    assert TestClient(middleware).post("/v1/completions").text == "generated"
    assert middleware.slo_ms == 3000.0
    custom = EdgemonShedMiddleware(_plain_app(), environ={"EDGEMON_SLO_START_MS": "1500"})
    assert custom.slo_ms == 1500.0
    for bad in ("0", "-5", "soon", "inf"):
        with pytest.raises(ValueError, match=r"^EDGEMON_SLO_START_MS: "):
            EdgemonShedMiddleware(_plain_app(), environ={"EDGEMON_SLO_START_MS": bad})


def test_retry_after_is_the_wait_beyond_the_slo() -> None:
    """Retry-After is the predicted wait beyond the SLO in whole seconds, rounded up, at least
    1 second, at most 4 start SLOs."""
    assert Refusal(3_001.0, 3_000.0).retry_after_s == 1
    assert Refusal(5_000.0, 3_000.0).retry_after_s == 2
    assert Refusal(5_001.0, 3_000.0).retry_after_s == 3
    assert Refusal(1e9, 3_000.0).retry_after_s == 12
