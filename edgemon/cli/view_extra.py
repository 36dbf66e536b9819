"""`demo` and `top` need `rich`, an optional dependency (the `view` extra).

The daemon on a box installs without it. There the two commands still exist on the command
line, and say in one line what to install (exit code 2) instead of failing at import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

from edgemon.cli.errors import UsageError

if TYPE_CHECKING:
    import argparse
    from types import ModuleType

MISSING = "needs the 'view' extra (rich): pip install 'edgemon[view]'"


def register(commands: argparse._SubParsersAction[Any], name: str, help_text: str) -> None:
    """Add `edgemon.cli.<name>`'s command, or a stand-in saying `MISSING` without `rich`."""
    module = load(name)
    if module is None:
        register_missing(commands, name, help_text)
    else:
        module.register(commands, help_text)


def load(name: str) -> ModuleType | None:
    """`edgemon.cli.<name>`, or None when `rich` is not installed."""
    import importlib  # noqa: PLC0415 - only here, so a missing rich is one caught error

    try:
        return importlib.import_module(f"edgemon.cli.{name}")
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.partition(".")[0] != "rich":
            raise
        return None


def register_missing(commands: argparse._SubParsersAction[Any], name: str, help_text: str) -> None:
    """Add command `name` that takes any arguments and fails with `MISSING`."""
    # No option prefix: every argument, `--flags` included, is taken as it comes.
    parser = commands.add_parser(
        name, help=f"{help_text} ({MISSING})", add_help=False, prefix_chars="\0"
    )
    parser.add_argument("rest", nargs="*")
    parser.set_defaults(handler=_missing)


def _missing(_args: argparse.Namespace) -> NoReturn:
    raise UsageError(MISSING)
