"""Entry point of the `edgemon` console script and of `python -m edgemon`.

The commands are imported when the parser is built, so that a client-only install (`pip
install --no-deps edgemon` next to paho-mqtt, for a player or a vLLM process) that runs a
bare `edgemon` gets one line saying the daemon's dependencies are missing, not a traceback.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, NoReturn

from edgemon import __version__
from edgemon.cli.errors import EXIT_FAILURE, EXIT_USAGE, UsageError

if TYPE_CHECKING:
    from collections.abc import Sequence


DESCRIPTION = """\
edgemon watches the playback of streaming text-to-speech on an edge box and
keeps the engine from causing gaps. Players report each audio chunk's arrival
over MQTT; the daemon (edgemon run) keeps every stream's playback slack,
publishes a throttle signal the engine obeys, and exports what listeners heard
as Prometheus metrics."""

EPILOG = """\
new here? `edgemon demo` runs the whole loop on this machine with nothing to
set up, and `edgemon COMMAND --help` lists a command's options.

exit codes: 0 success, 1 an unexpected error, 2 bad usage or input (one line
on stderr says which), 3 a negative answer (kv-budget: the sequences would be
preempted)."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The full command-line grammar, one subparser per command."""
    from edgemon.cli import (  # noqa: PLC0415 - see the module docstring
        check_config,
        kv_budget,
        replay,
        run,
        simulate,
        view_extra,
    )

    parser = _Parser(
        prog="edgemon",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"edgemon {__version__}")
    commands = parser.add_subparsers(
        title="commands", dest="command", required=True, parser_class=_Parser
    )
    run.register(commands)
    view_extra.register(commands, "demo", "zero set-up showcase with a live view")
    for module in (replay, kv_budget, check_config, simulate):
        module.register(commands)
    view_extra.register(commands, "top", "live terminal view of a running daemon")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit code (0 ok, 1 unexpected, 2 usage, 3 negative)."""
    try:
        parser = build_parser()
    except ModuleNotFoundError as exc:
        print(
            f"edgemon: the daemon's dependencies are missing (no module {exc.name!r}): this "
            "install has edgemon's client only (edgemon.client for players and engines). "
            "For the command, install edgemon with its dependencies: pip install edgemon",
            file=sys.stderr,
        )
        return EXIT_USAGE
    args = parser.parse_args(argv)
    try:
        code: int = args.handler(args)
    except UsageError as exc:
        print(f"edgemon {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`); that is not our failure.
        sys.stderr.close()
        return 0
    except Exception as exc:  # noqa: BLE001 - the last line of defence prints one line, exit 1
        print(f"edgemon {args.command}: unexpected error: {exc!r}", file=sys.stderr)
        return EXIT_FAILURE
    return code
