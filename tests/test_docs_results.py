"""The explanation pages' tables of results are generated from benchmarks/results/*.jsonl
(docs_hooks.py): every record says what made it and when, every table a page asks for has its
records, every benchmark recorded is shown, and no page narrates runs by the clock."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest


def load_hooks() -> Any:
    """docs_hooks.py, the MkDocs hook at the top of the repository (not a package)."""
    path = Path(__file__).resolve().parents[1] / "docs_hooks.py"
    spec = importlib.util.spec_from_file_location("docs_hooks", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


docs_hooks = load_hooks()
DOCS = docs_hooks.ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
#: A time of day such as "03:56" or "18:38 UTC", the way a lab notebook labels its runs (not
#: part of a word, a path or a policy's label such as `queued:12:12`).
CLOCK_TIME = re.compile(r"(?<![\w:.\-/])[0-2]\d:[0-5]\d(?![\w:])")
#: Pages being rewritten with new results in another change, their record of runs with them.
REWRITTEN = {"explanation/real-engine.md", "explanation/does-it-help.md"}


def markers(page: str) -> list[str]:
    """The generated tables `page` asks for, in order."""
    found: list[str] = docs_hooks.MARKER.findall((DOCS / page).read_text(encoding="utf-8"))
    return found


@pytest.mark.parametrize("prefix", ["performance", "hostile"])
def test_every_record_says_what_made_it_and_when(prefix: str) -> None:
    """Each benchmark of a results file has one `made` record with a command (or how it was
    measured, where no script does) and ISO dates, and at least one figure, each with a range
    whose least is not above its most."""
    rows = docs_hooks.records(docs_hooks.FIGURES[prefix])
    benches = dict.fromkeys(row["bench"] for row in rows)
    for bench in benches:
        made = [row for row in rows if row["bench"] == bench and row["kind"] == "made"]
        figures = [row for row in rows if row["bench"] == bench and row["kind"] == "figure"]
        assert len(made) == 1, bench
        assert ("command" in made[0]) != ("how" in made[0]), bench
        dates = made[0]["date"] if isinstance(made[0]["date"], list) else [made[0]["date"]]
        assert all(re.fullmatch(r"\d{4}-\d{2}-\d{2}", date) for date in dates), bench
        assert figures, bench
        assert all(row["min"] <= row["max"] for row in figures), bench


def test_the_performance_page_shows_every_benchmark_recorded_once() -> None:
    """The page's `performance-*` markers are exactly the benchmarks of the data, and each
    renders a table with one row per figure and the line that says what made it."""
    rows = docs_hooks.records(docs_hooks.PERFORMANCE)
    benches = list(dict.fromkeys(row["bench"] for row in rows))
    shown = [name for name in markers("explanation/performance.md") if name.startswith("perf")]
    assert sorted(shown) == sorted(f"performance-{bench}" for bench in benches)
    for bench in benches:
        table = docs_hooks.GENERATORS[f"performance-{bench}"]().splitlines()
        figures = sum(1 for row in rows if row["bench"] == bench and row["kind"] == "figure")
        assert len([line for line in table if line.startswith("| ")]) == figures + 1
        assert table[-1].startswith(("Made by `", "Timed by hand"))


def test_reliability_shows_what_make_test_hostile_recorded() -> None:
    """The hostile clients' figures on the reliability page are the records', with their
    bounds and the command that checks them."""
    assert markers("reliability.md").count("hostile-clients") == 1
    table = docs_hooks.GENERATORS["hostile-clients"]()
    assert "| figure | measured | bound |" in table
    assert table.endswith("Made by `make test-hostile` on 2026-12-07, one run.")


def test_every_marker_on_every_page_has_a_generator() -> None:
    """No page asks for a table that nothing generates (MkDocs would fail with a KeyError)."""
    asked = {name for page in PAGES for name in markers(str(page.relative_to(DOCS)))}
    assert asked
    assert asked <= set(docs_hooks.GENERATORS)


@pytest.mark.parametrize(
    "page",
    [
        "../README.md",
        *(name for page in PAGES if (name := str(page.relative_to(DOCS))) not in REWRITTEN),
    ],
)
def test_no_page_labels_runs_by_the_time_of_day(page: str) -> None:
    """Results are stated with the command and the date that made them, never as a diary of
    runs by clock time ("03:56–06:00 UTC", a row labelled by its hour); code blocks aside."""
    prose = re.sub(r"```.*?```", "", (DOCS / page).read_text(encoding="utf-8"), flags=re.DOTALL)
    assert CLOCK_TIME.findall(prose) == []


@pytest.mark.parametrize(
    ("text", "clock"),
    [
        ("03:56–06:00 UTC", True),
        ("| `cap:8, 18:38` |", True),
        ("`queued:12:12`", False),
        ("ratio 1:1 and 16:9", False),
        ("12:30:00.123 in a log line", False),
    ],
)
def test_the_pattern_finds_times_of_day_and_nothing_else(text: str, clock: bool) -> None:
    """What counts as a time of day, and what merely looks like one."""
    assert bool(CLOCK_TIME.search(text)) is clock
