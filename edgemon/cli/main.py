"""Entry point of the `edgemon` console script and of `python -m edgemon`.

The commands are imported when the parser is built, so that a client-only install (`pip
install --no-deps edgemon` next to paho-mqtt, for a player or a vLLM process) that runs a
bare `edgemon` gets one line saying the daemon's dependencies are missing, not a traceback.
Only the command that runs is imported (`edgemon kv-budget` loads neither the daemon's
settings nor its HTTP stack); the others are a line each in `edgemon --help`.
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


#: Each command and its line in `edgemon --help`, in order; its module under `edgemon.cli` is
#: its name with `_` for `-`.
COMMANDS: dict[str, str] = {
    "run": "the daemon: players' reports in, throttle signals and /metrics out",
    "demo": "zero set-up showcase: broker, simulated devices and the daemon in one process",
    "replay": "run a recorded trace through the engine on a virtual clock",
    "kv-budget": "check that the KV cache holds max_num_seqs full-length sequences",
    "check-config": "validate a config file and print the effective settings",
    "simulate": "synthetic TTS devices publishing to a broker (load generator)",
    "top": "live terminal view of a running daemon",
}
#: The commands that need the optional `rich` (see `view_extra`).
VIEWS = frozenset({"demo", "top"})


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command-line grammar, one subparser per command: in full for `command` (every
    command when None), a line of help for each other one."""
    import importlib  # noqa: PLC0415 - see the module docstring

    from edgemon.cli import view_extra  # noqa: PLC0415

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
    for name, help_text in COMMANDS.items():
        if command not in (None, name):
            commands.add_parser(name, help=help_text)
        elif name in VIEWS:
            view_extra.register(commands, name, help_text)
        else:
            module = importlib.import_module(f"edgemon.cli.{name.replace('-', '_')}")
            module.register(commands, help_text)
    return parser


def _command(argv: Sequence[str]) -> str | None:
    """The command `argv` names, or None (no command yet, an option first, or an unknown name:
    the full grammar then says what is wrong)."""
    return argv[0] if argv and argv[0] in COMMANDS else None


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit code (0 ok, 1 unexpected, 2 usage, 3 negative)."""
    arguments = sys.argv[1:] if argv is None else list(argv)
    try:
        parser = build_parser(_command(arguments))
    except ModuleNotFoundError as exc:
        print(
            f"edgemon: the daemon's dependencies are missing (no module {exc.name!r}): this "
            "install has edgemon's client only (edgemon.client for players and engines). "
            "For the command, install edgemon with its dependencies: pip install edgemon",
            file=sys.stderr,
        )
        return EXIT_USAGE
    args = parser.parse_args(arguments)
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
