"""The commands the documentation prints, read from its pages by what runs them.

`engine_block()` is the one engine command line (the shipped policy) as the README prints it;
every other page prints the same text (tests/test_docs_commands.py), and the vLLM tier serves
it (tests/vllm/served.py). `titled_block()` is a `sh` block by its title: the Makefile builds
`.venv-vllm` by running the vLLM CPU how-to's install block as printed:

    python3 tests/documented.py block docs/how-to/vllm-cpu.md "Install vLLM's CPU build"

Standard library only: the Makefile runs it with the system's Python, before any venv exists.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The page whose engine command line the vLLM tier runs.
ENGINE_PAGE = ROOT / "README.md"
ENGINE_ENTRY_POINT = "vllm.entrypoints.openai.api_server"
VLLM_CPU_PAGE = ROOT / "docs" / "how-to" / "vllm-cpu.md"
INSTALL_TITLE = "Install vLLM's CPU build"
SERVE_TITLE = "Serve on a CPU"
#: What the vLLM CPU how-to adds to the engine command line, and the vLLM tier's servers too.
CPU_OPTIONS = ("--dtype", "float32")

_SH_BLOCK = re.compile(r"^```sh(?P<info>[^\n]*)\n(?P<body>.*?)^```", re.MULTILINE | re.DOTALL)
_TITLE = re.compile(r'title="(?P<title>[^"]*)"')


def sh_blocks(page: Path) -> list[tuple[str, str]]:
    """Every `sh` block of `page`: (its title, or "" without one; its text)."""
    found = []
    for match in _SH_BLOCK.finditer(page.read_text(encoding="utf-8")):
        title = _TITLE.search(match.group("info"))
        found.append(("" if title is None else title.group("title"), match.group("body")))
    return found


def titled_block(page: Path, title: str) -> str:
    """The text of `page`'s one `sh` block titled `title`."""
    texts = [text for name, text in sh_blocks(page) if name == title]
    if len(texts) != 1:
        raise LookupError(f"{page.name} has {len(texts)} sh blocks titled {title!r}, not 1")
    return texts[0]


def engine_blocks(page: Path) -> list[str]:
    """The `sh` blocks of `page` that start vLLM's OpenAI server."""
    return [text for _, text in sh_blocks(page) if ENGINE_ENTRY_POINT in text]


def engine_block() -> str:
    """The engine command line as `ENGINE_PAGE` prints it (its one block that starts vLLM)."""
    [text] = engine_blocks(ENGINE_PAGE)
    return text


def words(block: str) -> list[str]:
    """A block's one command as the shell splits it (continuation lines joined)."""
    lines = [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    if len(lines) != 1:
        raise ValueError(f"not one command: {block!r}")
    return shlex.split(lines[0], comments=True)


def exports(block: str) -> dict[str, str]:
    """The variables a block's `export NAME=value ...` lines set."""
    found: dict[str, str] = {}
    for line in block.splitlines():
        parts = shlex.split(line, comments=True)
        if parts[:1] == ["export"]:
            found |= dict(part.split("=", 1) for part in parts[1:])
    return found


def main(argv: list[str]) -> int:
    """`block PAGE TITLE` prints that block."""
    if len(argv) != 3 or argv[0] != "block":
        print("usage: documented.py block PAGE TITLE", file=sys.stderr)
        return 2
    sys.stdout.write(titled_block(Path(argv[1]), argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
