"""The README stays a five-minute read, and neither it nor the documentation site cites the
project's internal issue numbers: the pages say what edgemon does and why; history lives in
the changelog and in git, and the changelog needs no issue numbers either."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 250

#: "issue 18", "issues 10 and 21", "PR 7", "pull request 3", and a bare "#23" that is not a
#: link's anchor (`fleet.md#6-what-it-costs`) or part of a word.
ISSUE_NUMBER = re.compile(
    r"\b(?:issues?|PR|pull request)\s*#?\d+|(?<![\w/&#])(?<!\]\()#\d+(?![\w-])", re.IGNORECASE
)


def issue_numbers(path: Path) -> list[str]:
    """Each line of `path` that cites an issue number, as `path:line: text`."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for number, line in enumerate(lines, start=1)
        if ISSUE_NUMBER.search(line)
    ]


def test_the_readme_is_at_most_250_lines() -> None:
    """The README is what a newcomer reads in five minutes: everything else is in docs/."""
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move detail into docs/"


def test_the_readme_cites_no_issue_number() -> None:
    """No "issue 18" or "#23" in the README."""
    assert issue_numbers(README) == []


def test_no_page_of_the_site_cites_an_issue_number() -> None:
    """No page under docs/, the changelog included, cites an issue number."""
    pages = sorted(DOCS.rglob("*.md"))
    assert len(pages) > 10  # the site is there, not an empty glob
    assert [hit for page in pages for hit in issue_numbers(page)] == []


@pytest.mark.parametrize(
    ("text", "cites"),
    [
        ("before issue 18 it waited", True),
        ("Issues 10 and 21", True),
        ("see #23 for the fix", True),
        ("(#23)", True),
        ("a PR 7 change", True),
        ("[costs](../fleet.md#6-what-it-costs-measured)", False),
        ("[x](#does-it-help)", False),
        ("[item 2](#2-the-central-store)", False),
        ("colour &#35; and C#9", False),
        ("seq 1700000000512345, 2 issues in all", False),
    ],
)
def test_the_pattern_finds_issue_numbers_and_nothing_else(text: str, cites: bool) -> None:
    """What counts as an issue number, and what merely looks like one."""
    assert bool(ISSUE_NUMBER.search(text)) is cites


MAX_EXPLANATION_WORDS = 1500
#: What an explanation page's word count leaves out: its front matter, code blocks, table rows
#: and the markers the build replaces with generated tables.
NOT_PROSE = re.compile(
    r"\A---\n[\s\S]*?\n---\n|```[\s\S]*?```|^\|.*$|^<!-- generated: .* -->$", re.MULTILINE
)


def explanation_pages() -> list[Path]:
    """The pages mkdocs.yml lists under "Explanation"."""
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    section = nav.split("  - Explanation:\n", 1)[1].split("\n  - ", 1)[0]
    return [DOCS / line.split(": ", 1)[1] for line in section.splitlines() if ": " in line]


def test_each_explanation_page_is_at_most_1500_words_of_prose() -> None:
    """An explanation page states its results and how to reproduce them; the tables come from
    the results files, and anything longer belongs in a reference page or the changelog."""
    pages = explanation_pages()
    assert len(pages) >= 5
    long = {}
    for page in pages:
        words = len(NOT_PROSE.sub("", page.read_text(encoding="utf-8")).split())
        if words > MAX_EXPLANATION_WORDS:
            long[page.name] = words
    assert not long, f"over {MAX_EXPLANATION_WORDS} words of prose: {long}"
