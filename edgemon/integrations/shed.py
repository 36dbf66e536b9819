"""Shedding at arrival: an ASGI middleware that answers **503 with ``Retry-After``** when the
box cannot start a new request within its start SLO (docs/client.md).

Turn it on with vLLM's public option (vLLM adds a class with ``app.add_middleware``)::

    vllm serve MODEL --scheduler-cls edgemon.integrations.vllm_realtime.EdgemonRealtimeScheduler \\
        --middleware edgemon.integrations.shed.EdgemonShedMiddleware

with ``EDGEMON_GATE_DEVICE`` / ``EDGEMON_GATE_BROKER`` (and friends) in the environment, the
same as the scheduler's, and optionally ``EDGEMON_SLO_START_MS`` (default 3000).

The API server is not the process where the scheduler runs, so the middleware learns the
box's state from the scheduler's retained capacity object (``P/{device}/capacity``, followed
on a paho thread; `CapacityView`). A ``POST`` to a generation endpoint (`GENERATION_PATHS`:
``/v1/completions``, ``/v1/chat/completions``, vLLM-Omni's ``/v1/audio/speech``) is refused
before its body is read when the object's ``start_wait_ms`` exceeds the start SLO:

- status 503, ``Retry-After`` in whole seconds (the predicted wait beyond the SLO, at least
  1), and vLLM's own error shape: ``{"error": {"message": ..., "type":
  "ServiceUnavailableError", "param": null, "code": 503}}`` with a message that names the
  predicted wait and the SLO;
- everything else passes untouched: other paths and methods, websockets, lifespan.

Fail-open: no device configured, no capacity object yet (or an emptied one), or the broker
unreachable: nothing is refused. Every refusal is counted (`CapacityView.refused_total`) and
published, retained, on ``P/{first device}/capacity/shed/{client id}``; the engine's
publisher adds it to the capacity object's ``shed_total``.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgemon.client import _mqtt
from edgemon.integrations._retained import RetainedLink
from edgemon.integrations.capacity_topic import CapacityReading, TopicConfig, read_capacity
from edgemon.integrations.deadlines import START_SLO_MS

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping, MutableMapping

    Scope = MutableMapping[str, Any]
    Message = MutableMapping[str, Any]
    Receive = Callable[[], Awaitable[Message]]
    Send = Callable[[Message], Awaitable[None]]
    App = Callable[[Scope, Receive, Send], Awaitable[None]]

__all__ = [
    "DEFAULT_START_SLO_MS",
    "ENV_START_SLO_MS",
    "GENERATION_PATHS",
    "CapacityView",
    "EdgemonShedMiddleware",
    "Refusal",
    "start_slo_from_environ",
]

ENV_START_SLO_MS = "EDGEMON_SLO_START_MS"
DEFAULT_START_SLO_MS = START_SLO_MS
#: The endpoints that start generation work (vLLM's OpenAI server, vLLM-Omni's speech).
GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/audio/speech"})


def start_slo_from_environ(environ: Mapping[str, str]) -> float:
    """``EDGEMON_SLO_START_MS`` (default 3000): a number of milliseconds > 0, else ValueError
    naming the variable."""
    text = environ.get(ENV_START_SLO_MS, "").strip()
    if not text:
        return DEFAULT_START_SLO_MS
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{ENV_START_SLO_MS}: {text!r} is not a number of milliseconds > 0")
    return value


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is refused: the predicted wait, the SLO, and when to come back."""

    start_wait_ms: float
    slo_ms: float

    @property
    def retry_after_s(self) -> int:
        """Whole seconds until the predicted wait is back within the SLO (at least 1)."""
        return max(1, math.ceil((self.start_wait_ms - self.slo_ms) / 1000.0))

    def body(self) -> bytes:
        """vLLM's error shape (OpenAI's), with the reason."""
        message = (
            f"edgemon: this server cannot start a new request within its start SLO "
            f"(predicted wait {self.start_wait_ms / 1000:.1f} s > {self.slo_ms / 1000:.1f} s); "
            f"retry in {self.retry_after_s} s or on another server"
        )
        error = {"message": message, "type": "ServiceUnavailableError", "param": None, "code": 503}
        return json.dumps({"error": error}).encode()


class CapacityView:
    """The box's latest capacity object as the API server sees it, and the refusals counted."""

    __slots__ = ("_link", "_refused", "config", "latest")

    def __init__(self, config: TopicConfig, *, client_id: str | None = None) -> None:
        self.config = config
        #: The latest capacity object received (None: none, or an emptied one).
        self.latest: CapacityReading | None = None
        self._refused = 0
        name = "_".join(config.devices)[:64]
        server = client_id or _mqtt.default_client_id("shed", name)
        self._link = RetainedLink(
            config.broker,
            who=f"edgemon shedding {','.join(config.devices)}",
            client_id=server,
            topics=(config.shed_topic(server),),
            watch=config.capacity_topics(),
            on_message=self._on_capacity,
            min_interval_s=0.2,
        )

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> CapacityView | None:
        """An opened view as the gate's variables say, or None (see `TopicConfig`)."""
        config = TopicConfig.from_environ(environ)
        return None if config is None else cls(config).open()

    def open(self) -> CapacityView:
        """Connect in the background (never waits for the broker)."""
        self._link.open()
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Disconnect; the published refusal count is emptied (the engine keeps it)."""
        self._link.close(timeout)

    @property
    def link(self) -> RetainedLink:
        """The connection."""
        return self._link

    @property
    def refused_total(self) -> int:
        """Requests refused so far."""
        return self._refused

    def judge(self, slo_ms: float) -> Refusal | None:
        """A refusal if the box cannot start a new request within `slo_ms` now; None
        (admit) when it can, or when nothing is known (fail-open)."""
        latest = self.latest
        if latest is None or not self._link.connected:
            return None
        wait = latest.start_wait_ms
        if wait is None or wait <= slo_ms:
            return None
        return Refusal(wait, slo_ms)

    def refused(self) -> None:
        """Count a refusal and publish the count."""
        self._refused += 1
        self._link.set({"shed_total": self._refused, "t_ms": round(time.time() * 1000)})

    def _on_capacity(self, _topic: str, payload: bytes) -> None:
        self.latest = read_capacity(payload) if payload else None


class EdgemonShedMiddleware:
    """A pure ASGI middleware refusing generation requests the box cannot start in time."""

    __slots__ = ("app", "slo_ms", "view")

    def __init__(
        self,
        app: App,
        *,
        view: CapacityView | None = None,
        slo_ms: float | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        """vLLM calls ``EdgemonShedMiddleware(app)``: the view and the SLO come from the
        environment (a bad value raises ValueError naming the variable: the server does not
        start). ``view`` and ``slo_ms`` hand in the caller's own."""
        env = os.environ if environ is None else environ
        self.app = app
        self.slo_ms = start_slo_from_environ(env) if slo_ms is None else slo_ms
        self.view = CapacityView.from_environ(env) if view is None else view

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse (503) or pass the request on."""
        view = self.view
        if view is None or scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        try:
            path = scope["path"].removeprefix(scope.get("root_path", ""))
            refusal = view.judge(self.slo_ms) if path in GENERATION_PATHS else None
        except Exception:  # noqa: BLE001 - shedding must never break serving: admit
            view.link.failed("judging a request")
            refusal = None
        if refusal is None:
            await self.app(scope, receive, send)
            return
        view.refused()
        body = refusal.body()
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"retry-after", str(refusal.retry_after_s).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
