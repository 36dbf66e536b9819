"""`edgemon top` as a subprocess against a small canned daemon on a free port."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import sys
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import pytest
from aiohttp import web

from edgemon.adapters.http import serve
from edgemon.cli.errors import UsageError
from edgemon.cli.top import base_url, totals_from_metrics
from edgemon.view import DeviceTotals

from ports import free_port

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path


TIMEOUT_S = 20.0

#: What `/api/v1/streams` answers (the shape of `edgemon.adapters.http.streams_view`).
STREAMS: dict[str, Any] = {
    "wall_ms": 1_700_000_001_000.0,
    "devices": [
        {
            "device": "jetson-a",
            "t_ms": 1_700_000_000_900.0,
            "throttle": True,
            "throttle_since_ms": 1_700_000_000_400.0,
            "margin_ms": 80.0,
            "clock_offset_ms": 100.0,
            "last_message_wall_ms": 1_700_000_000_950.0,
            "streams_at_risk": 1,
            "min_headroom_ms": -120.0,
            "streams": [
                {"stream": "req-17", "phase": "live", "slack_ms": 180.0, "eta_ms": 300.0,
                 "headroom_ms": -120.0, "at_risk": True, "margin_ms": 80.0, "chunks": 3,
                 "underruns": 1, "in_underrun": False},
                {"stream": "req-18", "phase": "live", "slack_ms": 2400.0, "eta_ms": 200.0,
                 "headroom_ms": 2200.0, "at_risk": False, "margin_ms": 80.0, "chunks": 5,
                 "underruns": 0, "in_underrun": False},
            ],
        },
        {
            "device": "x86-b",
            "t_ms": 1_700_000_001_000.0,
            "throttle": False,
            "throttle_since_ms": None,
            "margin_ms": 120.0,
            "clock_offset_ms": 0.0,
            "last_message_wall_ms": 1_700_000_000_990.0,
            "streams_at_risk": 0,
            "min_headroom_ms": None,
            "streams": [
                {"stream": "waiting-1", "phase": "waiting", "slack_ms": None, "eta_ms": None,
                 "headroom_ms": None, "at_risk": False, "margin_ms": 120.0, "chunks": 0,
                 "underruns": 0, "in_underrun": False},
            ],
        },
    ],
}  # fmt: skip

METRICS = """\
# HELP edgemon_underruns_total Underruns begun.
# TYPE edgemon_underruns_total counter
edgemon_underruns_total{device="jetson-a"} 42.0
edgemon_underruns_total{device="x86-b"} 0.0
# HELP edgemon_throttle_engagements_total OFF to ON changes.
# TYPE edgemon_throttle_engagements_total counter
edgemon_throttle_engagements_total{device="jetson-a"} 9.0
edgemon_throttle_engagements_total{device="x86-b"} 2.0
"""

AUTH = ("viewer", "pa:ss word")


def canned_app(*, auth: tuple[str, str] | None = None) -> web.Application:
    """The two paths `top` reads, optionally behind basic auth."""
    expected = None
    if auth is not None:
        expected = "Basic " + base64.b64encode(":".join(auth).encode()).decode()

    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        if expected is not None and request.headers.get("Authorization") != expected:
            raise web.HTTPUnauthorized
        response: web.StreamResponse = await handler(request)
        return response

    async def streams(_request: web.Request) -> web.Response:
        return web.json_response(STREAMS)

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(text=METRICS, content_type="text/plain")

    app = web.Application(middlewares=[check])
    app.router.add_get("/api/v1/streams", streams)
    app.router.add_get("/metrics", metrics)
    return app


@asynccontextmanager
async def daemon(app: web.Application) -> AsyncIterator[str]:
    """`app` on a free port of 127.0.0.1; yields its base URL."""
    async with serve(app, host="127.0.0.1", port=0, shutdown_timeout=0.5) as port:
        yield f"http://127.0.0.1:{port}"


async def top(*args: str) -> tuple[int, str, str]:
    """Run `edgemon top ARGS` (not a terminal, 140 columns); exit code, stdout, stderr."""
    env = {**os.environ, "COLUMNS": "140", "LINES": "50"}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "edgemon", "top", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), TIMEOUT_S)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@pytest.mark.integration  # starts a process
@pytest.mark.asyncio
async def test_once_prints_one_frame_of_the_daemon() -> None:
    """`--once` prints the devices (throttle ON/off), the streams lowest headroom first, the
    totals read from /metrics (42 underruns, 9 engagements), and exits 0."""
    async with daemon(canned_app()) as url:
        code, out, err = await top("--once", "--url", url)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].startswith(f"edgemon top  {url}")
    [row_a] = [line for line in lines if "jetson-a" in line and "ON" in line]
    assert "ON 0.5s" in row_a
    cells = row_a.split()
    assert "42" in cells
    assert "9" in cells
    [row_b] = [line for line in lines if "x86-b" in line and "off" in line]
    assert "120" in row_b
    order = [s for line in lines for s in ("req-17", "req-18", "waiting-1") if s in line]
    assert order == ["req-17", "req-18", "waiting-1"]
    assert "AT RISK" in next(line for line in lines if "req-17" in line)


@pytest.mark.integration  # starts a process
@pytest.mark.asyncio
async def test_once_with_basic_auth(tmp_path: Path) -> None:
    """Behind basic auth, `--user` and `--password-file` get the frame; without them the
    answer is one line on stderr saying 401, exit 2."""
    password_file = tmp_path / "password"
    password_file.write_text(AUTH[1] + "\n", encoding="utf-8")
    async with daemon(canned_app(auth=AUTH)) as url:
        denied = await top("--once", "--url", url)
        allowed = await top(
            "--once", "--url", url, "--user", AUTH[0], "--password-file", str(password_file)
        )
    code, out, err = denied
    assert (code, out) == (2, "")
    assert err.count("\n") == 1
    assert "401 unauthorized" in err
    code, out, err = allowed
    assert (code, err) == (0, "")
    assert "req-17" in out


@pytest.mark.integration  # starts a process
@pytest.mark.asyncio
async def test_once_unreachable_is_one_line_and_exit_1() -> None:
    """Nothing listening: `--once` prints one line on stderr naming the URL, exit 1 — the
    code `simulate` gives for an unreachable broker (README: a failure, not bad usage)."""
    url = f"http://127.0.0.1:{free_port()}"
    code, out, err = await top("--once", "--url", url)
    assert (code, out) == (1, "")
    assert err.count("\n") == 1
    assert err.startswith(f"edgemon top: {url}: connection refused")


@pytest.mark.integration  # starts a process
@pytest.mark.asyncio
async def test_watch_keeps_polling_an_unreachable_daemon_and_stops_on_sigterm() -> None:
    """Without `--once` (and not on a terminal) each poll prints a line, `unreachable` while
    nothing listens; SIGTERM ends it with exit 0."""
    url = f"http://127.0.0.1:{free_port()}"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "edgemon", "top", "--url", url, "--interval", "0.1",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stdout is not None
    first = await asyncio.wait_for(process.stdout.readline(), TIMEOUT_S)
    second = await asyncio.wait_for(process.stdout.readline(), TIMEOUT_S)
    process.send_signal(signal.SIGTERM)
    _, err = await asyncio.wait_for(process.communicate(), TIMEOUT_S)
    assert process.returncode == 0, err
    assert b"unreachable: connection refused" in first
    assert b"unreachable" in second


def test_base_url_accepts_the_root_or_the_streams_path() -> None:
    """`--url` may be the daemon's root or its /api/v1/streams; anything but http(s) is
    refused."""
    assert base_url("http://h:9857") == "http://h:9857"
    assert base_url("https://h:9857/") == "https://h:9857"
    assert base_url("http://h:9857/api/v1/streams") == "http://h:9857"
    assert base_url("http://h/edgemon/api/v1/streams/") == "http://h/edgemon"
    for bad in ("ftp://h", "h:9857", "http://h:99999"):
        with pytest.raises(UsageError):
            base_url(bad)


def test_totals_from_metrics() -> None:
    """Underruns and throttle engagements per device come from the counters' samples."""
    assert totals_from_metrics(METRICS) == {
        "jetson-a": DeviceTotals(underruns=42, throttle_engagements=9),
        "x86-b": DeviceTotals(underruns=0, throttle_engagements=2),
    }
    assert totals_from_metrics("not { metrics") is None
