"""`edgemon simulate --broker URL`: synthetic TTS devices publishing to a broker (load generator).

Prints one JSON summary line on stdout at the end. SIGINT or SIGTERM stops the run cleanly
(open streams are ended as cancelled) like the end of `--duration`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import sys
from typing import TYPE_CHECKING, Any

from edgemon.broker import EmbeddedBrokerError, embedded_broker
from edgemon.broker_url import EMBEDDED, BrokerUrlError, parse_broker_url
from edgemon.cli.errors import EXIT_FAILURE, EXIT_OK, UsageError
from edgemon.cli.signals import on_stop_signals
from edgemon.protocol import topic_prefix_problem
from edgemon.simulate.model import Simulation
from edgemon.simulate.publisher import PublishError, publish_simulation, wall_ms
from edgemon.wire.topics import valid_device_id

if TYPE_CHECKING:
    import argparse
    from collections.abc import AsyncIterator

    from edgemon.simulate.publisher import PublishReport

EMBEDDED_ADDRESS = ("127.0.0.1", 1883)
MAX_DEVICES = 1_000
MAX_STREAMS = 256


def register(commands: argparse._SubParsersAction[Any], help_text: str) -> None:
    """Add `simulate` to the command line; `help_text` is its line in `edgemon --help`."""
    parser = commands.add_parser(
        "simulate",
        help=help_text,
        description="Simulated TTS devices: streams with a short first chunk (80 ms) then 2 s "
        "chunks generated at a real-time factor, random stalls, some cancellations. Events go "
        "to P/<device>/events (QoS 1), the engine object retained to P/<device>/engine. "
        "Prints a JSON summary at the end.",
    )
    parser.add_argument("--broker", required=True, metavar="URL",
                        help="mqtt://host[:port], or `embedded` to host a broker on "
                        "127.0.0.1:1883 in this process")  # fmt: skip
    parser.add_argument("--devices", type=int, default=2, help="devices (default 2)")
    parser.add_argument("--streams", type=int, default=4,
                        help="concurrent streams per device (default 4)")  # fmt: skip
    parser.add_argument("--rtf", default="0.1", metavar="X[,X...]",
                        help="real-time factor of generation, one value or one per device "
                        "(default 0.1; ≥ 1 underruns)")  # fmt: skip
    parser.add_argument("--stall-rate", type=float, default=0.0, metavar="P",
                        help="probability per chunk of a 0.5–3 s stall (default 0)")  # fmt: skip
    parser.add_argument("--duration", type=float, metavar="S",
                        help="seconds to run (default: until interrupted)")  # fmt: skip
    parser.add_argument("--seed", type=int, help="random seed (default: a random one)")
    parser.add_argument("--topic-prefix", default="edgemon/v1", metavar="P")
    parser.add_argument("--device-prefix", default="sim", metavar="NAME",
                        help="devices are NAME-0, NAME-1, … (default sim)")  # fmt: skip
    parser.add_argument("--batch", action="store_true",
                        help="send a device's events due together as one array")  # fmt: skip
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Validate the flags, then publish until the duration is over or a signal arrives."""
    address = parse_broker(args.broker)
    if not 1 <= args.devices <= MAX_DEVICES:
        raise UsageError(f"--devices must be between 1 and {MAX_DEVICES}")
    if not 1 <= args.streams <= MAX_STREAMS:
        raise UsageError(f"--streams must be between 1 and {MAX_STREAMS}")
    rtf = _rtf(args.rtf, args.devices)
    if not 0.0 <= args.stall_rate <= 1.0:
        raise UsageError("--stall-rate must be between 0 and 1")
    if args.duration is not None and not (math.isfinite(args.duration) and args.duration > 0):
        raise UsageError("--duration must be a number of seconds > 0")
    if not valid_device_id(f"{args.device_prefix}-{args.devices - 1}"):
        raise UsageError("--device-prefix must be letters, digits, '.', '_' or '-'")
    problem = topic_prefix_problem(args.topic_prefix)
    if problem is not None:
        raise UsageError(f"--topic-prefix {args.topic_prefix!r} {problem}")
    seed = random.SystemRandom().randrange(2**32) if args.seed is None else args.seed
    try:
        report = asyncio.run(_main(args, address, rtf, seed))
    except EmbeddedBrokerError as exc:
        raise UsageError(str(exc)) from None
    except PublishError as exc:
        host, port = address or EMBEDDED_ADDRESS
        print(f"edgemon simulate: broker {host}:{port}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    summary = {"seed": seed, "devices": args.devices, "rtf": rtf}
    summary.update(
        messages=report.messages,
        events=report.events,
        streams=report.streams,
        chunks=report.chunks,
        audio_s=round(report.audio_ms / 1000.0, 3),
        completed=report.completed,
        cancelled=report.cancelled,
    )
    print(json.dumps(summary, separators=(",", ":")))
    return EXIT_OK


def parse_broker(url: str) -> tuple[str, int] | None:
    """`(host, port)` of an `mqtt://host[:port]` URL; None for `embedded`. The URL rules
    are the daemon's (`edgemon.broker_url`); the simulator speaks no TLS."""
    try:
        broker = parse_broker_url(url, url_credentials=False, embedded=True)
    except BrokerUrlError as exc:
        raise UsageError(f"--broker {url!r}: {exc.reason}") from None
    if broker.tls:
        raise UsageError(f"--broker {url!r}: only mqtt://host[:port] or {EMBEDDED} (no TLS)")
    return None if broker.embedded else (broker.host, broker.port)


def _rtf(text: str, devices: int) -> float | list[float]:
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        raise UsageError(f"--rtf {text!r}: expected a number or one per device") from None
    if not all(math.isfinite(x) and x > 0 for x in values):
        raise UsageError("--rtf values must be numbers > 0")
    if len(values) == 1:
        return values[0]
    if len(values) != devices:
        raise UsageError(f"--rtf has {len(values)} values for {devices} devices")
    return values


async def _main(
    args: argparse.Namespace, address: tuple[str, int] | None, rtf: float | list[float], seed: int
) -> PublishReport:
    stop = asyncio.Event()
    async with _broker(address) as (host, port):
        with on_stop_signals(stop.set):
            simulation = Simulation(
                devices=args.devices,
                streams=args.streams,
                rtf=rtf,
                stall_rate=args.stall_rate,
                seed=seed,
                start_ms=wall_ms(),
                device_prefix=args.device_prefix,
            )
            return await publish_simulation(
                simulation,
                hostname=host,
                port=port,
                duration_s=args.duration,
                stop=stop,
                topic_prefix=args.topic_prefix,
                batch=args.batch,
            )


@contextlib.asynccontextmanager
async def _broker(address: tuple[str, int] | None) -> AsyncIterator[tuple[str, int]]:
    if address is not None:
        yield address
        return
    async with embedded_broker(*EMBEDDED_ADDRESS) as bound:
        print(f"edgemon simulate: embedded broker on {bound[0]}:{bound[1]}", file=sys.stderr)
        yield bound
