"""The package's declared dependencies are all the commands need: with every installed module
outside `pip install edgemon`'s dependency closure made unimportable (aiomqtt, the test tools,
the extras), each command still starts and each module outside the extras imports.

This is what a fresh machine has: CI failed once because `edgemon run` in the vLLM tier's
environment (edgemon's dependencies only) reached an `import aiomqtt` that the test
environment happened to satisfy."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: Run in a fresh interpreter: hide what the closure does not hold, then import and start.
SCRIPT = r"""
import importlib, importlib.abc, importlib.metadata as md, json, pkgutil, sys
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

def closure(name, seen):
    name = canonicalize_name(name)
    if name in seen:
        return seen
    seen.add(name)
    for line in md.requires(name) or ():
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            closure(requirement.name, seen)
    return seen

allowed = closure("edgemon", set())
hidden = {
    top for top, owners in md.packages_distributions().items()
    if not {canonicalize_name(owner) for owner in owners} & allowed
}

class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] in hidden:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Hide())
import edgemon
failed = {}
for module in pkgutil.walk_packages(edgemon.__path__, "edgemon."):
    if module.name.endswith("__main__"):
        continue
    try:
        importlib.import_module(module.name)
    except ModuleNotFoundError as exc:
        failed[module.name] = exc.name
from edgemon.cli.main import main
codes = {}
for command in ("run", "replay", "kv-budget", "check-config", "simulate"):
    try:
        codes[command] = main([command, "--help"])
    except SystemExit as exc:
        codes[command] = exc.code
print(json.dumps({"hidden": sorted(hidden), "failed": failed, "codes": codes}))
"""

#: Modules that need an extra (or the engine they plug into), and what they need.
EXTRAS = {
    "edgemon.cli.demo": "rich",
    "edgemon.cli.top": "rich",
    "edgemon.view": "rich",
    "edgemon.integrations.vllm": "vllm",
    "edgemon.integrations._vllm_report": "vllm",
    "edgemon.integrations.vllm_realtime": "vllm",
    "edgemon.integrations.vllm_omni": "vllm_omni",
    "edgemon.integrations.vllm_omni_realtime": "vllm_omni",
}


@pytest.mark.integration  # starts an interpreter
def test_the_declared_dependencies_are_all_the_commands_need() -> None:
    """In a process that cannot import aiomqtt, rich, amqtt, pytest or anything else outside
    edgemon's dependency closure: every module imports except the extras' own (each failing
    on its extra's module), and `--help` of every daemon-side command exits 0."""
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.splitlines()[-1])
    assert {"aiomqtt", "rich", "pytest"} <= set(found["hidden"])
    assert found["codes"] == dict.fromkeys(
        ("run", "replay", "kv-budget", "check-config", "simulate"), 0
    )
    assert {name: need.partition(".")[0] for name, need in found["failed"].items()} == EXTRAS
