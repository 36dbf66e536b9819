"""Shedding at arrival: an ASGI middleware that answers **503 with ``Retry-After``** when the
box cannot start a new request within its start SLO (docs/client.md).

Turn it on with vLLM's public option (vLLM adds a class with ``app.add_middleware``),
``--middleware edgemon.integrations.shed.EdgemonShedMiddleware``, as in the engine command line
the documentation shows (docs/how-to/vllm.md), with ``EDGEMON_GATE_DEVICE`` /
``EDGEMON_GATE_BROKER`` (and friends) in the environment, the same as the scheduler's, and
optionally ``EDGEMON_SLO_START_MS`` (default 3000).

The API server is not the process where the scheduler runs, so the middleware learns the
box's state from the scheduler's retained capacity object (``P/{device}/capacity``, followed
on a paho thread; `CapacityView`). A ``POST`` to a generation endpoint (`GENERATION_PATHS`:
``/v1/completions``, ``/v1/chat/completions``, vLLM-Omni's ``/v1/audio/speech``) is refused
before its body is read when the object's ``start_wait_ms`` exceeds the start SLO:

- status 503, ``Retry-After`` in whole seconds (the predicted wait beyond the SLO, at least
  1 and at most `RETRY_AFTER_MAX_SLOS` start SLOs), and vLLM's own error shape:
  ``{"error": {"message": ..., "type": "ServiceUnavailableError", "param": null, "code":
  503}}`` with a message that names the predicted wait and the SLO;
- everything else passes untouched: other paths and methods, websockets, lifespan.

The object's power is bounded (docs/protocol.md). The view keeps each device's object apart
and decides by the device that can start a request soonest: a request is refused only when
every device followed has a fresh object predicting a wait beyond the SLO (one device's
object never speaks for another). An object older than `CAPACITY_MAX_AGE_MS` (by its
``t_ms`` or by when it arrived) is ignored; an unreadable one voids that device's object; an
emptied topic removes it. A view that has heard no fresh object for that long after it
connected says so once (a warning: the engine is not running, or the broker's ACL withholds
its objects from this login), since refusing then is off.

Fail-open: no device configured, no fresh capacity object, or the broker unreachable: nothing
is refused. Every refusal is counted (`CapacityView.refused_total`) and published, retained,
on ``P/{first device}/capacity/shed/{client id}``; the engine's publisher adds it to the
capacity object's ``shed_total``.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgemon.capacity_object import Capacity, read_capacity
from edgemon.client import mqtt as _mqtt
from edgemon.environ import read_engine_environ
from edgemon.protocol import (
    CAPACITY_MAX_AGE_MS,
    MAX_START_WAIT_MS,
    RETRY_AFTER_MAX_SLOS,
    capacity_age_ms,
)
from edgemon.shedding._retained import RetainedLink
from edgemon.shedding.topic import TopicConfig

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping, MutableMapping

    Scope = MutableMapping[str, Any]
    Message = MutableMapping[str, Any]
    Receive = Callable[[], Awaitable[Message]]
    Send = Callable[[Message], Awaitable[None]]
    App = Callable[[Scope, Receive, Send], Awaitable[None]]

__all__ = ["GENERATION_PATHS", "CapacityView", "EdgemonShedMiddleware", "Refusal"]

#: The endpoints that start generation work (vLLM's OpenAI server, vLLM-Omni's speech).
GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/audio/speech"})


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is refused: the predicted wait, the SLO, and when to come back."""

    start_wait_ms: float
    slo_ms: float

    @property
    def retry_after_s(self) -> int:
        """Whole seconds until the predicted wait is back within the SLO: at least 1, at most
        `RETRY_AFTER_MAX_SLOS` start SLOs."""
        beyond = math.ceil((min(self.start_wait_ms, MAX_START_WAIT_MS) - self.slo_ms) / 1000.0)
        return max(1, min(math.ceil(RETRY_AFTER_MAX_SLOS * self.slo_ms / 1000.0), beyond))

    def body(self) -> bytes:
        """vLLM's error shape (OpenAI's), with the reason."""
        message = (
            f"edgemon: this server cannot start a new request within its start SLO "
            f"(predicted wait {min(self.start_wait_ms, MAX_START_WAIT_MS) / 1000:.1f} s > "
            f"{self.slo_ms / 1000:.1f} s); "
            f"retry in {self.retry_after_s} s or on another server"
        )
        error = {"message": message, "type": "ServiceUnavailableError", "param": None, "code": 503}
        return json.dumps({"error": error}).encode()


class CapacityView:
    """The box's capacity objects as the API server sees them (one per device followed), and
    the refusals counted (see the module doc)."""

    __slots__ = (
        "_devices",
        "_heard_ms",
        "_link",
        "_prefix",
        "_refused",
        "_said_silent",
        "_wall",
        "config",
        "received",
        "unreadable",
    )

    def __init__(
        self,
        config: TopicConfig,
        *,
        client_id: str | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """`wall`: the wall clock in seconds (the objects' `t_ms` are on the engine's)."""
        self.config = config
        self._wall = wall
        self._prefix = f"{config.prefix}/"
        #: Each device's last readable object and when it arrived (wall ms).
        self._devices: dict[str, tuple[Capacity, float]] = {}
        self._refused = 0
        #: When an object last arrived, or the view opened (wall ms).
        self._heard_ms = wall() * 1000.0
        self._said_silent = False
        #: Objects read, and objects that could not be read (each voided its device's last one).
        self.received = 0
        self.unreadable = 0
        name = "_".join(config.devices)[:64]
        server = client_id or _mqtt.default_client_id("shed", name)
        self._link = RetainedLink(
            config.broker,
            who=f"edgemon shedding {','.join(config.devices)}",
            client_id=server,
            topics=(config.shed_topic(server),),
            watch=config.capacity_topics(),
            on_message=self.receive,
            min_interval_s=0.2,
            stamp=lambda: wall() * 1000.0,
        )

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> CapacityView | None:
        """An opened view as the gate's variables say, or None (see `TopicConfig`)."""
        config = TopicConfig.from_environ(environ)
        return None if config is None else cls(config).open()

    def open(self) -> CapacityView:
        """Connect in the background (never waits for the broker)."""
        self._heard_ms = self._wall() * 1000.0
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

    def readings(self) -> dict[str, Capacity]:
        """Each device's object that is fresh now (no older than `CAPACITY_MAX_AGE_MS`)."""
        now_ms = self._wall() * 1000.0
        fresh = {}
        for device in self.config.devices:
            entry = self._devices.get(device)
            if entry is not None:
                reading, received_ms = entry
                if capacity_age_ms(now_ms, received_ms, reading.t_ms) <= CAPACITY_MAX_AGE_MS:
                    fresh[device] = reading
        return fresh

    @property
    def latest(self) -> Capacity | None:
        """The fresh object decisions follow now: the one predicting the shortest wait
        (None: no fresh object)."""
        fresh = list(self.readings().values())
        if not fresh:
            return None
        return min(fresh, key=lambda r: -1.0 if r.start_wait_ms is None else r.start_wait_ms)

    def judge(self, slo_ms: float) -> Refusal | None:
        """A refusal if no device followed can start a new request within `slo_ms` now; None
        (admit) when one can, or when nothing fresh is known (fail-open)."""
        if not self._link.connected:
            return None
        latest = self.latest
        if latest is None:
            self._silent()
            return None
        wait = latest.start_wait_ms
        if wait is None or wait <= slo_ms:
            return None
        return Refusal(wait, slo_ms)

    def refused(self) -> None:
        """Count a refusal and publish the count."""
        self._refused += 1
        self._link.set({"shed_total": self._refused})

    def receive(self, topic: str, payload: bytes) -> None:
        """A message on a capacity topic followed (what the link calls): the device's object,
        voided when unreadable, removed when empty."""
        device = topic.removeprefix(self._prefix).removesuffix("/capacity")
        if device not in self.config.devices:
            return
        reading = read_capacity(payload) if payload else None
        if not isinstance(reading, Capacity):
            self._devices.pop(device, None)
            if payload:
                self.unreadable += 1
            return
        now_ms = self._wall() * 1000.0
        self._devices[device] = (reading, now_ms)
        self.received += 1
        self._heard_ms = now_ms
        self._said_silent = False

    def _silent(self) -> None:
        """No fresh object: said once per silence that outlasts `CAPACITY_MAX_AGE_MS`."""
        if self._said_silent:
            return
        silent_ms = self._wall() * 1000.0 - self._heard_ms
        if silent_ms > CAPACITY_MAX_AGE_MS:
            self._said_silent = True
            _mqtt.log.warning(
                "%s: no fresh capacity object for %.0f s, so nothing is refused: is the "
                "engine's scheduler running with EDGEMON_GATE_DEVICE, and does the broker's "
                "ACL let this login read %s?",
                self._link.who,
                silent_ms / 1000.0,
                ", ".join(self.config.capacity_topics()),
            )


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
        environment (``EDGEMON_GATE_*``, ``EDGEMON_SLO_START_MS``; bad values raise
        `edgemon.environ.EnvironError` naming each variable: the server does not
        start). ``view`` and ``slo_ms`` hand in the caller's own."""
        self.app = app
        self.view: CapacityView | None = view
        if view is not None and slo_ms is not None:
            self.slo_ms = slo_ms
            return
        engine = read_engine_environ(os.environ if environ is None else environ)
        self.slo_ms = engine.slo_start_ms if slo_ms is None else slo_ms
        if view is None:
            config = TopicConfig.from_gate(engine.gate)
            view = None if config is None else CapacityView(config).open()
        self.view = view

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
