"""`edgemon check-config [PATH]`: validate a config and print the effective settings (README).

The one command that lists several errors: exit 2 with every problem on its own line.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from edgemon.cli.errors import EXIT_OK, EXIT_USAGE
from edgemon.settings import (
    DEFAULT_CONFIG_PATH,
    ConfigError,
    environment_warnings,
    load_settings,
    masked_dump,
    permission_warnings,
    resolve_config_path,
)

if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping

_PROG = "edgemon check-config"
_BARE_KEY = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
# Where the terminal cannot show them, these symbols fall back to ASCII.
_ASCII = str.maketrans({"≥": ">=", "≤": "<="})


def register(subparsers: argparse._SubParsersAction[Any], help_text: str) -> None:
    """Add `check-config` to the command line; `help_text` is its line in `edgemon --help`."""
    parser = subparsers.add_parser(
        "check-config",
        help=help_text,
        description="Validate a config file, apply EDGEMON_<SECTION>__<KEY> environment "
        "variables, and print the effective settings with secrets masked. Exit 0: valid; "
        "2: every problem is listed on stderr.",
    )
    parser.add_argument(
        "path",
        nargs="?",
        type=Path,
        metavar="PATH",
        help=f"the config file (default: {DEFAULT_CONFIG_PATH} if it exists, else defaults)",
    )
    parser.add_argument("--json", action="store_true", help="print the settings as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Check the settings `edgemon run --config PATH` would use; 0 if valid, else 2."""
    path: Path | None = args.path
    try:
        config_path = resolve_config_path(path)
        settings = load_settings(config_path, environ=os.environ)
    except ConfigError as exc:
        _write(sys.stderr, f"{_PROG}: {exc.headline}")
        for problem in exc.problems:
            _write(sys.stderr, f"  {problem}")
        return EXIT_USAGE
    data = masked_dump(settings)
    if args.json:
        _write(sys.stdout, json.dumps(data, indent=2, ensure_ascii=False))
    else:
        origin = str(config_path) if config_path is not None else "defaults (no config file)"
        _write(sys.stdout, f"# effective settings from {origin} and the environment")
        _write(sys.stdout, render_toml(data))
    for warning in permission_warnings(settings, config_path):
        _write(sys.stderr, f"{_PROG}: warning: {warning}")
    for warning in environment_warnings(os.environ):
        _write(sys.stderr, f"{_PROG}: warning: {warning}")
    return EXIT_OK


def render_toml(data: Mapping[str, Any]) -> str:
    """The settings as TOML; unset keys appear as comments so every key is visible."""
    lines: list[str] = []
    for section, table in data.items():
        if section != "devices":
            lines += ["", f"[{section}]", *_key_values(table)]
            continue
        if not table:
            lines += ["", "# no [devices.<id>] overrides"]
        for device, override in table.items():
            lines += ["", f"[devices.{_key(device)}]", *_key_values(override)]
    return "\n".join(lines).lstrip("\n")


def _key_values(table: Mapping[str, Any]) -> list[str]:
    return [
        f"# {_key(key)} is not set" if value is None else f"{_key(key)} = {_value(value)}"
        for key, value in table.items()
    ]


def _key(key: str) -> str:
    return key if key and set(key) <= _BARE_KEY else json.dumps(key, ensure_ascii=False)


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(value, ensure_ascii=False)


def _write(stream: TextIO, text: str) -> None:
    """One line, degraded to what the stream's encoding can show instead of failing."""
    encoding = stream.encoding or "utf-8"
    try:
        text.encode(encoding)
    except UnicodeEncodeError:
        text = text.translate(_ASCII).encode(encoding, "backslashreplace").decode(encoding)
    print(text, file=stream)
