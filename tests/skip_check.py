"""The skipped tests of CI's pytest runs, checked against an allow-list (`.ci/run`).

    python tests/skip_check.py ALLOW_LIST REPORT.xml...

Each report is one run's `--junitxml` file; the run is named by the file's stem (`unit.xml`:
`unit`). Every skipped test is printed; one that the allow-list does not name for its run
makes the exit status 1. An expected failure (`xfail`) is not a skip.

The allow-list has one entry a line: the run, the test as JUnit names it (dotted: a module
`tests.vllm.test_vllm_gate`, a test `tests.test_wal.test_x[param]`), and why it may skip.
An entry names that test, or every test under it (a package or a module). `#` starts a
comment.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

#: JUnit's type of an expected failure, which pytest writes as `<skipped>` too.
XFAIL = "pytest.xfail"


@dataclass(frozen=True, slots=True)
class Skip:
    """A test a run skipped, and pytest's reason."""

    run: str
    test: str
    reason: str


@dataclass(frozen=True, slots=True)
class Allowed:
    """An allow-list entry: in `run`, `test` and what is under it may skip."""

    run: str
    test: str
    why: str

    def covers(self, skip: Skip) -> bool:
        """Whether this entry allows `skip`."""
        name = skip.test
        return (
            skip.run == self.run
            and name.startswith(self.test)
            and name[len(self.test) : len(self.test) + 1] in ("", ".", "[")
        )


def read_allowed(text: str) -> list[Allowed]:
    """The entries of an allow-list's text; a line that is not `run test why` is an error."""
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        content = line.partition("#")[0].split(maxsplit=2)
        if not content:
            continue
        if len(content) < 3:
            msg = f"allow-list line {number}: want `run test why`, got {line.strip()!r}"
            raise ValueError(msg)
        entries.append(Allowed(*content))
    return entries


def read_skips(run: str, xml: str) -> list[Skip]:
    """The skipped tests of one run's JUnit XML (not its expected failures)."""
    skips = []
    for case in ET.fromstring(xml).iter("testcase"):
        skipped = case.find("skipped")
        if skipped is None or skipped.get("type") == XFAIL:
            continue
        classname, name = case.get("classname", ""), case.get("name", "")
        test = f"{classname}.{name}" if classname else name
        reason = skipped.text or skipped.get("message") or ""
        skips.append(Skip(run, test, " ".join(reason.split())))
    return skips


def check(allowed: list[Allowed], skips: list[Skip]) -> tuple[list[str], list[Skip]]:
    """The lines to print (every skip, marked allowed or not) and the skips not allowed."""
    lines, refused = [], []
    for skip in skips:
        entry = next((entry for entry in allowed if entry.covers(skip)), None)
        if entry is None:
            refused.append(skip)
            lines.append(f"SKIPPED, NOT ALLOWED [{skip.run}] {skip.test}: {skip.reason}")
        else:
            lines.append(f"skipped [{skip.run}] {skip.test}: {skip.reason} (allowed: {entry.why})")
    return lines, refused


def main(argv: list[str]) -> int:
    """Print the skips of the reports in `argv[1:]`; 1 if one is not on the allow-list
    `argv[0]`, 2 on bad arguments."""
    if len(argv) < 2:
        print("usage: skip_check.py ALLOW_LIST REPORT.xml...", file=sys.stderr)
        return 2
    allowed = read_allowed(Path(argv[0]).read_text(encoding="utf-8"))
    skips = [
        skip
        for report in map(Path, argv[1:])
        for skip in read_skips(report.stem, report.read_text(encoding="utf-8"))
    ]
    lines, refused = check(allowed, skips)
    for line in lines:
        print(line)
    print(f"{len(skips)} skipped, {len(refused)} not on the allow-list ({argv[0]})")
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
