"""`edgemon --help` is written for the person at the terminal: what edgemon does, its commands,
where to start and the exit codes; not the entry point's developer notes."""

from __future__ import annotations

import pytest

from edgemon.cli.main import main

COMMANDS = ("run", "demo", "replay", "kv-budget", "check-config", "simulate", "top")


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
