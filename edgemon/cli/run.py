"""`edgemon run`: the daemon (README, "`edgemon run`: the daemon"), on a broker or on an
embedded one. A bad flag is blamed on the flag, not on the config file."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import structlog

from edgemon.cli.errors import UsageError
from edgemon.settings import (
    ConfigError,
    environment_warnings,
    load_settings,
    permission_warnings,
    resolve_config_path,
)

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Mapping

    from edgemon.settings import Settings


def register(commands: argparse._SubParsersAction[Any], help_text: str) -> None:
    """Add `run` to the command line; `help_text` is its line in `edgemon --help`."""
    parser = commands.add_parser(
        "run",
        help=help_text,
        description="Listen to devices over MQTT, publish throttle signals, serve /metrics. "
        "SIGTERM/SIGINT stop it cleanly; SIGHUP reloads the config file.",
    )
    parser.add_argument(
        "--config",
        type=Path,
        help="config file (default: /etc/edgemon/edgemon.toml if it exists, else defaults)",
    )
    parser.add_argument(
        "--broker",
        metavar="URL",
        help="mqtt://host[:port], mqtts://host[:port] or embedded (a broker on 127.0.0.1:1883)",
    )
    parser.add_argument("--listen", metavar="HOST:PORT", help="HTTP address for /metrics")
    parser.add_argument(
        "--record", type=Path, metavar="FILE", help="append every received message to FILE"
    )
    parser.set_defaults(handler=run)


def flag_overrides(args: argparse.Namespace) -> dict[str, dict[str, object]]:
    """The settings the flags set, by section."""
    overrides: dict[str, dict[str, object]] = {}
    if args.broker is not None:
        overrides.setdefault("mqtt", {})["url"] = args.broker
    if args.listen is not None:
        overrides.setdefault("http", {})["listen"] = args.listen
    return overrides


#: The setting each flag sets: a problem with it is the flag's.
_FLAG_KEYS = {"mqtt.url": ("--broker", "broker"), "http.listen": ("--listen", "listen")}


def blame_flags(exc: ConfigError, args: argparse.Namespace) -> str:
    """The one-line message for `exc`: problems of a setting a flag gave name the flag and its
    value; the others are the settings' (file or environment), as they came."""
    own: list[str] = []
    others: list[str] = []
    for problem in exc.problems:
        key, _, detail = problem.partition(": ")
        flag = _FLAG_KEYS.get(key)
        value = None if flag is None else getattr(args, flag[1], None)
        if flag is not None and value is not None:
            own.append(f"{flag[0]} {value}: {detail}")
        else:
            others.append(problem)
    if not own:
        return f"{exc.headline}: {'; '.join(exc.problems)}"
    if not others:
        return "; ".join(own)
    count = len(others)
    return (
        f"{'; '.join(own)}; and {count} problem{'s' if count > 1 else ''} in {exc.source}: "
        f"{'; '.join(others)}"
    )


def run(args: argparse.Namespace) -> int:
    """Load the settings, then run the daemon until it is stopped."""
    environ = dict(os.environ)
    overrides = flag_overrides(args)

    def load() -> Settings:
        return load_settings(args.config, overrides=overrides, environ=environ)

    try:
        settings = load()
    except ConfigError as exc:
        raise UsageError(blame_flags(exc, args)) from None
    from edgemon.daemon.logs import configure_logging  # noqa: PLC0415 - only the daemon needs it

    configure_logging(settings.log)
    log = structlog.get_logger("edgemon")
    for warning in permission_warnings(settings, resolve_config_path(args.config)):
        log.warning("insecure_permissions", problem=warning)
    for warning in environment_warnings(environ):
        log.warning("unknown_environment_variable", problem=warning)
    with contextlib.ExitStack() as stack:
        record = None
        if args.record is not None:
            record = stack.enter_context(_open_record(args.record))
        return asyncio.run(serve(settings, environ=environ, reload=load, record=record))


async def serve(
    settings: Settings,
    *,
    environ: Mapping[str, str],
    reload: Callable[[], Settings] | None = None,
    record: TextIO | None = None,
) -> int:
    """The daemon, with the embedded broker around it when `mqtt.url` is `embedded`."""
    from edgemon.daemon import Daemon  # noqa: PLC0415 - keeps the other commands light

    async with contextlib.AsyncExitStack() as stack:
        broker = settings.mqtt.broker
        if broker.embedded:
            from edgemon.broker.embedded import (  # noqa: PLC0415 - optional extra
                EmbeddedBrokerError,
                embedded_broker,
            )

            try:
                await stack.enter_async_context(embedded_broker(broker.host, broker.port))
            except EmbeddedBrokerError as exc:
                raise UsageError(str(exc)) from None
        daemon = Daemon(settings, environ=environ, reload=reload, record=record)
        return await daemon.run()
    return 1  # pragma: no cover - unreachable; mypy cannot see that the block returns


def _open_record(path: Path) -> TextIO:
    try:
        return path.open("a", encoding="utf-8", buffering=1)
    except OSError as exc:
        raise UsageError(f"--record {path}: {exc.strerror}") from None
