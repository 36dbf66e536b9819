"""A simulated TTS engine behind an HTTP server, as one box of a fleet serves (docs/fleet.md).

`python tests/engine_box.py --port P --broker mqtt://127.0.0.1:N --device box-a --per-stream-ms 20`

The engine is edgemon's simulated one (`edgemon.simulate.engine.TtsEngine`), stepped in real
time as the demo does: each step sleeps its modelled duration, on the model's timeline. Its
real-time capacity is measured the way edgemon's schedulers measure it
(`edgemon.integrations.realtime.RealtimeAdmission`, fed each step's modelled duration; until
it has seen enough steps, the step model's own largest real-time batch), and its admission
holds the running set to it.

HTTP, shaped like an OpenAI completions server that streams:
- `POST /v1/completions` `{"prompt": str, "max_tokens": frames}`: the audio chunks as
  server-sent events (`data: {"box", "seq", "audio_ms", "final", "start_wait_ms"}`), then
  `data: [DONE]`; a request the box cannot start within its start SLO is refused at once,
  before any work, with **503 and `Retry-After`** (`admits_at_arrival`);
- `GET /health`: 200;
- `GET /stats`: what the box served, refused and how long each start took (JSON).

The engine publishes its capacity object (docs/protocol.md) retained on
`P/{device}/capacity`, at most once a second and on change, for the box's edgemon.
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

from edgemon.integrations.realtime import STEP_FRAMES, RealtimeAdmission
from edgemon.simulate.engine import TtsEngine
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
    """The largest batch whose decode step fits the allowed frame, by the step model."""
    allowed = FRAME_MS * STEP_FRAMES
    if step.per_decode_seq_ms <= 0:
        return 64
    return max(1, math.floor((allowed - step.base_ms) / step.per_decode_seq_ms))


def admits_at_arrival(*, running: int, waiting: int, realtime_streams: int) -> bool:
    """Whether a new request can start within the start SLO: a real-time seat is free for it
    behind those already waiting (it is admitted at the next step, its first chunk a few
    steps later, well within the SLO). Otherwise it would wait for a running stream to end,
    which takes longer than any start SLO (streams last tens of seconds): refuse it now."""
    return running + waiting < realtime_streams


@dataclass(slots=True)
class Served:
    """One admitted request: when it came, whether a seat was free, when its audio began."""

    arrival_ms: float
    seated: bool
    start_wait_ms: float | None = None
    chunks: asyncio.Queue[Chunk] = field(default_factory=asyncio.Queue)


class EngineBox:
    """The engine, its step loop, its admission and its capacity objects."""

    def __init__(self, name: str, step: StepModel) -> None:
        self.name = name
        self.admission = RealtimeAdmission(FRAME_MS * STEP_FRAMES)
        self.prior_limit = modelled_limit(step)
        self.engine = TtsEngine(
            profile(step.per_decode_seq_ms),
            seats=lambda running: max(0, self.realtime_streams - running),
        )
        self.requests: dict[str, Served] = {}
        self.ids = itertools.count()
        self.refused = 0
        self.step_estimate_ms = step.step_ms(0, 1)
        self.wake = asyncio.Event()
        self.changed = asyncio.Event()

    @property
    def realtime_streams(self) -> int:
        """Measured real-time streams; the model's until measured."""
        return self.admission.limit or self.prior_limit

    def capacity(self) -> dict[str, Any]:
        """The capacity object now (docs/protocol.md)."""
        engine = self.engine
        return {
            "t_ms": time.time() * 1000.0,
            "realtime_streams": self.realtime_streams,
            "running": engine.running,
            "waiting": engine.waiting,
            "start_wait_ms": self.predicted_start_ms(),
            "shed_total": self.refused,
        }

    def predicted_start_ms(self) -> float | None:
        """A new request's wait for its first audio if admitted now: the first chunk's frames
        when a seat is free; None (not predicted) when none is: it would be refused."""
        engine = self.engine
        if not admits_at_arrival(
            running=engine.running, waiting=engine.waiting, realtime_streams=self.realtime_streams
        ):
            return None
        return (self.engine.profile.initial_chunk_frames + 1) * self.step_estimate_ms

    def submit(self, frames: int) -> Served | None:
        """A new request: admitted (its record) or refused (None)."""
        engine = self.engine
        if not admits_at_arrival(
            running=engine.running, waiting=engine.waiting, realtime_streams=self.realtime_streams
        ):
            self.refused += 1
            self.changed.set()
            return None
        request_id = f"{self.name}-{next(self.ids)}"
        now = time.time() * 1000.0
        served = self.requests[request_id] = Served(now, seated=True)
        engine.submit(Request(request_id, now, PROMPT_TOKENS, frames))
        self.wake.set()
        self.changed.set()
        return served

    async def run(self) -> None:
        """Step the engine in real time, forever."""
        modelled: float | None = None
        while True:
            now = time.time() * 1000.0
            if modelled is not None and now - modelled < CATCH_UP_MS:
                now = modelled
            step = self.engine.step(now)
            if step is None:
                modelled = None
                self.wake.clear()
                await self.wake.wait()
                continue
            self.admission.observe(step.decode_seqs, step.prefill_tokens, step.ms)
            self.step_estimate_ms = self.engine.step_estimate_ms
            await asyncio.sleep(max(0.0, step.end_ms - time.time() * 1000.0) / 1000.0)
            modelled = step.end_ms
            for chunk in step.chunks:
                served = self.requests[chunk.request]
                if served.start_wait_ms is None:
                    served.start_wait_ms = chunk.t_ms - served.arrival_ms
                served.chunks.put_nowait(chunk)
                if chunk.final:
                    del self.requests[chunk.request]
            if step.admitted or step.finished:
                self.changed.set()

    async def publish(self, broker: str, topic: str) -> None:
        """The capacity object, retained, at most once a second and on change, forever."""
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
                await self.changed.wait()


@dataclass(slots=True)
class Tally:
    """What `/stats` reports."""

    served: int = 0
    completed: int = 0
    refused: int = 0
    seated: int = 0
    late: int = 0
    start_waits_ms: list[float] = field(default_factory=list)


def app(box: EngineBox) -> web.Application:
    """The box's HTTP server."""
    tally = Tally()

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        served = box.submit(int(body.get("max_tokens", 25)))
        if served is None:
            tally.refused += 1
            return web.json_response(
                {"error": {"message": "cannot start within the start SLO", "type": "shed"}},
                status=503,
                headers={"Retry-After": str(RETRY_AFTER_S), "X-Box": box.name},
            )
        tally.served += 1
        tally.seated += served.seated
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "X-Box": box.name}
        )
        await response.prepare(request)
        while True:
            chunk = await served.chunks.get()
            if chunk.seq == 0:
                wait = served.start_wait_ms or 0.0
                tally.start_waits_ms.append(wait)
                tally.late += wait > START_SLO_MS
            event = {
                "box": box.name,
                "seq": chunk.seq,
                "audio_ms": chunk.audio_ms,
                "final": chunk.final,
                "start_wait_ms": served.start_wait_ms,
            }
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
            if chunk.final:
                break
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
                "seated": tally.seated,
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
