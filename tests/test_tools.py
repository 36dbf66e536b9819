"""`require_tool` and `import_or_skip`: a missing program or package skips a test locally and
fails it in CI."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tools import REQUIRE_MODULES_ENV, REQUIRE_TOOLS_ENV, require_tool, required_import_failed

MISSING = "edgemon-no-such-program"


def test_a_missing_program_skips_the_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the variable a missing program is a skip, naming the program."""
    monkeypatch.delenv(REQUIRE_TOOLS_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match=MISSING):
        require_tool(MISSING)


@pytest.mark.parametrize("value", ["0", ""])
def test_zero_or_empty_still_skips(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """`EDGEMON_REQUIRE_TOOLS=0` (or empty) is the local default: skip."""
    monkeypatch.setenv(REQUIRE_TOOLS_ENV, value)
    with pytest.raises(pytest.skip.Exception):
        require_tool(MISSING)


def test_in_ci_a_missing_program_fails_the_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """With `EDGEMON_REQUIRE_TOOLS=1` (`.ci/run`) the same is a failure."""
    monkeypatch.setenv(REQUIRE_TOOLS_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=MISSING):
        require_tool(MISSING)


def test_an_installed_program_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """A program on PATH gives its path."""
    monkeypatch.setenv(REQUIRE_TOOLS_ENV, "1")
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    name = Path(sys.executable).name
    assert require_tool(name) == sys.executable


SKIPPED = "could not import 'vllm_omni.core.sched.omni_ar_scheduler': No module named 'vllm_omni'"


def test_an_import_skip_of_a_required_package_is_a_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A module skipped because a package `EDGEMON_REQUIRE_MODULES` names does not import
    (`make test-vllm`'s vLLM-Omni run) is a failure naming the module and the package."""
    monkeypatch.setenv(REQUIRE_MODULES_ENV, "vllm, vllm_omni")
    why = required_import_failed(SKIPPED)
    assert why is not None
    assert "vllm_omni.core.sched.omni_ar_scheduler" in why
    assert why.endswith(f"({REQUIRE_MODULES_ENV} requires vllm_omni)")


@pytest.mark.parametrize(
    ("required", "reason"),
    [
        ("", SKIPPED),
        ("vllm", SKIPPED),  # vllm_omni is another package
        ("vllm_omni", "vLLM 0.30 has no kv_holding_waiting"),  # not an import skip
    ],
    ids=["nothing-required", "another-package", "not-an-import"],
)
def test_other_skips_stay_skips(
    monkeypatch: pytest.MonkeyPatch, required: str, reason: str
) -> None:
    """Without the variable, for a package it does not name, or for a skip that is not an
    import's, nothing changes."""
    monkeypatch.setenv(REQUIRE_MODULES_ENV, required)
    assert required_import_failed(reason) is None
