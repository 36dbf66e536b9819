"""The HTTP endpoint (runbook.md): a real server on a free port, real requests, TLS and auth."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import ssl
import subprocess
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from edgemon.adapters.connection_state import ConnectionState
from edgemon.adapters.exposition import PART_BYTES
from edgemon.adapters.http import (
    basic_auth_from_settings,
    create_app,
    serve,
    ssl_context_from_files,
    streams_view,
)
from edgemon.adapters.metrics import build_registry
from edgemon.engine import EngineConfig
from edgemon.monitor import Monitor
from edgemon.settings import HttpSettings

from tools import require_tool

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from aiohttp.typedefs import Handler

    from edgemon.engine.outputs import Output

OFFSET = 5_000.0
D = 100_000.0
AUTH = ("scraper", "s3cr3t:with colon")


class Daemon:
    """What the HTTP adapter reads: a fed Monitor, a settable wall clock, a connection state."""

    def __init__(self) -> None:
        self.wall_ms = D + OFFSET
        self.monitor = Monitor(EngineConfig())
        self.connection = ConnectionState()
        self.registry = build_registry(
            self.monitor,
            wall_clock=self.clock,
            connection=self.connection,
            per_stream_series=20,
            version="1.2.3",
        )
        self.out: list[Output] = []

    def clock(self) -> float:
        return self.wall_ms

    def send(self, t: float, *events: dict[str, Any]) -> None:
        """Events from device d1 at device time `t`, received at wall `t + OFFSET`."""
        self.wall_ms = t + OFFSET
        payload = json.dumps(list(events)).encode()
        self.monitor.handle("edgemon/v1/d1/events", payload, self.wall_ms, self.out)

    def app(self, basic_auth: tuple[str, str] | None = None) -> web.Application:
        return create_app(
            registry=self.registry,
            monitor=self.monitor,
            connection=self.connection,
            wall_clock=self.clock,
            basic_auth=basic_auth,
        )


def chunk(stream: str, t: float, seq: int, audio: float, **extra: Any) -> dict[str, Any]:
    return {"type": "chunk", "stream": stream, "t_ms": t, "seq": seq, "audio_ms": audio} | extra


@pytest.fixture
def daemon() -> Daemon:
    """d1 with a live stream s1 (B 1100 ms from D+100, next chunk due D+400), a draining
    stream f (1000 ms from D+300) and a stream w waiting for its first chunk."""
    daemon = Daemon()
    daemon.send(D + 100, chunk("s1", D + 100, 0, 400, eta_ms=100))
    daemon.send(D + 200, chunk("s1", D + 200, 1, 400, eta_ms=100))
    daemon.send(
        D + 300,
        chunk("s1", D + 300, 2, 300, eta_ms=100),
        chunk("f", D + 300, 0, 1000, final=True),
        {"type": "start", "stream": "w", "t_ms": D + 300},
    )
    return daemon


@asynccontextmanager
async def running(
    app: web.Application, *, ssl_context: ssl.SSLContext | None = None
) -> AsyncIterator[str]:
    """The app served on a free port of 127.0.0.1; yields its base URL."""
    async with serve(app, host="127.0.0.1", port=0, ssl_context=ssl_context) as port:
        assert port > 0
        yield f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}"


@pytest.mark.asyncio
async def test_metrics_in_both_exposition_formats(daemon: Daemon) -> None:
    """/metrics serves the registry as Prometheus text, or OpenMetrics when the Accept asks."""
    async with running(daemon.app()) as url, aiohttp.ClientSession() as client:
        async with client.get(f"{url}/metrics") as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = await response.text()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert families["edgemon_chunks"].samples[0].value == 4
        assert families["edgemon_streams_active"].samples[0].value == 3

        accept = {"Accept": "application/openmetrics-text; version=1.0.0"}
        async with client.get(f"{url}/metrics", headers=accept) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("application/openmetrics-text")
            text = await response.text()
        assert text.endswith("# EOF\n")
        names = {f.name for f in openmetrics_families(text)}  # type: ignore[no-untyped-call]
        assert {"edgemon_chunks", "edgemon_build", "edgemon_headroom_min_seconds"} <= names


@pytest.mark.asyncio
async def test_healthz_and_readyz_follow_the_connection(daemon: Daemon) -> None:
    """/healthz is 200; /readyz is 503 with a reason until connected and subscribed, then 200."""
    async with running(daemon.app()) as url, aiohttp.ClientSession() as client:
        async with client.get(f"{url}/healthz") as response:
            assert (response.status, await response.text()) == (200, "ok\n")
        async with client.get(f"{url}/readyz") as response:
            assert response.status == 503
            assert "not connected" in await response.text()
        daemon.connection.connected = True
        async with client.get(f"{url}/readyz") as response:
            assert response.status == 503
            assert "subscriptions" in await response.text()
        daemon.connection.subscribed = True
        async with client.get(f"{url}/readyz") as response:
            assert response.status == 200
        daemon.connection.connected = False  # broker lost: not ready again
        async with client.get(f"{url}/readyz") as response:
            assert response.status == 503


@pytest.mark.asyncio
async def test_streams_api_at_the_devices_current_time(daemon: Daemon) -> None:
    """/api/v1/streams: per device and stream, values at the device's clock of the request."""
    daemon.wall_ms = D + 350 + OFFSET
    async with (
        running(daemon.app()) as url,
        aiohttp.ClientSession() as client,
        client.get(f"{url}/api/v1/streams") as response,
    ):
        assert response.status == 200
        assert response.content_type == "application/json"
        body = await response.json()
    assert body["wall_ms"] == D + 350 + OFFSET
    [device] = body["devices"]
    streams = device.pop("streams")
    assert device == {
        "device": "d1",
        "t_ms": D + 350,
        "throttle": False,
        "throttle_since_ms": None,
        "margin_ms": 80.0,
        "clock_offset_ms": OFFSET,
        "last_message_wall_ms": D + 300 + OFFSET,
        "streams_at_risk": 0,
        "min_headroom_ms": 800.0,
    }
    # s1: slack 1100 − 250 = 850, next chunk in 50 ms: headroom 800. Then by id.
    assert [(s["stream"], s["phase"]) for s in streams] == [
        ("s1", "live"),
        ("f", "draining"),
        ("w", "waiting"),
    ]
    s1, f, w = streams
    assert s1 == {
        "stream": "s1",
        "phase": "live",
        "slack_ms": 850.0,
        "eta_ms": 50.0,
        "headroom_ms": 800.0,
        "at_risk": False,
        "margin_ms": 80.0,
        "chunks": 3,
        "underruns": 0,
        "in_underrun": False,
    }
    assert (f["slack_ms"], f["eta_ms"], f["headroom_ms"], f["at_risk"]) == (
        950.0,
        None,
        None,
        False,
    )
    assert (w["slack_ms"], w["eta_ms"], w["headroom_ms"], w["chunks"]) == (None, None, None, 0)


def test_streams_view_marks_risk_as_the_clock_moves(daemon: Daemon) -> None:
    """At D+1150 s1's headroom is 50 < 80: at risk, with no engine call in between."""
    view = streams_view(daemon.monitor, D + 1150 + OFFSET)
    [device] = view["devices"]
    assert device["streams_at_risk"] == 1
    assert device["min_headroom_ms"] == 50.0
    assert device["streams"][0]["at_risk"] is True


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "headers",
    [
        {},
        basic("scraper", "wrong"),
        basic("someone", AUTH[1]),
        basic("scraper", AUTH[1] + "x"),
        {"Authorization": "Basic !!!not-base64"},
        {"Authorization": "Bearer " + base64.b64encode(b"scraper:s3cr3t").decode()},
        {"Authorization": "Basic " + base64.b64encode(b"scraper").decode()},
    ],
    ids=["none", "wrong-password", "wrong-user", "longer", "garbage", "bearer", "no-colon"],
)
async def test_basic_auth_rejects_missing_or_wrong_credentials(
    daemon: Daemon, headers: dict[str, str]
) -> None:
    """Without the right credentials every protected path answers 401 with a challenge."""
    async with running(daemon.app(AUTH)) as url, aiohttp.ClientSession() as client:
        for path in ["/metrics", "/readyz", "/api/v1/streams", "/nowhere"]:
            async with client.get(f"{url}{path}", headers=headers) as response:
                assert response.status == 401, path
                assert response.headers["WWW-Authenticate"].startswith('Basic realm="edgemon"')


@pytest.mark.asyncio
async def test_basic_auth_accepts_the_right_credentials_and_leaves_healthz_open(
    daemon: Daemon,
) -> None:
    """The right user and password (a colon in it included) pass; /healthz needs none."""
    async with running(daemon.app(AUTH)) as url, aiohttp.ClientSession() as client:
        for path in ["/metrics", "/api/v1/streams"]:
            async with client.get(f"{url}{path}", headers=basic(*AUTH)) as response:
                assert response.status == 200, path
        async with client.get(f"{url}/healthz") as response:
            assert response.status == 200


@pytest.mark.asyncio
async def test_serve_releases_the_port_on_exit(daemon: Daemon) -> None:
    """After `serve` exits, nothing listens on the port it reported."""
    async with running(daemon.app()) as url:
        pass
    async with aiohttp.ClientSession() as client:
        with pytest.raises(aiohttp.ClientConnectionError):
            await client.get(f"{url}/healthz")


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A throw-away self-signed certificate for 127.0.0.1 and its key, made by `openssl`."""
    openssl = require_tool("openssl")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    options = (
        "req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1"
        " -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1,DNS:localhost"
    )
    command = [openssl, *options.split(), "-keyout", str(key), "-out", str(cert)]
    subprocess.run(command, check=True, capture_output=True)
    return cert, key


@pytest.mark.integration  # starts a process
@pytest.mark.asyncio
async def test_tls(daemon: Daemon, certificate: tuple[Path, Path]) -> None:
    """With a certificate the endpoint speaks HTTPS; a client trusting it gets the metrics."""
    cert, key = certificate
    trust = ssl.create_default_context(cafile=str(cert))
    async with (
        running(daemon.app(AUTH), ssl_context=ssl_context_from_files(cert, key)) as url,
        aiohttp.ClientSession() as client,
    ):
        assert url.startswith("https://")
        async with client.get(f"{url}/metrics", headers=basic(*AUTH), ssl=trust) as response:
            assert response.status == 200
            assert "edgemon_chunks_total" in await response.text()
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await client.get(f"{url}/healthz")  # the system's CAs do not trust it


def test_basic_auth_from_settings(tmp_path: Path) -> None:
    """`[http]` gives (user, password) with the password from the environment or its file."""
    assert basic_auth_from_settings(HttpSettings()) is None
    given = HttpSettings(basic_auth_user="scraper", basic_auth_password="from env")
    assert basic_auth_from_settings(given) == ("scraper", "from env")
    secret = tmp_path / "password"
    secret.write_text("from file\n")
    in_file = HttpSettings(basic_auth_user="scraper", basic_auth_password_file=secret)
    assert basic_auth_from_settings(in_file) == ("scraper", "from file")


def test_connection_state_is_ready_only_when_connected_and_subscribed() -> None:
    """`ready` needs both flags (what /readyz answers)."""
    state = ConnectionState(connected=True)
    assert not state.ready
    state.subscribed = True
    assert state.ready


def fleet(devices: int, streams: int, *, per_stream_series: int = 20) -> Daemon:
    """A Daemon whose devices dev00… each have `streams` live streams (ids s00…)."""
    daemon = Daemon()
    daemon.registry = build_registry(
        daemon.monitor,
        wall_clock=daemon.clock,
        connection=daemon.connection,
        per_stream_series=per_stream_series,
        version="1.2.3",
    )
    t = D + 100
    daemon.wall_ms = t + OFFSET
    for d in range(devices):
        events = [chunk(f"s{s:02d}", t, 0, 1000 + 10 * s, eta_ms=100) for s in range(streams)]
        payload = json.dumps(events).encode()
        daemon.monitor.receive(f"edgemon/v1/dev{d:02d}/events", payload, daemon.wall_ms, daemon.out)
    daemon.monitor.advance(daemon.wall_ms, daemon.out)
    return daemon


@pytest.mark.asyncio
async def test_streams_api_filters_by_device_and_pages_the_fleet() -> None:
    """`?device=` answers one device (none if unknown); `?limit=` pages the fleet by device
    id and `next_cursor` leads through every device once, null on the last page; a bad limit
    is a 400. The shape of each device is the unpaged one."""
    daemon = fleet(7, 2)
    async with running(daemon.app()) as url, aiohttp.ClientSession() as client:
        async with client.get(f"{url}/api/v1/streams", params={"device": "dev03"}) as response:
            assert response.status == 200
            body = await response.json()
        assert [d["device"] for d in body["devices"]] == ["dev03"]
        assert [s["stream"] for s in body["devices"][0]["streams"]] == ["s00", "s01"]
        assert body["next_cursor"] is None
        async with client.get(f"{url}/api/v1/streams", params={"device": "nope"}) as response:
            assert (await response.json())["devices"] == []

        pages = []
        params = {"limit": "3"}
        while True:
            async with client.get(f"{url}/api/v1/streams", params=params) as response:
                assert response.status == 200
                body = await response.json()
            pages.append([d["device"] for d in body["devices"]])
            if body["next_cursor"] is None:
                break
            params = {"limit": "3", "cursor": body["next_cursor"]}
        assert pages == [["dev00", "dev01", "dev02"], ["dev03", "dev04", "dev05"], ["dev06"]]
        async with client.get(f"{url}/api/v1/streams") as response:
            whole = await response.json()
        assert whole["devices"] == streams_view(daemon.monitor, daemon.wall_ms)["devices"]
        for bad in ("0", "x", "100000"):
            async with client.get(f"{url}/api/v1/streams", params={"limit": bad}) as response:
                assert response.status == 400


@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["/metrics", "/api/v1/streams"])
async def test_requests_let_the_event_loop_run_between_slices(path: str) -> None:
    """A request at fleet scale hands the loop back between devices and between pieces of
    the text (here after every slice: budget 0), so a due deadline never waits for the
    whole fleet (docs/runbook.md): a task that counts loop turns advances while the request runs."""
    devices = 12
    daemon = fleet(devices, 30)
    app = create_app(
        registry=daemon.registry,
        monitor=daemon.monitor,
        connection=daemon.connection,
        wall_clock=daemon.clock,
        slice_budget_s=0.0,
    )
    turns = 0
    during: list[int] = []

    @web.middleware
    async def watch(request: web.Request, handler: Handler) -> web.StreamResponse:
        before = turns
        response = await handler(request)
        during.append(turns - before)
        return response

    app.middlewares.append(watch)

    async def count_turns() -> None:
        nonlocal turns
        while True:
            await asyncio.sleep(0)
            turns += 1

    counter = asyncio.create_task(count_turns())
    try:
        async with (
            running(app) as url,
            aiohttp.ClientSession() as client,
            client.get(f"{url}{path}") as response,
        ):
            assert response.status == 200
            await response.read()
    finally:
        counter.cancel()
    # Each device is one slice at least: the loop turned that often inside the handler.
    assert during[0] >= devices


@pytest.mark.asyncio
@pytest.mark.parametrize("accept", ["", "application/openmetrics-text; version=1.0.0"])
async def test_sliced_exposition_is_the_registry_text(accept: str) -> None:
    """/metrics built a slice at a time is exactly the text prometheus_client renders from
    the registry in one go, in both formats (families cut into pieces join seamlessly)."""
    daemon = fleet(5, 40, per_stream_series=30)
    headers = {"Accept": accept} if accept else {}
    async with (
        running(daemon.app()) as url,
        aiohttp.ClientSession() as client,
        client.get(f"{url}/metrics", headers=headers) as response,
    ):
        text = await response.text()
    encoder, _ = choose_encoder(accept)
    expected = encoder(daemon.registry).decode()
    strip = re.compile(r"^(process_|python_).*\n", re.MULTILINE)  # the process moves on
    assert strip.sub("", text) == strip.sub("", expected)
    assert text.count("edgemon_stream_headroom_seconds{") == 5 * 30


@pytest.mark.asyncio
@pytest.mark.parametrize("encoding", ["identity", "gzip", "deflate"])
async def test_metrics_are_the_registry_text_written_in_pieces_or_compressed(
    encoding: str,
) -> None:
    """Uncompressed, /metrics is written piece by piece under a Content-Length (no chunked
    framing, never copied whole); compressed when the client asks. Either way the body is
    the text prometheus_client renders from the registry, and a HEAD has no body."""
    daemon = fleet(30, 40, per_stream_series=30)  # several pieces of `PART_BYTES`
    expected = choose_encoder("")[0](daemon.registry).decode()
    strip = re.compile(r"^(process_|python_).*\n", re.MULTILINE)  # the process moves on
    headers = {"Accept-Encoding": encoding}
    async with (
        running(daemon.app()) as url,
        aiohttp.ClientSession(auto_decompress=True) as client,
    ):
        async with client.get(f"{url}/metrics", headers=headers) as response:
            assert response.status == 200
            raw = await response.content.read() if encoding == "identity" else None
            text = raw.decode() if raw is not None else await response.text()
            sent = response.headers
        async with client.head(f"{url}/metrics", headers=headers) as head:
            assert head.status == 200
            assert await head.read() == b""
    assert len(expected) > 2 * PART_BYTES
    assert strip.sub("", text) == strip.sub("", expected)
    if encoding == "identity":
        assert "Content-Encoding" not in sent
        assert "Transfer-Encoding" not in sent
        assert int(sent["Content-Length"]) == len(raw or b"")
    else:
        assert sent["Content-Encoding"] == encoding
