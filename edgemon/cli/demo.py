"""`edgemon demo`: the whole product in one process, with nothing to set up (README).

An embedded broker on a free loopback port, the daemon on it (HTTP on `--listen`, no
recording, its logs in a file so they do not fight the view), and two kinds of simulated
devices:

- `sim-<n>` (`--devices`): players of a fixed generation speed, all healthy at RTF 0.15 but
  the last, which is overloaded at RTF 1.1 and keeps underrunning;
- the loop (`demo_loop`): three simulated TTS engines (`--profile`) serving the same seeded
  requests at `--load` times their estimated capacity, players reporting through real
  Reporters: `loop-open` as vLLM ships, `loop-static` with the one line of vLLM's own flags an
  operator would set, `loop-edgemon` with the policy edgemon ships.

A terminal gets a live view (4 frames/s) that shows per device whether its engine holds
prefills; a pipe gets one status line every few seconds.

After `--duration` (or SIGINT/SIGTERM) it stops in order: the simulator and the engines (open
streams are ended as cancelled), the daemon (it releases its throttles and goes offline), the
broker. Then it prints a summary, with what each box's listeners heard; its last line is one
JSON object for scripts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.live import Live

from edgemon.broker import EmbeddedBrokerError, embedded_broker
from edgemon.cli import demo_loop
from edgemon.cli.errors import EXIT_FAILURE, EXIT_OK, UsageError
from edgemon.cli.signals import on_stop_signals
from edgemon.errors import PublishError
from edgemon.monitor import APPLIED
from edgemon.settings import HttpSettings, LogSettings, MqttSettings, Settings, parse_listen
from edgemon.simulate.profiles import PROFILES
from edgemon.view import DeviceTotals, render_view, status_line

if TYPE_CHECKING:
    import argparse
    from collections.abc import AsyncIterator, Iterator

    from edgemon.daemon import Daemon
    from edgemon.monitor import Monitor
    from edgemon.simulate.players import Score

HEALTHY_RTF = 0.15
OVERLOADED_RTF = 1.1
STALL_RATE = 0.01
LOAD = 1.0
"""The loop's engines serve this share of their estimated capacity: near the knee."""
MAX_DEVICES = 50
MAX_STREAMS = 64
READY_TIMEOUT_S = 10.0
#: After the simulator stops: how long the daemon may take to see the last `end` events.
DRAIN_S = 1.0
FRAME_S = 0.25
LINE_EVERY_S = 2.0
#: Lines of a frame besides the stream rows and the `sim-<n>` devices: the title, two table
#: titles, their headers (two lines for the devices' at 100 columns) and rules, the loop's
#: three devices, and the "… more streams" line.
_FRAME_CHROME = 12


def register(commands: argparse._SubParsersAction[Any], help_text: str) -> None:
    """Add `demo` to the command line; `help_text` is its line in `edgemon --help`."""
    parser = commands.add_parser(
        "demo",
        help=help_text,
        description="Runs an embedded MQTT broker, the daemon and simulated TTS devices (the "
        f"last one overloaded at RTF {OVERLOADED_RTF}, the others at {HEALTHY_RTF}), plus three "
        "simulated TTS engines serving the same requests (vLLM's defaults, vLLM's own admission "
        "limit, edgemon's scheduler), with a live view; then prints a summary comparing what "
        "their listeners heard (its last line is JSON). Needs the embedded extra "
        "(`pip install edgemon[embedded]`).",
    )
    parser.add_argument(
        "--duration", type=float, default=60.0, metavar="S", help="seconds to run (default 60)"
    )
    parser.add_argument(
        "--devices", type=int, default=2, help="simulated fixed-RTF devices (default 2)"
    )
    parser.add_argument(
        "--streams", type=int, default=4, help="concurrent streams per fixed-RTF device (default 4)"
    )
    parser.add_argument(
        "--listen",
        default="127.0.0.1:9857",
        metavar="HOST:PORT",
        help="where the daemon serves /metrics (default 127.0.0.1:9857; port 0 picks a free one)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        help="seed of the devices and of the engines' requests (default: random)",
    )
    parser.add_argument(
        "--stall-rate",
        type=float,
        default=STALL_RATE,
        metavar="P",
        help=f"probability per chunk of a 0.5–3 s stall (default {STALL_RATE})",
    )
    parser.add_argument(
        "--profile",
        default="jetson",
        metavar="NAME",
        help=f"the loop's engines' hardware profile: {', '.join(PROFILES)} (default jetson)",
    )
    parser.add_argument(
        "--load",
        type=float,
        default=LOAD,
        metavar="X",
        help=f"the engines' request rate as a share of estimated capacity (default {LOAD:g})",
    )
    parser.set_defaults(handler=run)


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """What one demo run does (validated flags)."""

    duration_s: float
    streams: int
    listen: str
    seed: int
    stall_rate: float
    rtf: tuple[float, ...]
    loop: demo_loop.LoopPlan

    @property
    def devices(self) -> tuple[str, ...]:
        """The simulated device ids (the simulator names them `sim-<n>`)."""
        return tuple(f"sim-{i}" for i in range(len(self.rtf)))


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """What the demo saw, read from the daemon's monitor after it stopped."""

    elapsed_s: float
    metrics_url: str
    exit_code: int
    streams: dict[str, int]
    underruns: dict[str, int]
    throttle_engagements: dict[str, int]
    messages: int
    rejected: int
    loop: dict[str, Score]
    held_s: float


def plan_from_args(args: argparse.Namespace) -> Plan:
    """Check the flags; a `UsageError` names the first bad one."""
    if not (math.isfinite(args.duration) and args.duration > 0):
        raise UsageError("--duration must be a number of seconds > 0")
    if not 1 <= args.devices <= MAX_DEVICES:
        raise UsageError(f"--devices must be between 1 and {MAX_DEVICES}")
    if not 1 <= args.streams <= MAX_STREAMS:
        raise UsageError(f"--streams must be between 1 and {MAX_STREAMS}")
    if not 0.0 <= args.stall_rate <= 1.0:
        raise UsageError("--stall-rate must be between 0 and 1")
    if args.profile not in PROFILES:
        raise UsageError(f"--profile must be one of {', '.join(PROFILES)}, not {args.profile!r}")
    if not (math.isfinite(args.load) and 0.0 < args.load <= 3.0):
        raise UsageError("--load must be a share of capacity > 0 and ≤ 3")
    try:
        parse_listen(args.listen)
    except ValueError as exc:
        raise UsageError(f"--listen {args.listen!r}: {exc}") from None
    seed = random.SystemRandom().randrange(2**32) if args.seed is None else args.seed
    rtf = (HEALTHY_RTF,) * (args.devices - 1) + (OVERLOADED_RTF,)
    return Plan(
        duration_s=args.duration,
        streams=args.streams,
        listen=args.listen,
        seed=seed,
        stall_rate=args.stall_rate,
        rtf=rtf,
        loop=demo_loop.LoopPlan(profile=PROFILES[args.profile], load=args.load, seed=seed),
    )


def run(args: argparse.Namespace) -> int:
    """Run the demo and print its summary."""
    plan = plan_from_args(args)
    _check_listen(plan.listen)
    console = Console()
    with _daemon_log() as log_path:
        try:
            outcome = asyncio.run(_demo(plan, console))
        except EmbeddedBrokerError as exc:
            raise UsageError(str(exc)) from None
        except PublishError as exc:
            print(f"edgemon demo: the simulator lost the embedded broker: {exc}", file=sys.stderr)
            return EXIT_FAILURE
    _print_summary(plan, outcome, log_path)
    if outcome.exit_code != EXIT_OK:
        print(f"edgemon demo: the daemon failed; see {log_path}", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


def _check_listen(listen: str) -> None:
    """Fail early with one line when the HTTP address is taken (a daemon may already run)."""
    host, port = parse_listen(listen)
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise UsageError(
            f"--listen {listen}: {reason} (another edgemon running? try --listen 127.0.0.1:0)"
        ) from None


@contextlib.contextmanager
def _daemon_log() -> Iterator[str]:
    """The daemon's structlog lines and library warnings go to a temporary file, kept after."""
    from edgemon.daemon.logs import configure_logging  # noqa: PLC0415 - only the daemon needs it

    descriptor, path = tempfile.mkstemp(prefix="edgemon-demo-", suffix=".log")
    with open(descriptor, "w", encoding="utf-8", buffering=1) as stream:  # noqa: PTH123 - a descriptor
        configure_logging(LogSettings(format="json", level="info"), stream=stream)
        handler = logging.StreamHandler(stream)
        root = logging.getLogger()
        root.addHandler(handler)
        try:
            yield path
        finally:
            root.removeHandler(handler)


async def _demo(plan: Plan, console: Console) -> Outcome:
    from edgemon.daemon import Daemon  # noqa: PLC0415 - keeps the other commands light
    from edgemon.simulate import Simulation  # noqa: PLC0415
    from edgemon.simulate.publisher import publish_simulation, wall_ms  # noqa: PLC0415

    stop = asyncio.Event()
    async with embedded_broker("127.0.0.1", 0) as (host, port):
        settings = Settings(
            mqtt=MqttSettings(
                url=f"mqtt://{host}:{port}", client_id="edgemon-demo", persistent_session=False
            ),
            http=HttpSettings(listen=plan.listen),
            log=LogSettings(format="json", level="info"),
        )
        daemon = Daemon(settings, environ={}, install_signal_handlers=False, snapshots=False)
        daemon_task = asyncio.create_task(daemon.run(), name="daemon")
        daemon_task.add_done_callback(lambda _: stop.set())  # a failed daemon ends the demo
        started = time.monotonic()
        metrics_url = ""
        loop: dict[str, Score] = {}
        held_s = 0.0

        def on_signal() -> None:
            """The first signal ends the demo cleanly; a second one forces the daemon down."""
            if stop.is_set():
                daemon.request_stop()
                daemon.request_stop()
            stop.set()

        with on_stop_signals(on_signal):
            try:
                await _until_ready(daemon, daemon_task)
                metrics_url = _metrics_url(plan.listen, daemon.http_port)
                simulation = Simulation(
                    devices=len(plan.rtf),
                    streams=plan.streams,
                    rtf=plan.rtf,
                    stall_rate=plan.stall_rate,
                    seed=plan.seed,
                    start_ms=wall_ms(),
                )
                boxes = await asyncio.to_thread(
                    demo_loop.LoopBoxes, plan.loop, settings.mqtt.url, settings.mqtt.topic_prefix
                )
                started = time.monotonic()
                async with _showing(daemon, plan, console, metrics_url, started, boxes):
                    loop, _ = await asyncio.gather(
                        boxes.run(plan.duration_s, stop),
                        publish_simulation(
                            simulation,
                            hostname=host,
                            port=port,
                            duration_s=plan.duration_s,
                            stop=stop,
                            topic_prefix=settings.mqtt.topic_prefix,
                        ),
                    )
                    held_s = boxes.held_s()
                    await _drain(daemon.monitor, daemon_task)
            finally:
                daemon.request_stop()
                code = await daemon_task
        elapsed = time.monotonic() - started
    return _outcome(daemon.monitor, elapsed, metrics_url, code, loop, held_s)


async def _until_ready(daemon: Daemon, task: asyncio.Task[int]) -> None:
    ready = asyncio.ensure_future(daemon.ready.wait())
    try:
        done, _ = await asyncio.wait(
            (ready, task), timeout=READY_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        ready.cancel()
    if task in done:
        raise UsageError(f"the daemon did not start (exit {task.result()}); see its log")
    if ready not in done:
        raise UsageError(f"the daemon did not subscribe within {READY_TIMEOUT_S:.0f} s")


async def _drain(monitor: Monitor, daemon_task: asyncio.Task[int]) -> None:
    """Give the daemon a moment to apply the simulator's last `end` events."""
    deadline = time.monotonic() + DRAIN_S
    while time.monotonic() < deadline and not daemon_task.done():
        if not any(device.live_streams() for device in monitor.engine.devices()):
            return
        await asyncio.sleep(0.02)


def _metrics_url(listen: str, port: int | None) -> str:
    host, _ = parse_listen(listen)
    if host in {"0.0.0.0", ""}:  # noqa: S104 - the wildcard is reached on loopback
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/metrics"


def _totals(monitor: Monitor) -> dict[str, DeviceTotals]:
    return {
        device.id: DeviceTotals(device.stats.underruns, device.stats.throttle_engagements)
        for device in monitor.engine.devices()
    }


# ---------------------------------------------------------------------- the view
@contextlib.asynccontextmanager
async def _showing(
    daemon: Daemon,
    plan: Plan,
    console: Console,
    metrics_url: str,
    started: float,
    boxes: demo_loop.LoopBoxes,
) -> AsyncIterator[None]:
    """Show the daemon's state while the block runs: live in a terminal, else lines."""
    show = _live if console.is_terminal else _lines
    task = asyncio.create_task(
        show(daemon, plan, console, metrics_url, started, boxes), name="view"
    )
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _live(
    daemon: Daemon,
    plan: Plan,
    console: Console,
    metrics_url: str,
    started: float,
    boxes: demo_loop.LoopBoxes,
) -> None:
    """Frames built on the event loop (which owns the engine), drawn by rich's thread."""
    from edgemon.adapters.http import streams_view  # noqa: PLC0415 - aiohttp is loaded by now

    labels = {device: f"RTF {rtf:g}" for device, rtf in zip(plan.devices, plan.rtf, strict=True)}
    labels |= dict.fromkeys(demo_loop.DEVICES, plan.loop.profile.name)

    def frame(*, last: bool = False) -> Any:
        elapsed = time.monotonic() - started
        title = f"edgemon demo  {elapsed:4.0f} s of {plan.duration_s:g} s"
        status = f"metrics: {metrics_url}   " + ("stopped" if last else "Ctrl-C stops")
        return render_view(
            streams_view(daemon.monitor, daemon.clock.now_ms()),
            title=title,
            status=status,
            totals=_totals(daemon.monitor),
            labels=labels,
            max_streams=max(3, console.size.height - len(plan.rtf) - _FRAME_CHROME - 2),
            prefills=boxes.prefills(),
        )

    with Live(frame(), console=console, refresh_per_second=1 / FRAME_S) as live:
        try:
            while True:
                await asyncio.sleep(FRAME_S)
                live.update(frame())
        finally:
            live.update(frame(last=True), refresh=True)  # it stays on the screen


async def _lines(
    daemon: Daemon,
    plan: Plan,
    console: Console,
    metrics_url: str,
    started: float,
    boxes: demo_loop.LoopBoxes,
) -> None:
    """For pipes and CI: a status line every few seconds."""
    from edgemon.adapters.http import streams_view  # noqa: PLC0415

    del plan, console
    print(f"edgemon demo: metrics on {metrics_url}", flush=True)
    while True:
        await asyncio.sleep(LINE_EVERY_S)
        view = streams_view(daemon.monitor, daemon.clock.now_ms())
        line = status_line(view, totals=_totals(daemon.monitor), prefills=boxes.prefills())
        print(f"{time.monotonic() - started:5.1f}s  {line}", flush=True)


# ---------------------------------------------------------------------- summary
def _outcome(
    monitor: Monitor,
    elapsed_s: float,
    metrics_url: str,
    code: int,
    loop: dict[str, Score],
    held_s: float,
) -> Outcome:
    devices = sorted(monitor.engine.devices(), key=lambda device: device.id)
    return Outcome(
        elapsed_s=elapsed_s,
        metrics_url=metrics_url,
        exit_code=code,
        streams={d.id: d.stats.streams_started for d in devices},
        underruns={d.id: d.stats.underruns for d in devices},
        throttle_engagements={d.id: d.stats.throttle_engagements for d in devices},
        messages=monitor.messages,
        rejected=sum(n for result, n in monitor.results.items() if result not in APPLIED),
        loop=loop,
        held_s=held_s,
    )


def _print_summary(plan: Plan, outcome: Outcome, log_path: str) -> None:
    print(
        f"edgemon demo: {outcome.elapsed_s:.1f} s, seed {plan.seed}, "
        f"{sum(outcome.streams.values())} streams, {outcome.messages} messages"
    )
    print(f"  {'device':<10} {'rtf':>5} {'streams':>8} {'underruns':>10} {'throttled':>10}")
    for device, rtf in zip(plan.devices, plan.rtf, strict=True):
        print(
            f"  {device:<10} {rtf:>5g} {outcome.streams.get(device, 0):>8} "
            f"{outcome.underruns.get(device, 0):>10} "
            f"{outcome.throttle_engagements.get(device, 0):>9}×"
        )
    if outcome.loop:
        for line in demo_loop.summary_lines(plan.loop, outcome.loop, outcome.held_s):
            print(line)
    print(f"  rejected messages: {outcome.rejected}")
    print(f"  /metrics was served at {outcome.metrics_url} (it stopped with the demo)")
    print(f"  daemon log: {log_path}")
    summary = {
        "kind": "summary",
        "seed": plan.seed,
        "duration_s": round(outcome.elapsed_s, 3),
        "rtf": dict(zip(plan.devices, plan.rtf, strict=True)),
        "streams": sum(outcome.streams.values()),
        "streams_by_device": outcome.streams,
        "underruns": outcome.underruns,
        "throttle_engagements": outcome.throttle_engagements,
        "messages": outcome.messages,
        "rejected": outcome.rejected,
        "loop": demo_loop.summary_json(plan.loop, outcome.loop, outcome.held_s)
        if outcome.loop
        else None,
        "metrics_url": outcome.metrics_url,
        "log": log_path,
    }
    print(json.dumps(summary, separators=(",", ":")), flush=True)
