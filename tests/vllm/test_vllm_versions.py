"""The versions this tier runs are the ones edgemon claims (`edgemon.integrations._versions`):
the claim is tested in CI, and a scheduler built on them warns of nothing."""

from __future__ import annotations

import logging
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("vllm.v1.core.sched.scheduler", exc_type=ImportError)

import vllm

from edgemon.integrations._versions import untested

from harness import build_scheduler, talker_classes

if TYPE_CHECKING:
    from pathlib import Path


def test_the_engines_here_are_tested_versions() -> None:
    """The vLLM installed here, and vLLM-Omni where it is (`.venv-omni`), are in a claimed
    series: if CI installs another, this fails."""
    assert untested("vLLM", vllm.__version__) is None
    if find_spec("vllm_omni") is not None:
        import vllm_omni  # noqa: PLC0415

        assert untested("vLLM-Omni", vllm_omni.__version__) is None


@pytest.mark.parametrize("cls", talker_classes(), ids=lambda cls: cls.__name__)
def test_a_scheduler_on_a_tested_version_warns_of_nothing(
    tiny_model: Path, cls: type[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Building edgemon's scheduler here logs no warning of edgemon's."""
    with caplog.at_level(logging.WARNING, logger="edgemon.integrations"):
        build_scheduler(cls, tiny_model)
    assert [r.getMessage() for r in caplog.records if r.name == "edgemon.integrations"] == []
