"""How long a refusal takes: vLLM's own OpenAI app with edgemon's shedding middleware (added
through vLLM's `--middleware` option), served by uvicorn on a free port, a real Mosquitto
holding a capacity object whose start wait exceeds the SLO; clients POST completions at a
Poisson rate and time each 503 from the request's send to the full response.

    EDGEMON_... are set here; run in .venv-vllm (needs vLLM, uvicorn, aiohttp):
    PYTHONPATH=. .venv-vllm/bin/python benchmarks/shed_latency.py --requests 2000 --rate 200

Prints one JSON line: requests, refused, p50/p99/max of the refusal time (ms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import paho.mqtt.publish as mqtt_publish
from _support import mosquitto

from edgemon.protocol import CAPACITY_REFRESH_S

DEVICE = "shed-bench"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _serve(app: Any, port: int) -> Any:
    import uvicorn  # noqa: PLC0415 - only in .venv-vllm

    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    return server


async def _load(port: int, requests: int, rate: float, seed: int) -> list[tuple[int, float]]:
    import aiohttp  # noqa: PLC0415

    rng = random.Random(seed)
    url = f"http://127.0.0.1:{port}/v1/completions"
    body = {"model": "m", "prompt": "hello", "max_tokens": 16, "stream": True}
    out: list[tuple[int, float]] = []

    async def one(session: aiohttp.ClientSession) -> None:
        began = time.perf_counter()
        async with session.post(url, json=body) as answer:
            await answer.read()
            out.append((answer.status, (time.perf_counter() - began) * 1000.0))

    async with aiohttp.ClientSession() as session:
        tasks = []
        for _ in range(requests):
            tasks.append(asyncio.create_task(one(session)))
            await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*tasks)
    return out


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _engine(broker_port: int, done: threading.Event) -> None:
    """The engine's capacity object, stamped now, every `CAPACITY_REFRESH_S` until `done`
    (readers ignore an older one, docs/protocol.md)."""
    while True:
        capacity = {
            "t_ms": time.time() * 1000.0, "running": 12, "waiting": 9, "start_wait_ms": 6400
        }  # fmt: skip
        mqtt_publish.single(
            f"edgemon/v1/{DEVICE}/capacity",
            json.dumps(capacity),
            qos=1,
            retain=True,
            port=broker_port,
        )
        if done.wait(CAPACITY_REFRESH_S):
            return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=200.0, help="requests per second")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, mosquitto(Path(tmp)) as broker_port:
        os.environ["EDGEMON_GATE_DEVICE"] = DEVICE
        os.environ["EDGEMON_GATE_BROKER"] = f"mqtt://127.0.0.1:{broker_port}"
        os.environ["EDGEMON_SLO_START_MS"] = "3000"
        done = threading.Event()
        engine = threading.Thread(target=_engine, args=(broker_port, done), daemon=True)
        engine.start()
        from vllm.entrypoints.launchers.app import build_app  # noqa: PLC0415
        from vllm.entrypoints.launchers.cli_args import make_arg_parser  # noqa: PLC0415
        from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: PLC0415

        vllm_args = make_arg_parser(FlexibleArgumentParser()).parse_args(
            ["--middleware", "edgemon.integrations.shed.EdgemonShedMiddleware"]
        )
        app = build_app(vllm_args, supported_tasks=("generate",))
        port = _free_port()
        server = _serve(app, port)
        try:
            # The first request builds the middleware stack (and its capacity view): wait
            # until it refuses.
            deadline = time.monotonic() + 30
            while asyncio.run(_load(port, 1, 1000.0, 0))[0][0] != 503:
                if time.monotonic() > deadline:
                    sys.exit("the middleware never refused: no capacity object?")
                time.sleep(0.1)
            results = asyncio.run(_load(port, args.requests, args.rate, args.seed))
        finally:
            server.should_exit = True
            done.set()
    refused = [ms for status, ms in results if status == 503]
    print(
        json.dumps(
            {
                "requests": len(results),
                "refused": len(refused),
                "rate_per_s": args.rate,
                "refusal_p50_ms": round(_percentile(refused, 0.5), 2),
                "refusal_p99_ms": round(_percentile(refused, 0.99), 2),
                "refusal_max_ms": round(max(refused), 2),
            }
        )
    )


if __name__ == "__main__":
    main()
