"""The closed loop on a real engine: vLLM's CPU engine serving a generated model, on a wall clock.

Per policy, one `python -m vllm.entrypoints.openai.api_server` (kept up across that policy's
runs; a start took 33-47 s on the busy VM) serves a model generated here (`_real_model.py`,
`--model-size`, random weights, nothing downloaded) on one core, with the policy's scheduler
(`_real_server.py`: `open`, `cap:N`, `realtime`, `edgemon` = `EdgemonRealtimeScheduler` with
`EDGEMON_DEADLINES=shed`, the gate and the shedding middleware on the run's device); one real
Mosquitto and one `edgemon run` serve every run. Players (`_real_players.py`) make the
virtual loop's requests (same generator, same seeds: runs compare) on the wall clock, stream
them with `stream=true`, turn each token into a codec frame of `--frame-ms`, play them with
the README's prebuffer and report through `edgemon.client.Reporter`. Every step is the
engine's own: its scheduling, batching, KV cache and timing, with jitter, HTTP and all.

Scenarios: `steady`; `burst` (`--burst K:T`, as the virtual loop's); `network`
(`--network D:S:P`, as the virtual loop's): the players reach the server through a delaying
proxy (`_real_proxy.py`) that holds the server's bytes D ms in the last S s of every P s;
`contention` (`--contention W:P:SHARE`): a CPU-bound co-tenant on the engine's core takes
SHARE of it for the last W s of every P s. The step slowdown it causes is measured first, on
a server of its own with vLLM's scheduler (8 streams, co-tenant off then on), and printed;
each run's row gives the step inside its windows against outside (`window_step_ratio`).

Each run prints one JSON row with the virtual loop's fields (`edgemon.simulate.figures.row`:
silence, SLO outcomes, goodput; `mode` `real`), plus `model_size`, `frame_ms`, `step_p50_ms`
(the median token gap of the run's streams), `cut` (streams ended after some frames);
`--dump FILE` writes one line per request (`dump_lines`). Load is a share of the profile's
estimated capacity (`--profile`, default `cpu-vllm`, fitted on this engine).

`--shape` measures the engine's step shape instead (token gaps at 1-16 streams, the stall a
prefill causes, the slowdown a co-tenant taking 0.25, 0.5 and 0.75 of the core causes) and
prints the fitted `StepModel`: how `cpu-vllm` was derived.

    .venv-vllm/bin/python benchmarks/real_engine.py --policy open --policy edgemon \\
        --scenario steady --load 0.9 --seeds 1-3 --duration 180
    .venv-vllm/bin/python benchmarks/real_engine.py --policy edgemon --scenario contention \\
        --contention 20:60:0.5 --load 0.8 --seeds 1 --duration 120
    .venv-vllm/bin/python benchmarks/real_engine.py --shape
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

from _real_model import DEFAULT_SIZE, SIZES, write_model  # noqa: E402
from _real_players import Streams, TokenLog, wall_ms  # noqa: E402
from _real_proxy import DelayProxy  # noqa: E402
from _real_server import CoTenant, VllmServer, server_options  # noqa: E402
from _real_steps import decode_shape, fit, prefill_stall, shape_json, slowdown  # noqa: E402
from _support import Edgemon, mosquitto  # noqa: E402
from closed_loop import framed, loads, seeds  # noqa: E402

from edgemon.client import Reporter  # noqa: E402
from edgemon.integrations.deadlines import START_SLO_MS  # noqa: E402
from edgemon.simulate.figures import dump_lines, row  # noqa: E402
from edgemon.simulate.players import percentile  # noqa: E402
from edgemon.simulate.profiles import PROFILES  # noqa: E402
from edgemon.simulate.scenarios import (  # noqa: E402
    DEFAULT_BURST,
    DEFAULT_CONTENTION,
    DEFAULT_NETWORK,
    RequestSource,
    Windows,
    parse_contention,
    scenario,
)

if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import TextIO

    from edgemon.simulate.profiles import Profile
    from edgemon.simulate.scenarios import Scenario

SCENES = ("steady", "burst", "network", "contention")
POLICY_HELP = "open | cap:N | realtime | edgemon (the shipped policy); repeatable (default edgemon)"
SHAPE_COUNTS = [1, 2, 4, 8, 10, 12, 16]
STALL_STREAMS = 8
STALL_PROMPT = 300
CALIBRATION_STREAMS = 8
SHAPE_SHARES = (0.25, 0.5, 0.75)
"""The co-tenant's shares `--shape` measures the slowdown of (the profile's `contention`)."""
CORE = 1
"""The engine's core; the other one is left to Mosquitto, edgemon and the players."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module doc)."""
    parser = _Parser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--policy", action="append", help=POLICY_HELP)
    parser.add_argument("--scenario", action="append", choices=SCENES, help="default steady")
    parser.add_argument("--load", default="0.8", help="share(s) of the profile's capacity")
    parser.add_argument("--seeds", default="1")
    parser.add_argument("--duration", type=float, default=180.0, help="seconds per run")
    parser.add_argument("--model-size", choices=sorted(SIZES), default=DEFAULT_SIZE)
    parser.add_argument("--frame-ms", type=float, default=80.0, help="audio of one token")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="cpu-vllm")
    parser.add_argument("--burst", default=DEFAULT_BURST, help="K:T, K requests every T s")
    parser.add_argument(
        "--network",
        default=DEFAULT_NETWORK,
        help="D:S:P, the server's bytes reach the players D ms late in the last S s of every P s",
    )
    parser.add_argument(
        "--contention",
        default=DEFAULT_CONTENTION,
        help=f"W:P:SHARE, a co-tenant takes SHARE of the engine's core for the last W s of "
        f"every P s ({DEFAULT_CONTENTION})",
    )
    parser.add_argument("--start-slo-ms", type=float, default=START_SLO_MS)
    parser.add_argument("--dump", type=Path, help="one JSON line per request to this file")
    parser.add_argument("--out", type=Path, help="also write the rows here")
    parser.add_argument("--json", action="store_true", help="JSON lines only")
    parser.add_argument("--shape", action="store_true", help="measure the step shape, fit it")
    args = parser.parse_args(argv)
    try:
        args.seed_list = seeds(args.seeds)
        args.load_list = loads(args.load)
        args.windows, args.share = parse_contention(args.contention)
        args.profile_used = framed(PROFILES[args.profile], args.frame_ms)
        args.scenes = [_scene(name, args) for name in args.scenario or ["steady"]]
        args.policies = list(dict.fromkeys(args.policy or ["edgemon"]))
        for text in args.policies:
            server_options(text, args.profile_used, broker_url="", device="", start_slo_ms=1)
    except ValueError as exc:
        parser.error(str(exc))
    if not (math.isfinite(args.duration) and args.duration > 0):
        parser.error("--duration must be a number of seconds > 0")
    return args


def _scene(name: str, args: argparse.Namespace) -> Scenario:
    """The scenario's arrivals (the virtual loop's); contention's slowdown is real here."""
    if name == "contention":
        return scenario("contention", contention=args.contention, factor=1.0)
    return scenario(name, burst=args.burst, network=args.network)


@dataclass(slots=True)
class Stack:
    """Mosquitto and `edgemon run`, shared by every run; the model directory."""

    directory: Path
    broker_url: str
    model: Path
    vocab_size: int
    dtype: str


def points(args: argparse.Namespace) -> Iterator[tuple[Scenario, float, int]]:
    """A policy's runs, in order."""
    for scene in args.scenes:
        for load in args.load_list:
            for seed in args.seed_list:
                yield scene, load, seed


def run_policy(
    args: argparse.Namespace,
    stack: Stack,
    text: str,
    index: int,
    say: TextIO,
    dump: Any,
    measured: dict[str, float] | None,
) -> list[dict[str, Any]]:
    """Start the policy's server, run its points, stop it; the rows."""
    profile: Profile = args.profile_used
    device = f"real-{index}"
    options = server_options(
        text,
        profile,
        broker_url=stack.broker_url,
        device=device,
        start_slo_ms=args.start_slo_ms,
    )
    began = time.monotonic()
    server = VllmServer(
        stack.model, stack.directory / f"server-{index}", options, core=CORE, dtype=stack.dtype
    )
    server.start()
    started_s = round(time.monotonic() - began, 1)
    rows: list[dict[str, Any]] = []
    try:
        for scene, load, seed in points(args):
            server.wait_idle()
            line, players, origin, end = _run(args, stack, server, device, scene, load, seed)
            line |= {"policy": text, "server_start_s": started_s}
            if scene.name == "contention" and measured is not None:
                line["contention_slowdown"] = measured["ratio"]
            rows.append(line)
            print(json.dumps(line), file=say, flush=True)
            if dump is not None:
                for item in dump_lines(
                    players,
                    policy=text,
                    scenario=scene.name,
                    seed=seed,
                    origin_ms=origin,
                    end_ms=end,
                    start_slo_ms=args.start_slo_ms,
                ):
                    dump.write(json.dumps(item) + "\n")
    finally:
        server.close()
    return rows


def open_server(args: argparse.Namespace, stack: Stack, name: str) -> VllmServer:
    """A server with vLLM's own scheduler and no gate, started."""
    options = server_options("open", args.profile_used, broker_url="", device="", start_slo_ms=1)
    return VllmServer(
        stack.model, stack.directory / name, options, core=CORE, dtype=stack.dtype
    ).start()


def calibration(args: argparse.Namespace, stack: Stack, say: TextIO) -> dict[str, float] | None:
    """The co-tenant's slowdown, when a contention point runs: measured once, on a server of
    its own with vLLM's scheduler. On the policy's server the policy would refuse streams
    under the co-tenant, and start its first run with what it learned from the slow steps."""
    if not any(scene.name == "contention" for scene in args.scenes):
        return None
    server = open_server(args, stack, "calibration")
    try:
        measured = _calibrate(args.share, server, stack.vocab_size)
    finally:
        server.close()
    _say(args, say, f"# contention {args.contention}: {measured}")
    return measured


def _calibrate(share: float, server: VllmServer, vocab: int) -> dict[str, float]:
    """The decode step of 8 streams without and with a co-tenant taking `share`."""

    def contend() -> Any:
        always = Windows(1.0, 1.0)  # on all the time while measuring
        tenant = CoTenant(CORE, share, always, time.time()).start()
        return tenant.close

    alone, shared, ratio = slowdown(server.url, CALIBRATION_STREAMS, contend, vocab=vocab)
    server.wait_idle()
    return {"step_ms": alone, "contended_step_ms": shared, "ratio": round(ratio, 3)}


def _run(
    args: argparse.Namespace,
    stack: Stack,
    server: VllmServer,
    device: str,
    scene: Scenario,
    load: float,
    seed: int,
) -> tuple[dict[str, Any], list[Any], float, float]:
    """One run: its row (without the policy), players, origin and end (wall ms)."""
    profile: Profile = args.profile_used
    reporter = Reporter(stack.broker_url, device).open()
    origin = wall_ms() + 200.0
    tenant = proxy = None
    if scene.name == "contention":
        tenant = CoTenant(CORE, args.share, args.windows, origin / 1000.0).start()
    if scene.network is not None:
        proxy = DelayProxy(server.port, args.network, origin / 1000.0).start()
    streams = Streams(
        url=server.url if proxy is None else proxy.url,
        profile=profile,
        arrivals=RequestSource(
            load * profile.capacity_rps(), profile.workload, seed=seed, burst=scene.burst
        ),
        seed=seed,
        vocab_size=stack.vocab_size,
        reporter=reporter,
        margin_ms=profile.margin_ms,
    )
    try:
        score = asyncio.run(streams.run(args.duration, origin_ms=origin))
    finally:
        if tenant is not None:
            tenant.close()
        if proxy is not None:
            proxy.close()
        reporter.close()
    line = row(
        score,
        mode="real",
        profile=profile.name,
        policy="",
        scenario=scene.name,
        load=load,
        seed=seed,
        duration_s=round((streams.end_ms - origin) / 1000.0, 3),
    )
    line |= {
        "scenario_params": args.contention if scene.name == "contention" else scene.describe(),
        "model_size": args.model_size,
        "frame_ms": profile.frame_ms,
        "chunks": ",".join(map(str, profile.chunk_schedule)),
        "cut": streams.log.cut,
        **_steps(streams.log, origin, args.windows if scene.name == "contention" else None),
    }
    return line, list(streams.players.values()), origin, streams.end_ms


def _steps(log: TokenLog, origin: float, windows: Windows | None) -> dict[str, Any]:
    """The median token gap of the run (a step), and inside against outside the windows."""
    last: dict[str, float] = {}
    inside: list[float] = []
    outside: list[float] = []
    for stream, t in log.arrivals:
        before = last.get(stream)
        last[stream] = t
        if before is None:
            continue
        if windows is not None and windows.active(t - origin):
            inside.append(t - before)
        else:
            outside.append(t - before)
    gaps = inside + outside
    out: dict[str, Any] = {"step_p50_ms": _round(percentile(gaps, 0.5))}
    if windows is not None and inside and outside:
        out["window_step_ratio"] = round(statistics.median(inside) / statistics.median(outside), 3)
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _say(args: argparse.Namespace, say: TextIO, text: str) -> None:
    if not args.json:
        print(text, file=say, flush=True)


def run_all(args: argparse.Namespace, say: TextIO) -> list[dict[str, Any]]:
    """Every policy's runs (see the module doc)."""
    with tempfile.TemporaryDirectory(prefix="edgemon-real-") as name:
        directory = Path(name)
        model = directory / "model"
        dims = write_model(model, args.model_size)
        with mosquitto(directory) as port:
            edgemon = Edgemon(directory, port)
            try:
                edgemon.ready()
                url = f"mqtt://127.0.0.1:{port}"
                stack = Stack(directory, url, model, dims.vocab_size, dims.dtype)
                if args.shape:
                    return [shape(args, stack, say)]
                dump = args.dump.open("w", encoding="utf-8") if args.dump else None
                try:
                    measured = calibration(args, stack, say)
                    return [
                        line
                        for index, text in enumerate(args.policies)
                        for line in run_policy(args, stack, text, index, say, dump, measured)
                    ]
                finally:
                    if dump is not None:
                        dump.close()
            finally:
                edgemon.close()


def shape(args: argparse.Namespace, stack: Stack, say: TextIO) -> dict[str, Any]:
    """Measure the decode steps and a prefill's stall on the open server; fit them."""
    server = open_server(args, stack, "shape")
    try:
        shapes = decode_shape(server.url, SHAPE_COUNTS, vocab=stack.vocab_size)
        _say(args, say, f"# decode steps (ms: median, p90, gaps): {shape_json(shapes)}")
        stall = prefill_stall(server.url, STALL_STREAMS, STALL_PROMPT, vocab=stack.vocab_size)
        contention = {}
        for share in SHAPE_SHARES:
            measured = _calibrate(share, server, stack.vocab_size)
            _say(args, say, f"# a co-tenant taking {share:g} of the core: {measured}")
            contention[share] = measured["ratio"]
    finally:
        server.close()
    model = fit(shapes, stall, stall_streams=STALL_STREAMS, prompt_tokens=STALL_PROMPT)
    return {
        "model_size": args.model_size,
        "decode_ms": {s.streams: [s.median_ms, s.p90_ms] for s in shapes},
        "stall_ms": {"streams": STALL_STREAMS, "prompt": STALL_PROMPT, "ms": stall},
        "contention": contention,
        "fit": {
            "base_ms": model.base_ms,
            "per_decode_seq_ms": model.per_decode_seq_ms,
            "per_prefill_token_ms": model.per_prefill_token_ms,
        },
    }


def header(args: argparse.Namespace) -> str:
    """What is about to run, in one comment line."""
    profile: Profile = args.profile_used
    what = (
        "step shape"
        if args.shape
        else (
            f"profile {profile.name} (capacity ≈ {profile.capacity_rps():.3f} req/s), frame "
            f"{profile.frame_ms:g} ms; scenarios {', '.join(s.name for s in args.scenes)}; "
            f"load {args.load}; seeds {args.seeds}; {args.duration:g} s per run; policies "
            f"{', '.join(args.policies)}"
        )
    )
    return (
        f"# closed loop on a real engine (vLLM CPU, {args.model_size}, one core): {what}; "
        f"{platform.node()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
    )


def _interrupt(signum: int, _frame: object) -> None:
    """SIGTERM: unwind as Ctrl-C does, so that the servers and the co-tenant are stopped."""
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    """Run the points (or measure the shape); rows on stdout."""
    args = parse(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    if not args.json:
        print(header(args), flush=True)
    rows = run_all(args, sys.stdout)
    if args.shape:
        print(json.dumps(rows[0]), flush=True)
    if args.out:
        from _loop_report import write_rows  # noqa: PLC0415

        write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
