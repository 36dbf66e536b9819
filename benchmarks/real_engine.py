"""The closed loop on a real engine: vLLM's CPU engine serving a generated model, on a wall clock.

Per policy, one `python -m vllm.entrypoints.openai.api_server` (kept up across that policy's
runs: a start takes tens of seconds) serves a model generated here (`_real_model.py`,
`--model-size`, random weights, no EOS token, nothing downloaded) on one core, with the
policy's scheduler and flags (`_real_server.py`: `open`, `cap:N`, vLLM's own admission and
prefill flags `queued:N:M`, `tokens:N:T`, `chunked:B[:L]`, `realtime`, `edgemon` =
`EdgemonRealtimeScheduler` with `EDGEMON_DEADLINES=shed`, the gate and the shedding
middleware on the run's device); one real Mosquitto and one `edgemon run` serve every run.
Players (`_real_players.py`) make the virtual loop's requests (same generator, same seeds:
runs compare) on the wall clock, stream them with `stream=true` and a generous `max_tokens`
cap (no length, no `ignore_eos`: lengths are unknown to the server), close each stream once
they have its frames (vLLM aborts the request), turn each token into a codec frame of
`--frame-ms`, play them with the README's prebuffer and report through
`edgemon.client.Reporter`. A 503 (vLLM's admission limits, edgemon's middleware) is `shed`.
Every step is the engine's own: its scheduling, batching, KV cache and timing, with jitter,
HTTP and all.

**Load** is a share of the capacity measured on this box just before the runs
(`_real_shape.Scale`): `--profile`'s workload and frames on the step model fitted to the
engine's steps (decode steps at 1-16 streams and a prefill's stall, on a server of its own
with vLLM's scheduler, about 2 minutes for the default model), or on the shape in
`--shape-file` (a `--shape --json` line; when the file does not exist yet, the shape is
measured and written there). Every row records it (`scale`: the fit, `capacity_rps`, when
and where from) and its `rate_rps`.

**Drain** (`--drain`, the default): arrivals stop at `--duration` and the run goes on until
every stream has ended (at most `--drain-limit` s), so no request is `unfinished`;
`--no-drain` stops the run at `--duration` and scores streams under way as they are.

**SLO capacity** (`--slo-capacity 0.95`): instead of fixed loads, the highest load (a share
of the measured capacity) at which at least 95 % of offered requests are good, per policy,
scenario and seed, by bisection between `--slo-bounds LO:HI` (default 0.2:1.2) to within
`--slo-tolerance` (default 0.05; `_slo_capacity.py`: 5 or 6 runs); one JSON row each with the
loads tried and their goodput.

Scenarios: `steady`; `burst` (`--burst K:T`, as the virtual loop's); `network`
(`--network D:S:P`, as the virtual loop's): the players reach the server through a delaying
proxy (`_real_proxy.py`) that holds the server's bytes D ms in the last S s of every P s;
`contention` (`--contention W:P:SHARE`): a CPU-bound co-tenant on the engine's core takes
SHARE of it for the last W s of every P s. The step slowdown it causes is measured first, on
a server with vLLM's scheduler (8 streams, co-tenant off then on), and printed;
each run's row gives the step inside its windows against outside (`window_step_ratio`).
The listeners' scenarios, as the virtual loop's (`edgemon.simulate.listeners`): `pause`
(`--pause SHARE:MIN_S:MAX_S`): a share of players stop consuming once for a while, and say
so with their next chunk's `play_start_ms`; `device` (`--device MIN_S:MAX_S:EVERY_S`): the
players stall now and then the same way; `prebuffer` (`--prebuffer SHORT_S:LONG_S:STEP_S`):
players that wait for more audio before they start; `wifi` (`--wifi MIN_S:MAX_S:EVERY_S`):
each player's link stalls now and then, emulated at the player: chunks that reach its socket
during a stall reach the player and its Reporter at the stall's end.

Each run prints one JSON row with the virtual loop's fields (`edgemon.simulate.figures.row`:
silence, SLO outcomes, goodput; `mode` `real`), plus `model_size`, `frame_ms`, `step_p50_ms`
(the median token gap of the run's streams), `cut` (streams ended before their last frame),
`server_flags`, `drain`, `rate_rps` and `scale`; `--dump FILE` writes one line per request
(`dump_lines`, with its run's `load`).

`--shape` measures the engine's step shape instead (token gaps at 1-16 streams, the stall a
prefill causes, the slowdown a co-tenant taking 0.25, 0.5 and 0.75 of the core causes) and
prints the fitted `StepModel`: how `cpu-vllm` was derived.

    .venv-vllm/bin/python benchmarks/real_engine.py --shape --json > shape.json
    .venv-vllm/bin/python benchmarks/real_engine.py --shape-file shape.json \\
        --policy open --policy queued:10:10 --policy edgemon \\
        --scenario steady --load 0.5,1.0 --seeds 1-3 --duration 180
    .venv-vllm/bin/python benchmarks/real_engine.py --slo-capacity 0.95 --seeds 1-3 \\
        --policy queued:10:10 --policy edgemon --scenario contention --contention 20:60:0.5
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
from typing import TYPE_CHECKING, Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

from _real_model import DEFAULT_SIZE, SIZES, write_model  # noqa: E402
from _real_players import DRAIN_LIMIT_S, Streams, TokenLog, wall_ms  # noqa: E402
from _real_proxy import DelayProxy  # noqa: E402
from _real_server import (  # noqa: E402
    CORE,
    PARKED,
    POLICIES,
    CoTenant,
    VllmServer,
    server_options,
)
from _real_shape import SHAPE_SHARES, Scale, calibrate, measure  # noqa: E402
from _slo_capacity import DEFAULT_BOUNDS, DEFAULT_TOLERANCE, Bisection, parse_bounds  # noqa: E402
from _support import Edgemon, mosquitto  # noqa: E402
from closed_loop import OneLineParser, framed, listener_flags, loads, seeds  # noqa: E402

from edgemon.client import Reporter  # noqa: E402
from edgemon.policy.deadlines import START_SLO_MS  # noqa: E402
from edgemon.simulate.figures import dump_lines, row  # noqa: E402
from edgemon.simulate.listeners import LISTENER_SCENARIOS  # noqa: E402
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

FEEDS = ("measured", "estimated", "none")
"""What `--feed` runs `edgemon`'s parking on (none: no parking)."""
PARKING_LINE = "): parked "
"""What the engine's log says when edgemon's parking parks a request (`_parking`)."""
SCENES = ("steady", "burst", "network", "contention", *LISTENER_SCENARIOS)
POLICY_HELP = f"{POLICIES} (the shipped policy); repeatable (default edgemon)"
TRIED_FIGURES = (
    "offered", "good", "late", "gappy", "shed", "unfinished", "cut", "step_p50_ms",
    "duration_s", "rate_rps",
)  # fmt: skip
"""A run's figures an SLO capacity row keeps for each load tried."""


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module doc)."""
    parser = OneLineParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--policy", action="append", help=POLICY_HELP)
    parser.add_argument("--scenario", action="append", choices=SCENES, help="default steady")
    parser.add_argument(
        "--load", help="share(s) of the capacity measured on this box (default 0.8)"
    )
    parser.add_argument("--seeds", default="1")
    parser.add_argument("--duration", type=float, default=180.0, help="seconds of arrivals")
    parser.add_argument(
        "--drain",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="arrivals stop at --duration and the run goes on until every stream has ended "
        "(default); --no-drain stops the run there",
    )
    parser.add_argument(
        "--drain-limit",
        type=float,
        default=DRAIN_LIMIT_S,
        help=f"the longest a run drains, seconds ({DRAIN_LIMIT_S:g})",
    )
    parser.add_argument(
        "--shape-file",
        type=Path,
        help="scale loads by the step shape in this file (a `--shape --json` line); if it "
        "does not exist, the shape is measured at the start and written there (default: "
        "measured at the start)",
    )
    parser.add_argument(
        "--slo-capacity",
        type=float,
        metavar="TARGET",
        help="find, per policy, scenario and seed, the highest load at which at least TARGET "
        "(e.g. 0.95) of offered requests are good, by bisection (instead of --load)",
    )
    parser.add_argument(
        "--slo-bounds",
        default=":".join(f"{b:g}" for b in DEFAULT_BOUNDS),
        help="LO:HI, the loads the bisection searches between",
    )
    parser.add_argument(
        "--slo-tolerance",
        type=float,
        default=DEFAULT_TOLERANCE,
        help="the bisection stops once the capacity is known to within this load",
    )
    parser.add_argument("--model-size", choices=sorted(SIZES), default=DEFAULT_SIZE)
    parser.add_argument("--frame-ms", type=float, default=80.0, help="audio of one token")
    parser.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default="cpu-vllm",
        help="the workload, frames, chunks, margin and vLLM limits (its step model is replaced "
        "by the one measured)",
    )
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
    listener_flags(parser)
    parser.add_argument(
        "--feed",
        action="append",
        choices=FEEDS,
        help="repeatable: run `edgemon` with parking fed this (measured: edgemon's slack feed, "
        "estimated: the server's estimate, as `edgemon+park:FEED`; none: `edgemon`)",
    )
    parser.add_argument("--start-slo-ms", type=float, default=START_SLO_MS)
    parser.add_argument("--dump", type=Path, help="one JSON line per request to this file")
    parser.add_argument("--out", type=Path, help="also write the rows here")
    parser.add_argument("--json", action="store_true", help="JSON lines only")
    parser.add_argument("--shape", action="store_true", help="measure the step shape, fit it")
    args = parser.parse_args(argv)
    try:
        _check(args)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def _check(args: argparse.Namespace) -> None:
    """Read and check what the flags say; ValueError naming the flag otherwise."""
    args.seed_list = seeds(args.seeds)
    if args.slo_capacity is not None and args.load is not None:
        raise ValueError("--slo-capacity searches the load: give it without --load")
    args.load_list = loads(args.load or "0.8")
    args.windows, args.share = parse_contention(args.contention)
    args.profile_used = framed(PROFILES[args.profile], args.frame_ms)
    args.scenes = [_scene(name, args) for name in args.scenario or ["steady"]]
    fed = [PARKED + feed if feed != "none" else "edgemon" for feed in args.feed or []]
    args.policies = list(dict.fromkeys([*(args.policy or ([] if fed else ["edgemon"])), *fed]))
    for text in args.policies:
        server_options(text, args.profile_used, broker_url="", device="", start_slo_ms=1)
    if args.slo_capacity is not None:
        low, high = parse_bounds(args.slo_bounds)
        try:  # the search's own checks, with the flags' names
            Bisection(args.slo_capacity, low, high, args.slo_tolerance)
        except ValueError as exc:
            raise ValueError(f"--slo-capacity/--slo-tolerance: {exc}") from None
        args.bounds = (low, high)
    if not (math.isfinite(args.duration) and args.duration > 0):
        raise ValueError("--duration must be a number of seconds > 0")
    if not (math.isfinite(args.drain_limit) and args.drain_limit >= 0):
        raise ValueError("--drain-limit must be a number of seconds ≥ 0")
    args.scale = None
    if args.shape_file is not None and args.shape_file.exists():
        args.scale = Scale.of(args.profile_used, args.shape_file, str(args.shape_file))


def _scene(name: str, args: argparse.Namespace) -> Scenario:
    """The scenario's arrivals and listeners (the virtual loop's); contention's slowdown is
    real here."""
    if name == "contention":
        return scenario("contention", contention=args.contention, factor=1.0)
    listeners = {name: getattr(args, name) for name in LISTENER_SCENARIOS}
    return scenario(name, burst=args.burst, network=args.network, listeners=listeners)


@dataclass(slots=True)
class Stack:
    """Mosquitto and `edgemon run`, shared by every run; the model directory."""

    directory: Path
    broker_url: str
    model: Path
    vocab_size: int
    dtype: str


@dataclass(slots=True)
class Context:
    """What every run of one invocation shares: the flags, the stack, the scale, the
    co-tenant's measured slowdown, where the rows and dump lines go."""

    args: argparse.Namespace
    stack: Stack
    scale: Scale
    say: TextIO
    dump: Any
    measured: dict[str, float] | None


@dataclass(slots=True)
class PolicyServer:
    """One policy's server and the run's device its gate follows."""

    text: str
    server: VllmServer
    device: str
    started_s: float


def points(args: argparse.Namespace) -> Iterator[tuple[Scenario, float, int]]:
    """A policy's runs at fixed loads, in order."""
    for scene in args.scenes:
        for load in args.load_list:
            for seed in args.seed_list:
                yield scene, load, seed


def run_policy(context: Context, text: str, index: int) -> list[dict[str, Any]]:
    """Start the policy's server, run its points (or search its SLO capacity), stop it; the
    rows."""
    args, stack = context.args, context.stack
    device = f"real-{index}"
    options = server_options(
        text,
        args.profile_used,
        broker_url=stack.broker_url,
        device=device,
        start_slo_ms=args.start_slo_ms,
    )
    began = time.monotonic()
    server = VllmServer(
        stack.model, stack.directory / f"server-{index}", options, core=CORE, dtype=stack.dtype
    )
    server.start()
    served = PolicyServer(text, server, device, round(time.monotonic() - began, 1))
    try:
        if args.slo_capacity is not None:
            return [
                _search(context, served, scene, seed)
                for scene in args.scenes
                for seed in args.seed_list
            ]
        rows = []
        for scene, load, seed in points(args):
            line = _point(context, served, scene, load, seed)
            print(json.dumps(line), file=context.say, flush=True)
            rows.append(line)
        return rows
    finally:
        server.close()


def _point(
    context: Context, served: PolicyServer, scene: Scenario, load: float, seed: int
) -> dict[str, Any]:
    """One run at `load` on the policy's server: its row (the dump lines written)."""
    args = context.args
    server = served.server
    server.wait_idle()
    preempted = server.preemptions()
    _, log_at = server.log_lines(PARKING_LINE)
    line, players, origin, end = _run(context, served, scene, load, seed)
    parks, _ = server.log_lines(PARKING_LINE, log_at)
    line |= {
        "policy": served.text,
        "server_start_s": served.started_s,
        "parks": parks,
        "preemptions": server.preemptions() - preempted,
    }
    if scene.name == "contention" and context.measured is not None:
        line["contention_slowdown"] = context.measured["ratio"]
    if context.dump is not None:
        for item in dump_lines(
            players,
            policy=served.text,
            scenario=scene.name,
            seed=seed,
            origin_ms=origin,
            end_ms=end,
            start_slo_ms=args.start_slo_ms,
        ):
            context.dump.write(json.dumps(item | {"load": load}) + "\n")
    return line


def _search(context: Context, served: PolicyServer, scene: Scenario, seed: int) -> dict[str, Any]:
    """The SLO capacity of the policy at one scenario and seed (see the module doc): its row."""
    args = context.args
    low, high = args.bounds
    search = Bisection(args.slo_capacity, low, high, args.slo_tolerance)
    last: dict[str, Any] = {}
    while (load := search.next_load()) is not None:
        last = _point(context, served, scene, load, seed)
        search.record(load, last["goodput"], {k: last.get(k) for k in TRIED_FIGURES})
    capacity = search.capacity
    rps = None if capacity is None else round(capacity * context.scale.capacity_rps, 4)
    line = {
        "mode": "real",
        "kind": "slo_capacity",
        "profile": last.get("profile"),
        "policy": served.text,
        "scenario": scene.name,
        "scenario_params": last.get("scenario_params"),
        "seed": seed,
        **search.fields(),
        "slo_capacity_rps": rps,
        **{k: last.get(k) for k in ("duration_s", "drain", "start_slo_ms", "gap_slo_ms")},
        "arrivals_s": args.duration,
        "model_size": args.model_size,
        "frame_ms": args.profile_used.frame_ms,
        "server_flags": " ".join(served.server.options.args),
        "server_start_s": served.started_s,
        "scale": context.scale.record(),
    }
    print(json.dumps(line), file=context.say, flush=True)
    return line


def open_server(args: argparse.Namespace, stack: Stack, name: str) -> VllmServer:
    """A server with vLLM's own scheduler and no gate, started."""
    options = server_options("open", args.profile_used, broker_url="", device="", start_slo_ms=1)
    return VllmServer(
        stack.model, stack.directory / name, options, core=CORE, dtype=stack.dtype
    ).start()


def measurements(
    args: argparse.Namespace, stack: Stack, say: TextIO
) -> tuple[Scale, dict[str, float] | None]:
    """Before the runs, on a server of its own with vLLM's scheduler: the step shape the
    loads are shares of (unless read from `--shape-file`) and, when a contention point runs,
    the co-tenant's slowdown (on the policy's server the policy would refuse streams under
    the co-tenant, and start its first run with what it learned from the slow steps)."""
    scale: Scale | None = args.scale
    contended = any(scene.name == "contention" for scene in args.scenes)
    if scale is not None and not contended:
        return scale, None
    server = open_server(args, stack, "measurements")
    measured = None
    try:
        if scale is None:
            path = args.shape_file or stack.directory / "shape.json"
            _say(args, say, f"# measuring the step shape (into {path})")
            shape = measure(
                server,
                vocab=stack.vocab_size,
                model_size=args.model_size,
                # A shape file is read again (`closed_loop.py --steps`): with its co-tenants'
                # slowdowns, as `--shape` writes it. A run's own shape needs none.
                shares=() if args.shape_file is None else SHAPE_SHARES,
                say=lambda text: _say(args, say, text),
            )
            path.write_text(json.dumps(shape) + "\n", encoding="utf-8")
            scale = Scale.of(args.profile_used, path, "measured")
        if contended:
            measured = calibrate(args.share, server, stack.vocab_size, args.model_size)
            _say(args, say, f"# contention {args.contention}: {measured}")
    finally:
        server.close()
    _say(args, say, f"# scale: {json.dumps(scale.record())}")
    return scale, measured


def _run(
    context: Context, served: PolicyServer, scene: Scenario, load: float, seed: int
) -> tuple[dict[str, Any], list[Any], float, float]:
    """One run: its row (without the policy), players, origin and end (wall ms)."""
    args, stack = context.args, context.stack
    profile: Profile = args.profile_used
    server = served.server
    rate = load * context.scale.capacity_rps
    origin = wall_ms() + 200.0
    tenant = proxy = None
    reporter = Reporter(stack.broker_url, served.device).open()
    try:
        if scene.name == "contention":
            tenant = CoTenant(CORE, args.share, args.windows, origin / 1000.0).start()
        if scene.network is not None:
            proxy = DelayProxy(server.port, args.network, origin / 1000.0).start()
        streams = Streams(
            url=server.url if proxy is None else proxy.url,
            profile=profile,
            arrivals=RequestSource(rate, profile.workload, seed=seed, burst=scene.burst),
            seed=seed,
            vocab_size=stack.vocab_size,
            reporter=reporter,
            margin_ms=profile.margin_ms,
            drain_limit_s=args.drain_limit,
            listeners=scene.listeners,
        )
        score = asyncio.run(streams.run(args.duration, origin_ms=origin, drain=args.drain))
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
        "drain": args.drain,
        "arrivals_s": args.duration,
        "rate_rps": round(rate, 4),
        "server_flags": " ".join(server.options.args),
        "scale": context.scale.record(),
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
                scale, measured = measurements(args, stack, say)
                dump = args.dump.open("w", encoding="utf-8") if args.dump else None
                try:
                    context = Context(args, stack, scale, say, dump, measured)
                    return [
                        line
                        for index, text in enumerate(args.policies)
                        for line in run_policy(context, text, index)
                    ]
                finally:
                    if dump is not None:
                        dump.close()
            finally:
                edgemon.close()


def shape(args: argparse.Namespace, stack: Stack, say: TextIO) -> dict[str, Any]:
    """Measure the decode steps, a prefill's stall and the co-tenant's slowdowns on the open
    server; fit them."""
    server = open_server(args, stack, "shape")
    try:
        return measure(
            server,
            vocab=stack.vocab_size,
            model_size=args.model_size,
            say=lambda text: _say(args, say, text),
        )
    finally:
        server.close()


def header(args: argparse.Namespace) -> str:
    """What is about to run, in one comment line."""
    profile: Profile = args.profile_used
    loads_text = (
        f"SLO capacity ≥ {args.slo_capacity:g} good between loads {args.slo_bounds} "
        f"(± {args.slo_tolerance:g})"
        if args.slo_capacity is not None
        else f"load {','.join(f'{x:g}' for x in args.load_list)}"
    )
    what = (
        "step shape"
        if args.shape
        else (
            f"profile {profile.name}'s workload, frame {profile.frame_ms:g} ms, loads as shares "
            f"of the capacity measured on this box; scenarios "
            f"{', '.join(s.name for s in args.scenes)}; {loads_text}; seeds {args.seeds}; "
            f"{args.duration:g} s of arrivals per run{', drained' if args.drain else ''}; "
            f"policies {', '.join(args.policies)}"
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
