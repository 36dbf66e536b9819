"""The external programs tests run, found once: `require_tool(name)` gives a program's path,
or skips the test when it is not installed — unless `EDGEMON_REQUIRE_TOOLS=1` is set (as
`.ci/run` does), where a missing program fails the test, so that a green CI run cannot quietly
have skipped every daemon test. `EDGEMON_REQUIRE_MODULES` does the same for the Python packages
a tier exists to test (vLLM, vLLM-Omni; `make test-vllm` sets it per venv): a test module that
skips because one of them does not import fails instead (`required_import_failed`, applied by
tests/vllm/conftest.py), so a broken venv cannot pass as skips."""

from __future__ import annotations

import os
import re
import shutil

import pytest

#: Set to 1 (CI) to make a missing program a failure instead of a skip.
REQUIRE_TOOLS_ENV = "EDGEMON_REQUIRE_TOOLS"
#: The top-level packages (comma-separated) that must import: a test module skipped because
#: one does not fails instead.
REQUIRE_MODULES_ENV = "EDGEMON_REQUIRE_MODULES"

#: Where Debian installs each program when it is not on PATH, and its Debian package.
_KNOWN: dict[str, tuple[str, str]] = {
    "mosquitto": ("/usr/sbin/mosquitto", "mosquitto"),
    "mosquitto_passwd": ("/usr/bin/mosquitto_passwd", "mosquitto"),
    "prometheus": ("/usr/bin/prometheus", "prometheus"),
    "promtool": ("/usr/bin/promtool", "prometheus"),
    "victoria-metrics": ("/usr/bin/victoria-metrics", "victoria-metrics"),
    "vmagent": ("/usr/bin/vmagent", "victoria-metrics"),
    "vmalert": ("/usr/bin/vmalert", "victoria-metrics"),
    "prometheus-alertmanager": ("/usr/bin/prometheus-alertmanager", "prometheus-alertmanager"),
    "amtool": ("/usr/bin/amtool", "prometheus-alertmanager"),
    "shellcheck": ("/usr/bin/shellcheck", "shellcheck"),
    "openssl": ("/usr/bin/openssl", "openssl"),
    "node": ("/usr/bin/node", "nodejs"),
}


def tool_path(name: str) -> str:
    """Where `name` is (on PATH, else where Debian puts it); it may not exist."""
    default = _KNOWN.get(name, (f"/usr/bin/{name}", name))[0]
    return shutil.which(name) or default


def tools_required() -> bool:
    """Whether a missing program fails the test (`EDGEMON_REQUIRE_TOOLS=1`)."""
    return os.environ.get(REQUIRE_TOOLS_ENV, "") not in ("", "0")


def require_tool(*names: str) -> str:
    """The path of the first of `names` after making sure every one is installed; else skip
    the test, or fail it when `EDGEMON_REQUIRE_TOOLS=1`."""
    missing = [name for name in names if not os.access(tool_path(name), os.X_OK)]
    if missing:
        packages = sorted({_KNOWN.get(name, (name, name))[1] for name in missing})
        message = f"not installed: {', '.join(missing)} (Debian: {', '.join(packages)})"
        if tools_required():
            pytest.fail(f"{message}; {REQUIRE_TOOLS_ENV}=1 makes this a failure")
        pytest.skip(message)
    return tool_path(names[0])


def modules_required() -> frozenset[str]:
    """The packages `EDGEMON_REQUIRE_MODULES` names."""
    names = os.environ.get(REQUIRE_MODULES_ENV, "").split(",")
    return frozenset(name.strip() for name in names if name.strip())


def required_import_failed(skip_reason: str) -> str | None:
    """If `skip_reason` is `pytest.importorskip`'s for a module of a package that
    `EDGEMON_REQUIRE_MODULES` names, why that is a failure; else None (a skip it may be)."""
    match = re.search(r"could not import '([\w.]+)'", skip_reason)
    if match is None:
        return None
    package = match[1].partition(".")[0]
    if package not in modules_required():
        return None
    return f"{skip_reason.strip()} ({REQUIRE_MODULES_ENV} requires {package})"
