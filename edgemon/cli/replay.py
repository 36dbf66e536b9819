"""`edgemon replay TRACE`: a recorded trace through the engine; JSON lines on stdout."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgemon.cli.errors import EXIT_OK, UsageError
from edgemon.replay import replay
from edgemon.settings import ConfigError, load_settings
from edgemon.trace import TraceError, read_trace

if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterator


def register(commands: argparse._SubParsersAction[Any], help_text: str) -> None:
    """Add `replay` to the command line; `help_text` is its line in `edgemon --help`."""
    parser = commands.add_parser(
        "replay",
        help=help_text,
        description="Replay a trace (JSON lines, as `run --record` writes) through the engine. "
        "Prints JSON lines: samples, underruns, throttle changes, stream ends, rejections, "
        "and a summary last.",
    )
    parser.add_argument("trace", type=Path, help="trace file, or - for standard input")
    parser.add_argument("--config", type=Path, help="config file whose [slack], [limits] and "
                        "[devices] apply (default: /etc/edgemon/edgemon.toml if it exists, as "
                        "for run; EDGEMON_<SECTION>__<KEY> variables apply too)")  # fmt: skip
    parser.add_argument("--player", choices=("conceal", "rebuffer"))
    parser.add_argument("--margin-ms", type=float, help="default safety margin")
    parser.add_argument("--hysteresis-ms", type=float)
    parser.add_argument("--min-on-ms", type=float)
    parser.add_argument(
        "--sample-ms", type=float, default=100.0, help="sample every live stream this often "
        "(device clock; 0 for no samples; default 100)"
    )  # fmt: skip
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Replay the trace and print one JSON object per line."""
    if not (args.sample_ms == 0 or 1 <= args.sample_ms <= 3_600_000):
        raise UsageError("--sample-ms must be 0 (no samples) or from 1 to 3600000")
    flags = {
        key: value
        for key, value in (
            ("player", args.player),
            ("default_margin_ms", args.margin_ms),
            ("hysteresis_ms", args.hysteresis_ms),
            ("min_on_ms", args.min_on_ms),
        )
        if value is not None
    }
    try:
        # The settings `run` would use (file, then environment), then the flags.
        settings = load_settings(args.config, overrides={"slack": flags}, environ=os.environ)
    except ConfigError as exc:
        raise UsageError("; ".join(exc.problems)) from None
    write = sys.stdout.write
    try:
        for line in replay(
            _records(args.trace), settings.engine_config(), sample_ms=args.sample_ms
        ):
            write(json.dumps(line, separators=(",", ":"), allow_nan=False) + "\n")
    except TraceError as exc:
        sys.stdout.flush()
        raise UsageError(str(exc)) from None
    return EXIT_OK


def _records(path: Path) -> Iterator[Any]:
    name = "<stdin>" if str(path) == "-" else str(path)
    try:
        if str(path) == "-":
            # The bytes, not the locale's reading of them: a trace is UTF-8 wherever it comes from.
            stdin = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="strict")
            yield from read_trace(stdin, name=name)
            return
        with path.open(encoding="utf-8", errors="strict") as file:
            yield from read_trace(file, name=name)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"{name}: not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror}") from None
