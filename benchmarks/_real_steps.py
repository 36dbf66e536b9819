"""The real engine's step shape, measured from outside: token gaps as a client sees them.

`decode_shape` streams n requests at once (short prompts, long outputs) for each n and
takes every stream's token inter-arrival once all n run: with one token per step per
stream, a gap is a step (a chunk that carries k tokens, the API server having fallen
behind, counts as k gaps sharing its interval). `prefill_stall` starts one request with a
long prompt while n streams decode and takes the longest gap it causes: one step that
carried the prompt's tokens besides the n decodes. `fit` turns them into the simulated
engine's `StepModel`: least squares `a + b·n` over the decode medians, and the prefill's
cost per token from the stall less the decode step at that n. `slowdown` compares the
decode step with and without a co-tenant on the engine's core.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp
from _real_model import MAX_MODEL_LEN, SPECIALS
from _real_server import MODEL_NAME

from edgemon.simulate.players import percentile
from edgemon.simulate.profiles import StepModel

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

SHORT_PROMPT = 16
LONG_OUTPUT = MAX_MODEL_LEN - SHORT_PROMPT
"""A measurement stream's `max_tokens` (vLLM refuses more than the model's length): all the
model's length leaves, so that the stream outlasts the measurement (4,080 steps of the 117m
model are minutes; the tiny model, whose steps take 1-2 ms, is given a longer length)."""
SETTLE_S = 1.5
"""Gaps before every stream has started are left out."""
LATE_TOKEN_MS = 2000.0
"""A stream whose last token is older than this when a measurement ends had stopped."""


@dataclass(frozen=True, slots=True)
class Shape:
    """Token gaps at one concurrency: median and p90 in ms, and how many gaps."""

    streams: int
    median_ms: float
    p90_ms: float
    gaps: int


def _prompt(rng: random.Random, tokens: int, vocab: int) -> list[int]:
    return [rng.randrange(len(SPECIALS), vocab) for _ in range(tokens)]


async def _stream(
    session: aiohttp.ClientSession,
    url: str,
    prompt: list[int],
    max_tokens: int,
    arrivals: list[float],
) -> None:
    body = {
        "model": MODEL_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "temperature": 0.0,
    }
    made = 0
    async with session.post(f"{url}/v1/completions", json=body) as answer:
        answer.raise_for_status()
        async for line in answer.content:  # each arrival kept at once: streams are cancelled
            if not line.startswith(b"data: ") or b'"choices":[{' not in line:
                continue
            # Several tokens in one chunk (the API server fell behind): the interval since
            # the last chunk is shared out evenly between them.
            total = int(json.loads(line[6:])["usage"]["completion_tokens"])
            now = time.monotonic() * 1000.0
            count, made = total - made, max(made, total)
            before = arrivals[-1] if arrivals else now
            arrivals.extend(before + (now - before) * (i + 1) / count for i in range(count))


@contextlib.asynccontextmanager
async def _decoding(
    url: str, n: int, rng: random.Random, vocab: int, output: int
) -> AsyncIterator[tuple[aiohttp.ClientSession, list[list[float]]]]:
    """`n` long streams decoding in the background, each logging its token arrivals; the
    session and the logs. The streams are cancelled on the way out."""
    logs: list[list[float]] = [[] for _ in range(n)]
    async with aiohttp.ClientSession() as session:
        tasks = [
            asyncio.create_task(
                _stream(session, url, _prompt(rng, SHORT_PROMPT, vocab), output, log)
            )
            for log in logs
        ]
        try:
            yield session, logs
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                    await task  # a refused stream's short log tells


class IncompleteError(RuntimeError):
    """A measurement some of whose streams did not run all along (refused, cut or failed)."""


async def measured_gaps(
    url: str, n: int, seconds: float, vocab: int, seed: int, *, output: int = LONG_OUTPUT
) -> list[float]:
    """n streams for `seconds`: every gap after all of them started. Raises `IncompleteError`
    unless every stream ran to the end (a stream that ended early leaves fewer streams in
    the steps measured, which would then be measured at the wrong concurrency)."""
    rng = random.Random(f"shape/{seed}/{n}")
    async with _decoding(url, n, rng, vocab, output) as (_session, logs):
        await asyncio.sleep(seconds + SETTLE_S)
        ended = time.monotonic() * 1000.0
    ran = sum(1 for log in logs if log and log[-1] >= ended - LATE_TOKEN_MS)
    if ran < n:
        raise IncompleteError(f"{n - ran} of {n} streams stopped before the measurement ended")
    started = max(log[0] for log in logs) + 500.0
    return [b - a for log in logs for a, b in itertools.pairwise(log) if a >= started]


def decode_shape(
    url: str,
    counts: list[int],
    *,
    seconds: float = 6.0,
    vocab: int,
    seed: int = 0,
    output: int = LONG_OUTPUT,
) -> list[Shape]:
    """The decode step at each concurrency of `counts` (streams of `output` tokens)."""
    out = []
    for n in counts:
        gaps = asyncio.run(measured_gaps(url, n, seconds, vocab, seed, output=output))
        if gaps:
            out.append(Shape(n, _q(gaps, 0.5), _q(gaps, 0.9), len(gaps)))
    return out


async def _stall(url: str, n: int, prompt_tokens: int, vocab: int, seed: int, output: int) -> float:
    rng = random.Random(f"stall/{seed}/{n}/{prompt_tokens}")
    async with _decoding(url, n, rng, vocab, output) as (session, logs):
        await asyncio.sleep(SETTLE_S + 1.0)
        asked = time.monotonic() * 1000.0
        await _stream(session, url, _prompt(rng, prompt_tokens, vocab), 1, [])
        await asyncio.sleep(0.5)
    gaps = [b - a for log in logs for a, b in itertools.pairwise(log) if b >= asked]
    return max(gaps, default=0.0)


def prefill_stall(
    url: str,
    n: int,
    prompt_tokens: int,
    *,
    vocab: int,
    seed: int = 0,
    repeat: int = 3,
    output: int = LONG_OUTPUT,
) -> float:
    """The median over `repeat` tries of the longest gap a `prompt_tokens` prefill causes to
    `n` decoding streams (of `output` tokens)."""
    stalls = [
        asyncio.run(_stall(url, n, prompt_tokens, vocab, seed + i, output)) for i in range(repeat)
    ]
    return _q(stalls, 0.5)


def fit(
    shapes: list[Shape], stall_ms: float, *, stall_streams: int, prompt_tokens: int
) -> StepModel:
    """`a + b·n` over the decode medians; prefill per token from the stall (see the module
    doc)."""
    xs = [float(s.streams) for s in shapes]
    ys = [s.median_ms for s in shapes]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    a = my - b * mx
    decode = a + b * stall_streams
    per_token = max(0.0, stall_ms - decode) / prompt_tokens
    return StepModel(
        base_ms=round(max(0.0, a), 2),
        per_prefill_token_ms=round(per_token, 3),
        per_decode_seq_ms=round(max(0.0, b), 3),
    )


def slowdown(
    url: str,
    n: int,
    contend: Callable[[], Callable[[], None]],
    *,
    seconds: float = 5.0,
    vocab: int,
    output: int = LONG_OUTPUT,
) -> tuple[float, float, float]:
    """(step without, step with the co-tenant on, their ratio): median gaps of `n` streams;
    `contend()` starts the co-tenant and returns what stops it. Raises `IncompleteError` when a
    stream did not run all along: a server whose policy refuses streams under the co-tenant
    measures its policy, not the co-tenant."""
    alone = _q(asyncio.run(measured_gaps(url, n, seconds, vocab, 1, output=output)), 0.5)
    stop = contend()
    try:
        shared = _q(asyncio.run(measured_gaps(url, n, seconds, vocab, 2, output=output)), 0.5)
    finally:
        stop()
    return alone, shared, shared / alone


def _q(values: list[float], q: float) -> float:
    value = percentile(values, q)
    return 0.0 if value is None else round(value, 1)


def shape_json(shapes: list[Shape]) -> str:
    """The shape as one JSON line."""
    return json.dumps({"decode_ms": {s.streams: [s.median_ms, s.p90_ms, s.gaps] for s in shapes}})
