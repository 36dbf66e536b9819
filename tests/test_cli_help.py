"""`edgemon --help` is written for the person at the terminal: what edgemon does, its commands,
where to start and the exit codes; not the entry point's developer notes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from edgemon.cli.main import main

COMMANDS = ("run", "demo", "replay", "kv-budget", "check-config", "simulate", "top")


def python(*args: str) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter run with `args`, its output captured."""
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_top_level_help_says_what_edgemon_does_and_where_to_start(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 80 columns: the usage line, what edgemon does, every command under "commands" with
    its one-line help, the pointer to `edgemon demo`, and the exit codes; no line wider than
    the terminal, and none of the module's developer notes."""
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0].startswith("usage: edgemon ")
    assert "edgemon watches the playback of streaming text-to-speech on an edge box" in text
    assert "\ncommands:\n" in text
    for command in COMMANDS:
        assert any(line.startswith(f"    {command} ") for line in lines), command
    assert "    run                 the daemon: players' reports in, throttle signals" in text
    assert "`edgemon demo` runs the whole loop on this machine" in text
    assert "exit codes: 0 success, 1 an unexpected error, 2 bad usage or input" in text
    assert max(len(line) for line in lines) <= 80
    for developer_note in ("Entry point", "console script", "imported when the parser"):
        assert developer_note not in text


@pytest.mark.integration  # starts a process
def test_a_command_loads_only_what_it_needs() -> None:
    """`edgemon kv-budget` in a fresh interpreter imports neither the daemon's settings
    (pydantic), its HTTP stack (aiohttp), the simulator nor the live view: the other commands
    are a line of help each (before: every command's module was imported, 0.53 s against
    0.07 s for a kv-budget answer here); its `--help` still lists every command."""
    code = (
        "import sys; from edgemon.cli.main import main; "
        "code = main(['kv-budget', '--geometry', '28,8,128', '--kv-cache-bytes', '4GiB', "
        "'--max-model-len', '4096']); "
        "heavy = ['edgemon.settings', 'aiohttp', 'pydantic', 'edgemon.simulate', 'rich']; "
        "print(code, sorted(m for m in heavy if m in sys.modules))"
    )
    done = python("-c", code)
    assert done.stdout.splitlines()[-1] == "0 []", done.stderr
    listed = python("-m", "edgemon", "kv-budget", "--help")
    assert listed.returncode == 0
    assert "--max-num-seqs" in listed.stdout
