"""The engine versions edgemon's schedulers are tested with: anything else gets one warning
at start-up, never a crash."""

from __future__ import annotations

import logging

import pytest

from edgemon.integrations._versions import TESTED, check_version, untested


@pytest.mark.parametrize(
    ("engine", "version"),
    [
        ("vLLM", "0.32.0"),
        ("vLLM", "0.32.4+cpu"),
        ("vLLM-Omni", "0.30.0"),
        ("vLLM under vLLM-Omni", "0.30.1"),
    ],
)
def test_the_tested_series_pass(engine: str, version: str) -> None:
    """Every patch release and local build of a tested minor series is tested."""
    assert untested(engine, version) is None


@pytest.mark.parametrize(
    ("engine", "version"),
    [
        ("vLLM", "0.31.0"),
        ("vLLM", "0.30.0"),
        ("vLLM under vLLM-Omni", "0.32.0"),
        ("vLLM", "0.33.0rc1"),
        ("vLLM", "1.0.0"),
        ("vLLM", "dev"),
        ("vLLM-Omni", "0.32.0"),
    ],
)
def test_anything_else_is_named_with_the_tested_series(engine: str, version: str) -> None:
    """An untested version (0.31, never run in CI, included) is named beside the tested ones."""
    series = ", ".join(f"{a}.{b}" for a, b in TESTED[engine])
    assert untested(engine, version) == (
        f"edgemon: {engine} {version} is not a version edgemon's scheduler is tested with "
        f"({series}); it runs, and a failure in edgemon's part of a step leaves the step to "
        f"{engine} (counted in edgemon_stats.errors, logged once)"
    )


def test_an_untested_version_warns_once_per_process(caplog: pytest.LogCaptureFixture) -> None:
    """Many schedulers built in one process (vLLM-Omni builds one per stage) warn once."""
    with caplog.at_level(logging.WARNING, logger="edgemon.integrations"):
        assert [check_version("vLLM", "0.29.7") for _ in range(3)] == [False, False, False]
        assert check_version("vLLM", "0.32.1") is True
        assert check_version("vLLM-Omni", "0.29.7") is False
    assert [r.getMessage().split(" is not ")[0] for r in caplog.records] == [
        "edgemon: vLLM 0.29.7",
        "edgemon: vLLM-Omni 0.29.7",
    ]
