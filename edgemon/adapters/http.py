"""The HTTP endpoint of docs/runbook.md: metrics, health, readiness and a JSON view of the streams.

| path | answer |
|---|---|
| `/metrics` | the registry, in the Prometheus text format or OpenMetrics (by `Accept`) |
| `/healthz` | 200 `ok` while the event loop answers |
| `/readyz` | 200 once subscribed (saying why if degraded), else 503; 503 while the log fails |
| `/api/v1/streams` | devices and their streams at each device's current time (`streams_view`) |
| `/api/v1/capacity` | per device: its engine's capacity object, its age, spare real-time streams |

`/api/v1/streams` takes `?device=<id>` (that device only) and pages the fleet by device id:
`?limit=<devices per page>` (default `PAGE_DEVICES`, at most `MAX_PAGE_DEVICES`) and
`?cursor=<the previous page's next_cursor>`; `next_cursor` is null on the last page.
`/api/v1/capacity` takes `?device=<id>` too, and lists every device (a few hundred bytes each).

With `basic_auth`, every path but `/healthz` needs the credentials: a liveness probe carries
none and learns nothing from `ok`, while readiness says whether the broker is reachable.

Connections are bounded (`edgemon.adapters.connection_guard`): at most `limit` open, and each
must bring a complete request within a few seconds.

Everything runs on the event loop thread, which owns the engine: a request reads the engine
in place, one whole device between two messages, so it never sees half an update. Large
answers are built and encoded a slice at a time, yielding to the loop in between, and no
slice starts within 2 ms of the engine's next transition (`edgemon.adapters.exposition`):
no request holds up a deadline (README).
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import functools
import hmac
import json
import math
import ssl
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from aiohttp import hdrs, web

from edgemon.adapters.capacity import capacity_entry
from edgemon.adapters.connection_guard import (
    BACKLOG,
    ConnectionGuard,
    GuardedProtocol,
    guard_middleware,
    limits_for,
)
from edgemon.adapters.exposition import Slicer, render_parts
from edgemon.engine.views import device_view, device_views

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from os import PathLike

    from aiohttp.typedefs import Handler, Middleware
    from prometheus_client import CollectorRegistry

    from edgemon.adapters.connection_state import ConnectionState
    from edgemon.engine.views import DeviceView, StreamState
    from edgemon.monitor import Monitor
    from edgemon.settings import HttpSettings

__all__ = [
    "basic_auth_from_settings",
    "create_app",
    "serve",
    "ssl_context_from_files",
    "streams_view",
]

#: Paths answered without credentials.
OPEN_PATHS = frozenset({"/healthz"})
#: Devices per `/api/v1/streams` page, by default and at most.
PAGE_DEVICES = 50
MAX_PAGE_DEVICES = 1000
#: Work a request does before it lets the event loop run what is due (well under the README's
#: 2 ms for a transition).
SLICE_BUDGET_S = 0.0005


def create_app(
    *,
    registry: CollectorRegistry,
    monitor: Monitor,
    connection: ConnectionState,
    wall_clock: Callable[[], float],
    basic_auth: tuple[str, str] | None = None,
    slice_budget_s: float = SLICE_BUDGET_S,
    publishing: Callable[[], bool] | None = None,
    durability: Callable[[], str | None] = lambda: None,
) -> web.Application:
    """The application; `wall_clock` is edgemon's wall time in ms, `basic_auth` (user, password);
    a request yields to the event loop after each `slice_budget_s` of work, and starts no
    slice while `publishing()` (a throttle object is on its way out); `durability()` says
    why messages cannot be made durable now (None while they can)."""
    middlewares = [] if basic_auth is None else [_basic_auth(*basic_auth)]
    app = web.Application(middlewares=middlewares)
    views = _Views(
        registry, monitor, connection, wall_clock, slice_budget_s, publishing, durability
    )
    app.router.add_get("/metrics", views.metrics)
    app.router.add_get("/healthz", views.healthz)
    app.router.add_get("/readyz", views.readyz)
    app.router.add_get("/api/v1/streams", views.streams)
    app.router.add_get("/api/v1/capacity", views.capacity)
    return app


class _Views:
    __slots__ = (
        "_budget",
        "_connection",
        "_durability",
        "_monitor",
        "_publishing",
        "_registry",
        "_wall_clock",
    )

    def __init__(
        self,
        registry: CollectorRegistry,
        monitor: Monitor,
        connection: ConnectionState,
        wall_clock: Callable[[], float],
        budget: float,
        publishing: Callable[[], bool] | None,
        durability: Callable[[], str | None],
    ) -> None:
        self._budget = budget
        self._durability = durability
        self._publishing = publishing
        self._registry = registry
        self._monitor = monitor
        self._connection = connection
        self._wall_clock = wall_clock

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        accept = ",".join(request.headers.getall(hdrs.ACCEPT, []))
        slicer = self._slicer()
        parts, content_type = await render_parts(self._registry, accept, slicer)
        headers = {hdrs.CONTENT_TYPE: content_type}
        if request.method != hdrs.METH_GET or _compressed(request):  # HEAD: aiohttp drops it
            response = web.Response(body=b"".join(parts), headers=headers)
            response.enable_compression()
            return response
        # Written piece by piece with its length up front: the page is never copied whole.
        stream = web.StreamResponse(headers=headers)
        stream.content_length = sum(len(part) for part in parts)
        await slicer.now()  # the writes start clear of a transition
        await stream.prepare(request)
        for part in parts:
            await stream.write(part)
        await stream.write_eof()
        return stream

    def _slicer(self) -> Slicer:
        """A request's slicer: it also keeps slices clear of the engine's next transition."""
        monitor, wall_clock = self._monitor, self._wall_clock
        return Slicer(
            self._budget,
            until_deadline=lambda: monitor.until_deadline(wall_clock()),
            busy=self._publishing,
        )

    async def healthz(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(self, _request: web.Request) -> web.Response:
        connection = self._connection
        if not connection.connected:
            return web.Response(status=503, text="not ready: not connected to the MQTT broker\n")
        if not connection.subscribed:
            return web.Response(status=503, text="not ready: subscriptions not acknowledged\n")
        failure = self._durability()
        if failure is not None:
            return web.Response(
                status=503,
                text=f"not ready: {failure}; messages are not acknowledged until it can\n",
            )
        if connection.degraded is not None:
            return web.Response(text=f"ready, degraded: {connection.degraded}\n")
        return web.Response(text="ready\n")

    async def streams(self, request: web.Request) -> web.Response:
        query = request.query
        limit = _page_limit(query.get("limit"))
        engine = self._monitor.engine
        if "device" in query:
            ids = [query["device"]] if device_view(engine, query["device"]) is not None else []
        else:
            cursor = query.get("cursor")
            ids = sorted(view.id for view in device_views(engine))
            if cursor is not None:
                ids = ids[bisect.bisect_right(ids, cursor) :]
        page, rest = ids[:limit], ids[limit:]
        slicer = self._slicer()
        wall_ms = self._wall_clock()
        parts = []
        for device_id in page:
            view = device_view(engine, device_id)
            if view is not None:  # else forgotten meanwhile
                parts.append(_dumps(_device_view(view, view.now(self._wall_clock()))))
            await slicer()
        next_cursor = _dumps(page[-1] if rest and page else None)
        body = f'{{"wall_ms":{_dumps(wall_ms)},"devices":[{",".join(parts)}],'
        body += f'"next_cursor":{next_cursor}}}'
        return web.Response(text=body, content_type="application/json")

    async def capacity(self, request: web.Request) -> web.Response:
        engine = self._monitor.engine
        device = request.query.get("device")
        ids = sorted(view.id for view in device_views(engine)) if device is None else [device]
        slicer = self._slicer()
        wall_ms = self._wall_clock()
        parts = []
        for device_id in ids:
            view = device_view(engine, device_id)
            if view is not None:  # else unknown, or forgotten meanwhile
                parts.append(_dumps(capacity_entry(view, self._wall_clock())))
            await slicer()
        body = f'{{"wall_ms":{_dumps(wall_ms)},"devices":[{",".join(parts)}]}}'
        return web.Response(text=body, content_type="application/json")


_dumps = functools.partial(json.dumps, allow_nan=False, separators=(",", ":"))


def _page_limit(value: str | None) -> int:
    """`?limit=`: devices per page (400 if it is not a whole number in range)."""
    if value is None:
        return PAGE_DEVICES
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_PAGE_DEVICES:
        raise web.HTTPBadRequest(
            text=f"limit must be a whole number from 1 to {MAX_PAGE_DEVICES}\n"
        )
    return limit


# ---------------------------------------------------------------------- /api/v1/streams
def _finite(value: float) -> float | None:
    """JSON has no infinities: an instant or amount that is not known is null."""
    return value if math.isfinite(value) else None


def streams_view(monitor: Monitor, wall_ms: float) -> dict[str, Any]:
    """Every device and its streams, evaluated at each device's clock at wall time `wall_ms`.

    Times are milliseconds on the device's clock. Streams are listed live first, lowest
    headroom first, then waiting and draining ones by id. Values that a phase does not have
    (slack before the first chunk, ETA and headroom once the final chunk is in) are null.
    """
    devices = sorted(device_views(monitor.engine), key=lambda device: device.id)
    return {"wall_ms": wall_ms, "devices": [_device_view(d, d.now(wall_ms)) for d in devices]}


def _device_view(device: DeviceView, now: float) -> dict[str, Any]:
    streams = [_stream_view(state) for state in device.stream_states(now)]
    streams.sort(key=lambda s: (s["headroom_ms"] is None, s["headroom_ms"] or 0.0, s["stream"]))
    live = [s["headroom_ms"] for s in streams if s["headroom_ms"] is not None]
    return {
        "device": device.id,
        "t_ms": _finite(now),
        "throttle": device.throttle_on,
        "throttle_since_ms": device.throttle_since if device.throttle_on else None,
        "margin_ms": device.margin,
        "clock_offset_ms": device.clock_offset_ms,
        "last_message_wall_ms": device.last_message_wall_ms,
        "streams_at_risk": sum(1 for s in streams if s["at_risk"]),
        "min_headroom_ms": min(live, default=None),
        "streams": streams,
    }


def _stream_view(state: StreamState) -> dict[str, Any]:
    """A stream's JSON object: its state's fields, by name."""
    return state._asdict()


# ---------------------------------------------------------------------- basic auth
def _basic_auth(user: str, password: str) -> Middleware:
    """A middleware that lets through requests with these credentials (and `OPEN_PATHS`)."""
    expected_user = user.encode()
    expected_password = password.encode()
    challenge = {hdrs.WWW_AUTHENTICATE: 'Basic realm="edgemon", charset="UTF-8"'}

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS or _credentials_match(
            request.headers.get(hdrs.AUTHORIZATION, ""), expected_user, expected_password
        ):
            return await handler(request)
        raise web.HTTPUnauthorized(headers=challenge, text="unauthorized\n")

    return middleware


def _credentials_match(header: str, user: bytes, password: bytes) -> bool:
    """Whether an `Authorization` header carries `user:password`, compared in constant time."""
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
    except ValueError:  # binascii.Error, or non-ASCII text
        return False
    given_user, colon, given_password = decoded.partition(b":")
    user_ok = hmac.compare_digest(given_user, user)
    password_ok = hmac.compare_digest(given_password, password)
    return bool(colon) and user_ok and password_ok


#: What `Accept-Encoding` may name for aiohttp to compress a response.
_CODINGS = tuple(c.value for c in web.ContentCoding if c != web.ContentCoding.identity)


def _compressed(request: web.Request) -> bool:
    """Whether the response will be compressed (the client accepts an encoding aiohttp has)."""
    accepted = request.headers.get(hdrs.ACCEPT_ENCODING, "").lower()
    return any(coding in accepted for coding in _CODINGS)


def basic_auth_from_settings(settings: HttpSettings) -> tuple[str, str] | None:
    """`(user, password)` from `[http]`, reading the password file now; None without auth."""
    password = settings.resolve_basic_auth_password()
    if settings.basic_auth_user is None or password is None:
        return None
    return settings.basic_auth_user, password.get_secret_value()


# ---------------------------------------------------------------------- serving
def ssl_context_from_files(
    cert_file: str | PathLike[str], key_file: str | PathLike[str]
) -> ssl.SSLContext:
    """A server-side TLS context (TLS 1.2 or later) with this certificate chain and key."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile=cert_file, keyfile=key_file)
    return context


@asynccontextmanager
async def serve(
    app: web.Application,
    *,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None = None,
    shutdown_timeout: float = 5.0,
    guard: ConnectionGuard | None = None,
) -> AsyncIterator[int]:
    """Serve `app` on `host:port` and yield the port bound (port 0 picks a free one).

    Connections are bounded by `guard` (by default one sized by `limits_for`), which the app's
    first middleware tells when each request begins and ends. On exit, stops listening, gives
    requests in progress `shutdown_timeout` seconds, and closes every connection. No access
    log: scrapes every few seconds are not news.
    """
    if guard is None:
        guard = ConnectionGuard(limits_for()[0])
    app.middlewares.insert(0, guard_middleware(guard))
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    server: asyncio.Server | None = None
    try:
        handler = runner.server
        assert handler is not None
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: GuardedProtocol(handler, guard), host, port, ssl=ssl_context,
            reuse_address=True, backlog=BACKLOG,
        )  # fmt: skip
        bound: int = server.sockets[0].getsockname()[1]
        yield bound
    finally:
        if server is not None:
            server.close()
        await runner.cleanup()
        guard.close_all()
        if server is not None:
            await server.wait_closed()
