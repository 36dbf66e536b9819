"""`edgemon top`: a live terminal view of a running daemon (README).

Polls `/api/v1/streams` every `--interval` seconds and draws the same view as `edgemon demo`.
It also reads `/metrics`, when it can, for what the streams body does not carry: underruns
and throttle engagements since the daemon started. `--once` prints one frame and exits (1
with one line on stderr when the daemon cannot be reached: a failure, not bad usage, the same
code as `simulate` for an unreachable broker); otherwise an unreachable daemon is shown as
such and polled again. Not a terminal: one status line per poll instead of frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.live import Live
from rich.text import Text

from edgemon.cli.errors import EXIT_FAILURE, EXIT_OK, UsageError
from edgemon.cli.signals import on_stop_signals
from edgemon.errors import EdgemonError
from edgemon.view import DeviceTotals, ViewError, render_view, status_line

if TYPE_CHECKING:
    import argparse
    from collections.abc import AsyncIterator

    from rich.console import RenderableType

STREAMS_PATH = "/api/v1/streams"
METRICS_PATH = "/metrics"
TIMEOUT_S = 5.0
#: Lines of a frame besides the stream rows (see `edgemon.cli.demo`).
_FRAME_CHROME = 12


class UnreachableError(EdgemonError):
    """The daemon could not be read; the message says why, in a few words."""


class RefusedError(UnreachableError):
    """The daemon answered, but refused our credentials: bad input, not a failure."""


def register(commands: argparse._SubParsersAction[Any], help_text: str) -> None:
    """Add `top` to the command line; `help_text` is its line in `edgemon --help`."""
    parser = commands.add_parser(
        "top",
        help=help_text,
        description="Devices, throttle state and the streams lowest in headroom of a running "
        "daemon, read from its /api/v1/streams (and /metrics for totals).",
    )
    parser.add_argument(
        "--url",
        default="http://127.0.0.1:9857",
        help="the daemon's HTTP address (default http://127.0.0.1:9857)",
    )
    parser.add_argument(
        "--interval", type=float, default=1.0, metavar="S", help="seconds between polls (default 1)"
    )
    parser.add_argument(
        "--once",
        action="store_true",
        help="print one frame and exit (1 if the daemon cannot be reached)",
    )
    parser.add_argument("--user", metavar="U", help="HTTP basic auth user")
    parser.add_argument(
        "--password-file", type=Path, metavar="F", help="file holding the basic auth password"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Check the flags, then show one frame (`--once`) or keep polling until interrupted."""
    base = base_url(args.url)
    if not (math.isfinite(args.interval) and args.interval > 0):
        raise UsageError("--interval must be a number of seconds > 0")
    auth = _auth(args.user, args.password_file)
    console = Console()
    if args.once:
        return asyncio.run(_once(base, auth, console))
    return asyncio.run(_watch(base, auth, console, args.interval))


def base_url(url: str) -> str:
    """The daemon's root URL: `http(s)://host[:port]`, minus `/api/v1/streams` if given."""
    try:
        parts = urlsplit(url)
        _ = parts.port
    except ValueError as exc:
        raise UsageError(f"--url {url!r}: {exc}") from None
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise UsageError(f"--url {url!r}: expected http://host[:port]")
    path = parts.path.rstrip("/").removesuffix(STREAMS_PATH)
    return f"{parts.scheme}://{parts.netloc}{path}"


def _auth(user: str | None, password_file: Path | None) -> aiohttp.BasicAuth | None:
    if (user is None) != (password_file is None):
        raise UsageError("--user and --password-file go together")
    if user is None or password_file is None:
        return None
    try:
        password = password_file.read_text(encoding="utf-8").rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise UsageError(f"--password-file {password_file}: {reason}") from None
    return aiohttp.BasicAuth(user, password)


# ---------------------------------------------------------------------- reading the daemon
async def fetch(
    session: aiohttp.ClientSession, base: str
) -> tuple[dict[str, Any], dict[str, DeviceTotals] | None]:
    """The streams body and, if `/metrics` answers, the totals per device."""
    streams, metrics = await asyncio.gather(
        _get(session, base + STREAMS_PATH), _get(session, base + METRICS_PATH, optional=True)
    )
    assert streams is not None
    try:
        view = json.loads(streams)
    except ValueError:
        raise UnreachableError(f"{STREAMS_PATH} did not answer JSON") from None
    if not isinstance(view, dict):
        raise UnreachableError(f"{STREAMS_PATH} did not answer a JSON object")
    return view, None if metrics is None else totals_from_metrics(metrics)


async def _get(session: aiohttp.ClientSession, url: str, *, optional: bool = False) -> str | None:
    try:
        async with session.get(url) as response:
            if response.status == 401:
                raise RefusedError("401 unauthorized (give --user and --password-file)")
            if response.status != 200:
                if optional:
                    return None
                raise UnreachableError(f"{response.status} {response.reason} from {url}")
            return await response.text()
    except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError) as exc:
        if optional and not isinstance(exc, aiohttp.ClientConnectionError):
            return None
        raise UnreachableError(_reason(exc)) from None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer within {TIMEOUT_S:g} s"
    if isinstance(exc, aiohttp.ClientConnectorError) and (number := exc.os_error.errno):
        error = exc.os_error
        text = error.strerror if isinstance(error, socket.gaierror) else None
        return f"{(text or os.strerror(number)).lower()} ({exc.host}:{exc.port})"
    return str(exc) or type(exc).__name__


def totals_from_metrics(text: str) -> dict[str, DeviceTotals] | None:
    """Underruns and throttle engagements per device from a Prometheus text exposition."""
    underruns: dict[str, int] = {}
    engagements: dict[str, int] = {}
    counts = {"edgemon_underruns": underruns, "edgemon_throttle_engagements": engagements}
    try:
        for family in text_string_to_metric_families(text):
            found = counts.get(family.name.removesuffix("_total"))
            if found is None:
                continue
            for sample in family.samples:
                device = sample.labels.get("device")
                if sample.name.endswith("_total") and device is not None:
                    found[device] = int(sample.value)
    except ValueError:  # not the text format: do without totals
        return None
    return {
        device: DeviceTotals(underruns.get(device, 0), engagements.get(device, 0))
        for device in underruns.keys() | engagements.keys()
    }


# ---------------------------------------------------------------------- showing it
def _frame(
    view: dict[str, Any] | None,
    totals: dict[str, DeviceTotals] | None,
    *,
    base: str,
    problem: str | None,
    console: Console,
) -> RenderableType:
    """The view (the last one read, if the daemon is unreachable now) under a status line."""
    stamp = time.strftime("%H:%M:%S")
    status = (
        Text(f"unreachable: {problem} (retrying)  {stamp}", style="bold red")
        if problem is not None
        else Text(f"updated {stamp}", style="dim")
    )
    title = f"edgemon top  {base}"
    if view is None:  # never read yet
        return Text.assemble((title, "bold"), "  ", status)
    devices = view.get("devices")
    rows = console.size.height - _FRAME_CHROME - (len(devices) if isinstance(devices, list) else 0)
    try:
        return render_view(
            view,
            title=title,
            status=status,
            totals=totals,
            max_streams=max(3, rows),
        )
    except ViewError as exc:
        return Text(f"{title}  unexpected answer: {exc}", style="bold red")


async def _once(base: str, auth: aiohttp.BasicAuth | None, console: Console) -> int:
    async with _session(auth) as session:
        try:
            view, totals = await fetch(session, base)
        except RefusedError as exc:
            raise UsageError(f"{base}: {exc}") from None
        except UnreachableError as exc:
            print(f"edgemon top: {base}: {exc}", file=sys.stderr)
            return EXIT_FAILURE
    try:
        frame = render_view(view, title=f"edgemon top  {base}", totals=totals, max_streams=20)
    except ViewError as exc:
        raise UsageError(f"{base}{STREAMS_PATH}: {exc}") from None
    console.print(frame)
    return EXIT_OK


async def _watch(
    base: str, auth: aiohttp.BasicAuth | None, console: Console, interval: float
) -> int:
    stop = asyncio.Event()
    view: dict[str, Any] | None = None
    totals: dict[str, DeviceTotals] | None = None
    async with _session(auth) as session:
        with on_stop_signals(stop.set), contextlib.ExitStack() as stack:
            live = None
            if console.is_terminal:
                live = stack.enter_context(Live(console=console, refresh_per_second=4))
            while not stop.is_set():
                problem = None
                try:
                    view, totals = await fetch(session, base)
                except UnreachableError as exc:
                    problem = str(exc)
                if live is not None:
                    live.update(
                        _frame(view, totals, base=base, problem=problem, console=console),
                        refresh=True,
                    )
                else:
                    print(_line(view if problem is None else None, totals, problem), flush=True)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), interval)
    return EXIT_OK


def _line(
    view: dict[str, Any] | None, totals: dict[str, DeviceTotals] | None, problem: str | None
) -> str:
    stamp = time.strftime("%H:%M:%S")
    if problem is not None or view is None:
        return f"{stamp}  unreachable: {problem}"
    try:
        return f"{stamp}  {status_line(view, totals=totals)}"
    except ViewError as exc:
        return f"{stamp}  unexpected answer: {exc}"


@contextlib.asynccontextmanager
async def _session(auth: aiohttp.BasicAuth | None) -> AsyncIterator[aiohttp.ClientSession]:
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    async with aiohttp.ClientSession(auth=auth, timeout=timeout) as session:
        yield session
