"""A simulated TTS engine behind an HTTP server, as one box of a fleet serves (docs/fleet.md).

`python tests/engine_box.py --port P --broker mqtt://127.0.0.1:N --device box-a --per-stream-ms 20`

The engine is edgemon's simulated one (`edgemon.simulate.engine.TtsEngine`), stepped in real
time as the demo does: each step sleeps its modelled duration, on the model's timeline. It
runs edgemon's scheduler rules: real-time admission measured as edgemon's schedulers measure
it (`edgemon.policy.realtime.RealtimeAdmission`, fed each step's modelled duration;
until its steps have shown the real-time batch, the step model's own largest one bounds the
running set) and the deadline policy (`edgemon.policy.deadlines.Deadlines`): a request
is admitted, queued or refused at arrival by its predicted start against the start SLO, and
a queued one whose start deadline became infeasible is refused too.

HTTP, shaped like an OpenAI completions server that streams:
- `POST /v1/completions` `{"prompt": str, "max_tokens": frames}`: the audio chunks as
  server-sent events (`data: {"box", "seq", "audio_ms", "final", "start_wait_ms"}`), then
  `data: [DONE]`; a request the deadline policy refuses, at arrival or while it waits for
  its first audio, is answered **503 with `Retry-After`**, before any audio;
- `GET /health`: 200;
- `GET /stats`: what the box served, refused and how long each start took (JSON).

The engine publishes its capacity object (docs/protocol.md) retained on
`P/{device}/capacity`, at most once a second and on change, and again every 5 s, for the
box's edgemon.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiomqtt
from aiohttp import web

from edgemon.policy.deadlines import (
    Deadlines,
    DeadlineSettings,
    Running,
    Waiting,
)
from edgemon.policy.realtime import RealtimeAdmission
from edgemon.protocol import CAPACITY_REFRESH_S
from edgemon.simulate.engine import DeadlineHook, TtsEngine
from edgemon.simulate.profiles import FRAME_MS, Profile, StepModel
from edgemon.simulate.workload import Request

if TYPE_CHECKING:
    from collections.abc import Sequence

    from edgemon.simulate.engine import Chunk

#: Prompt tokens of every request (a short sentence and no reference audio).
PROMPT_TOKENS = 64
#: The start SLO: request → first audio chunk (`[slo] start_ms`'s default).
START_SLO_MS = 3000.0
#: What a refusal tells the client to wait before asking again.
RETRY_AFTER_S = 1
#: Capacity objects at most this often (docs/protocol.md).
PUBLISH_EVERY_S = 1.0
#: How often an engine whose waiting requests are all held asks again.
IDLE_POLL_S = 0.005
#: A step that begins at most this late after its predecessor's modelled end begins at that
#: end (as `edgemon.simulate.realtime`): the driver's own delays are not step time.
CATCH_UP_MS = 50.0


def profile(per_stream_ms: float) -> Profile:
    """A box whose every decoding stream adds `per_stream_ms` to a step (30 ms base)."""
    return Profile(
        name="fleet-box",
        title="a box of the HAProxy fleet test",
        source="made up: only the ratio of a step to a frame matters here",
        step=StepModel(base_ms=30.0, per_prefill_token_ms=0.2, per_decode_seq_ms=per_stream_ms),
        margin_ms=80.0,
        hardware_class="x86",
        max_num_seqs=64,
    )


def modelled_limit(step: StepModel) -> int:
    """The largest batch whose decode step fits the allowed frame, by the step model: the
    engine's bound on running requests until its steps have shown their real-time batch."""
    allowed = FRAME_MS
    if step.per_decode_seq_ms <= 0:
        return 64
    return max(1, math.floor((allowed - step.base_ms) / step.per_decode_seq_ms))


@dataclass(slots=True)
class Served:
    """One request the engine took: its frames, what it has made, when its audio began.

    `chunks` carries its audio, or None once the deadline policy refused it while queued."""

    arrival_ms: float
    frames: int
    admitted: bool = False
    emitted: int = 0
    start_wait_ms: float | None = None
    chunks: asyncio.Queue[Chunk | None] = field(default_factory=asyncio.Queue)


class EngineBox:
    """The engine, its step loop, its deadline policy and its capacity objects."""

    def __init__(self, name: str, step: StepModel) -> None:
        self.name = name
        box = profile(step.per_decode_seq_ms)
        self.admission = RealtimeAdmission(FRAME_MS)
        settings = DeadlineSettings(
            start_slo_ms=START_SLO_MS,
            first_chunk_frames=box.chunk_size(0),
            token_budget=box.max_num_batched_tokens,
            frame_ms=box.frame_ms,
        )
        self.policy = Deadlines(settings, self.admission, max_num_seqs=modelled_limit(step))
        self.engine = TtsEngine(
            box, seats=self.admission.admissible, deadlines=DeadlineHook(self.policy)
        )
        self.requests: dict[str, Served] = {}
        self.ids = itertools.count()
        self.wake = asyncio.Event()
        self.changed = asyncio.Event()

    def capacity(self) -> dict[str, Any]:
        """The capacity object now (docs/protocol.md), from the deadline policy; its real-time
        batch is the engine's bound while its steps have not shown one (a box that always runs
        the same batch never does)."""
        running = [
            Running(rid, served.frames - served.emitted)
            for rid, served in self.requests.items()
            if served.admitted
        ]
        waiting = [
            Waiting(rid, served.arrival_ms, PROMPT_TOKENS)
            for rid, served in self.requests.items()
            if not served.admitted
        ]
        figures = self.policy.capacity(running, waiting).as_dict()
        if figures["realtime_streams"] is None:
            figures["realtime_streams"] = self.policy.limit
        return {"t_ms": time.time() * 1000.0, **figures}

    def submit(self, frames: int) -> Served | None:
        """A new request: taken (its record) or refused at once by the deadline policy (None)."""
        request_id = f"{self.name}-{next(self.ids)}"
        now = time.time() * 1000.0
        if not self.engine.submit(Request(request_id, now, PROMPT_TOKENS, frames), now):
            self.changed.set()
            return None
        served = self.requests[request_id] = Served(now, frames)
        self.wake.set()
        self.changed.set()
        return served

    def _refused_while_queued(self) -> None:
        for request_id in self.engine.refused():
            self.requests.pop(request_id).chunks.put_nowait(None)
            self.changed.set()

    async def run(self) -> None:
        """Step the engine in real time, forever."""
        modelled: float | None = None
        while True:
            now = time.time() * 1000.0
            if modelled is not None and now - modelled < CATCH_UP_MS:
                now = modelled
            step = self.engine.step(now)
            self._refused_while_queued()
            if step is None:
                modelled = None
                self.wake.clear()
                if self.engine.waiting:
                    await asyncio.sleep(IDLE_POLL_S)
                else:
                    await self.wake.wait()
                continue
            self.admission.observe(step.decode_seqs, step.prefill_tokens, step.ms)
            for request_id in step.admitted:
                self.requests[request_id].admitted = True
            await asyncio.sleep(max(0.0, step.end_ms - time.time() * 1000.0) / 1000.0)
            modelled = step.end_ms
            for chunk in step.chunks:
                served = self.requests[chunk.request]
                served.emitted += chunk.frames
                if served.start_wait_ms is None:
                    served.start_wait_ms = chunk.t_ms - served.arrival_ms
                served.chunks.put_nowait(chunk)
                if chunk.final:
                    del self.requests[chunk.request]
            if step.admitted or step.finished:
                self.changed.set()

    async def publish(self, broker: str, topic: str) -> None:
        """The capacity object, retained, at most once a second and on change, and again every
        `CAPACITY_REFRESH_S` (readers ignore an older one), forever."""
        host, _, port = broker.removeprefix("mqtt://").partition(":")
        last: dict[str, Any] | None = None
        async with aiomqtt.Client(host, int(port)) as client:
            while True:
                self.changed.clear()
                now = self.capacity()
                if last is None or {**now, "t_ms": 0} != {**last, "t_ms": 0}:
                    await client.publish(topic, json.dumps(now), qos=1, retain=True)
                    last = now
                await asyncio.sleep(PUBLISH_EVERY_S)
                try:
                    async with asyncio.timeout(CAPACITY_REFRESH_S - PUBLISH_EVERY_S):
                        await self.changed.wait()
                except TimeoutError:
                    last = None  # unchanged: published again, stamped now


@dataclass(slots=True)
class Tally:
    """What `/stats` reports."""

    served: int = 0
    completed: int = 0
    refused: int = 0
    late: int = 0
    start_waits_ms: list[float] = field(default_factory=list)


def app(box: EngineBox) -> web.Application:
    """The box's HTTP server."""
    tally = Tally()

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        served = box.submit(int(body.get("max_tokens", 25)))
        first = None if served is None else await served.chunks.get()
        if served is None or first is None:
            tally.refused += 1
            return web.json_response(
                {"error": {"message": "cannot start within the start SLO", "type": "shed"}},
                status=503,
                headers={"Retry-After": str(RETRY_AFTER_S), "X-Box": box.name},
            )
        tally.served += 1
        wait = served.start_wait_ms or 0.0
        tally.start_waits_ms.append(wait)
        tally.late += wait > START_SLO_MS
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "X-Box": box.name}
        )
        await response.prepare(request)
        chunk: Chunk | None = first
        while chunk is not None:
            event = {
                "box": box.name,
                "seq": chunk.seq,
                "audio_ms": chunk.audio_ms,
                "final": chunk.final,
                "start_wait_ms": served.start_wait_ms,
            }
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
            chunk = None if chunk.final else await served.chunks.get()
        await response.write(b"data: [DONE]\n\n")
        tally.completed += 1
        return response

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def stats(_request: web.Request) -> web.Response:
        return web.json_response(
            {
                "box": box.name,
                "served": tally.served,
                "completed": tally.completed,
                "refused": tally.refused,
                "late": tally.late,
                "start_waits_ms": tally.start_waits_ms,
                "capacity": box.capacity(),
            }
        )

    application = web.Application()
    application.router.add_post("/v1/completions", completions)
    application.router.add_get("/health", health)
    application.router.add_get("/stats", stats)
    return application


async def serve(args: argparse.Namespace) -> None:
    """Run the box until cancelled."""
    box = EngineBox(args.device, profile(args.per_stream_ms).step)
    runner = web.AppRunner(app(box), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", args.port).start()
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(box.run(), name="engine")
            group.create_task(
                box.publish(args.broker, f"edgemon/v1/{args.device}/capacity"), name="capacity"
            )
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--broker", required=True, help="mqtt://host:port")
    parser.add_argument("--device", required=True)
    parser.add_argument("--per-stream-ms", type=float, required=True)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
