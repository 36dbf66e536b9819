"""A streaming `/v1/completions` endpoint that answers as vLLM's OpenAI server does, for the
real engine's clients (its players and step measurements) where the real server cannot be
made to answer so on demand: refusals of each kind vLLM has, and a stream that goes on
until its client leaves. The real server's own answers are checked in the vLLM tier."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from aiohttp import web

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

Refusal = Literal["done", "http-503", "event-503", "event-500"]
"""How a request is refused: a stream that ends before its first token (`data: [DONE]`, as
edgemon's scheduler ends one); HTTP 503 (vLLM's admission limits, edgemon's middleware);
an SSE error event with code 503 after the 200 (vLLM's second admission check on a
streaming request), or with another code (a server error)."""


def event(payload: object) -> bytes:
    """One SSE `data:` line."""
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


@dataclass(slots=True)
class Streamer:
    """Streams one token per `step_s` until the client leaves (or `limit` tokens, then
    `[DONE]`); the first requests are refused as `refusals` says, in order. Counts the
    streams whose client left (`left`) and the tokens sent to each (`sent`, in request
    order), and keeps every request's body (`bodies`)."""

    refusals: list[Refusal] = field(default_factory=list)
    step_s: float = 0.02
    limit: int = 10_000
    left: int = 0
    sent: list[int] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """The stream, or a refusal."""
        body = await request.json()
        self.bodies.append(body)
        refusal = self.refusals.pop(0) if self.refusals else None
        if refusal == "http-503":
            error = {"message": "busy", "type": "Service Unavailable", "param": None, "code": 503}
            return web.json_response({"error": error}, status=503)
        answer = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await answer.prepare(request)
        if refusal is not None:
            if refusal != "done":
                code = int(refusal.rsplit("-", 1)[1])
                await answer.write(event({"error": {"message": "no", "code": code}}))
            await answer.write(b"data: [DONE]\n\n")
            return answer
        index = len(self.sent)
        self.sent.append(0)
        cap = min(self.limit, int(body.get("max_tokens", 16)))
        try:
            for made in range(1, cap + 1):
                choice = {"text": "x", "finish_reason": "length" if made == cap else None}
                await answer.write(
                    event({"choices": [choice], "usage": {"completion_tokens": made}})
                )
                self.sent[index] = made
                await asyncio.sleep(self.step_s)
            await answer.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            self.left += 1
            raise
        return answer


@contextlib.asynccontextmanager
async def serving(streamer: Streamer) -> AsyncIterator[str]:
    """`streamer` on a free port of 127.0.0.1; its base URL."""
    app = web.Application()
    app.router.add_post("/v1/completions", streamer.completions)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
