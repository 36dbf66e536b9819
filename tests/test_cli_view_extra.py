"""`rich` is the optional `view` extra: only `demo` and `top` need it (a real interpreter in
which `rich` cannot be imported, as on a box where edgemon was installed without the extra)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pathlib import Path


#: Every test here runs `python -m edgemon ...` or another program as a process.
pytestmark = pytest.mark.integration

TIMEOUT_S = 60.0


def without_rich(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run `python *args` where `import rich` fails as it does when rich is not installed."""
    shadow = tmp_path / "shadow" / "rich"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        'raise ModuleNotFoundError("No module named \'rich\'", name="rich")\n', encoding="utf-8"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(shadow.parent), *filter(None, [env.get("PYTHONPATH")])]
    )
    return subprocess.run(
        [sys.executable, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


@pytest.mark.parametrize("command", [["demo", "--duration", "1"], ["top", "--once"]])
def test_demo_and_top_without_rich_say_what_to_install(tmp_path: Path, command: list[str]) -> None:
    """Without rich, `edgemon demo`/`top` (with their usual flags) exit 2 with one line naming
    the extra, and no traceback."""
    done = without_rich(tmp_path, "-m", "edgemon", *command)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"edgemon {command[0]}: ")
    assert "edgemon[view]" in lines[0]


def test_the_daemon_and_other_commands_need_no_rich(tmp_path: Path) -> None:
    """The daemon, the HTTP adapter and the rest of the command line import without rich;
    `check-config` runs."""
    config = tmp_path / "edgemon.toml"
    config.write_text('[mqtt]\nurl = "mqtt://127.0.0.1:1883"\n', encoding="utf-8")
    code = (
        "import sys; import edgemon.daemon, edgemon.adapters.http, edgemon.cli.main as m; "
        "m.build_parser(); assert 'rich' not in sys.modules or sys.modules['rich'] is None; "
        f"sys.exit(m.main(['check-config', {str(config)!r}]))"
    )
    done = without_rich(tmp_path, "-c", code)
    assert done.returncode == 0, done.stderr
