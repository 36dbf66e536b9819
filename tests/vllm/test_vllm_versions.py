"""The vLLM this tier runs is a version edgemon claims (`edgemon.integrations._versions`): the
claim is tested in CI, and a scheduler built on it warns of nothing (vLLM-Omni's versions:
`test_vllm_omni.py`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("vllm.v1.core.sched.scheduler", exc_type=ImportError)

import vllm

from edgemon.integrations._versions import untested

from harness import build_scheduler, talker_classes

if TYPE_CHECKING:
    from pathlib import Path


def test_the_engines_here_are_tested_versions() -> None:
    """The vLLM installed here is in a claimed series: if CI installs another, this fails."""
    assert untested("vLLM", vllm.__version__) is None


@pytest.mark.parametrize("cls", talker_classes(), ids=lambda cls: cls.__name__)
def test_a_scheduler_on_a_tested_version_warns_of_nothing(
    tiny_model: Path, cls: type[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Building edgemon's scheduler here logs no warning of edgemon's."""
    with caplog.at_level(logging.WARNING, logger="edgemon.integrations"):
        build_scheduler(cls, tiny_model)
    assert [r.getMessage() for r in caplog.records if r.name == "edgemon.integrations"] == []
