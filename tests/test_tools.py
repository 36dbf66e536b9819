"""`require_tool`: a missing program skips a test locally and fails it in CI."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tools import REQUIRE_TOOLS_ENV, require_tool

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
