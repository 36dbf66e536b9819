"""tests/skip_check.py: CI prints every skipped test and fails on one the allow-list does not
name for its run; expected failures are not skips."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from skip_check import Allowed, Skip, check, main, read_allowed, read_skips

if TYPE_CHECKING:
    from pathlib import Path

#: A run's JUnit XML as pytest writes it: a module skipped at collection, a skipped test, an
#: expected failure and a test that passed.
REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites name="pytest tests"><testsuite name="pytest" skipped="3" tests="4">
<testcase classname="" name="tests.vllm.test_vllm_gate" time="0.000">
<skipped message="collection skipped">('tests/vllm/test_vllm_gate.py', 9, "Skipped: could
not import 'vllm.v1.core.sched.scheduler'")</skipped></testcase>
<testcase classname="tests.test_wal" name="test_state_dir[a]" time="0.001">
<skipped type="pytest.skip" message="/var/lib/edgemon exists here">tests/test_wal.py:124:
/var/lib/edgemon exists here</skipped></testcase>
<testcase classname="tests.test_broker" name="test_retained" time="0.1">
<skipped type="pytest.xfail" message="amqtt delivers retained to all" /></testcase>
<testcase classname="tests.test_tools" name="test_found" time="0.001" />
</testsuite></testsuites>
"""

ALLOWED = """
# run  test                 why
unit   tests.vllm           vLLM does not import in the project's venv
omni   tests.test_wal       another run
"""


def test_every_skip_is_read_with_its_reason_and_no_xfail() -> None:
    """A collection skip is named by its module, a test by module and name; an xfail is not
    a skip."""
    skips = read_skips("unit", REPORT)
    assert [skip.test for skip in skips] == [
        "tests.vllm.test_vllm_gate",
        "tests.test_wal.test_state_dir[a]",
    ]
    assert "could not import 'vllm.v1.core.sched.scheduler'" in skips[0].reason
    assert skips[1].reason.endswith("/var/lib/edgemon exists here")


def test_a_skip_off_the_allow_list_is_refused_and_all_are_printed() -> None:
    """The module under an allowed package passes; the other run's entry does not cover the
    unit run; each skip is one printed line."""
    lines, refused = check(read_allowed(ALLOWED), read_skips("unit", REPORT))
    assert [skip.test for skip in refused] == ["tests.test_wal.test_state_dir[a]"]
    assert lines[0].startswith("skipped [unit] tests.vllm.test_vllm_gate: ")
    assert lines[0].endswith("(allowed: vLLM does not import in the project's venv)")
    assert lines[1].startswith("SKIPPED, NOT ALLOWED [unit] tests.test_wal.test_state_dir[a]")


@pytest.mark.parametrize(
    ("test", "covered"),
    [
        ("tests.vllm", True),
        ("tests.vllm.test_vllm_gate.test_x[p]", True),
        ("tests.test_wal.test_state_dir[a]", True),
        ("tests.test_wal.test_state_dir_other", False),
        ("tests.vllmx", False),
    ],
)
def test_an_entry_covers_what_is_under_it(test: str, covered: bool) -> None:
    """An entry covers itself and what is under it (package, module, parameters), nothing
    whose name merely begins the same."""
    entries = [
        Allowed("unit", "tests.vllm", "-"),
        Allowed("unit", "tests.test_wal.test_state_dir", "-"),
    ]
    assert any(entry.covers(Skip("unit", test, "")) for entry in entries) is covered


def test_a_malformed_allow_list_line_is_an_error() -> None:
    """A line without a reason is refused, naming its line."""
    with pytest.raises(ValueError, match="line 2"):
        read_allowed("# comment\nunit tests.vllm\n")


def test_main_fails_on_a_refused_skip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The command prints each skip and a count; exit 1 with a refused one, 0 without."""
    allowed = tmp_path / "allowed.txt"
    allowed.write_text(ALLOWED, encoding="utf-8")
    report = tmp_path / "unit.xml"
    report.write_text(REPORT, encoding="utf-8")
    assert main([str(allowed), str(report)]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == f"2 skipped, 1 not on the allow-list ({allowed})"
    allowed.write_text(ALLOWED + "unit tests.test_wal a state directory exists\n", "utf-8")
    assert main([str(allowed), str(report)]) == 0
    assert main([str(allowed)]) == 2
