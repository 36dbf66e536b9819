"""`edgemon kv-budget` run as a real process: output, JSON, exit codes and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pathlib import Path


#: Every test here runs `python -m edgemon ...` or another program as a process.
pytestmark = pytest.mark.integration

TALKER = {
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_size": 1024,
}


def qwen3_tts(kv_cache_bytes: str = "4GiB", max_model_len: str = "4096") -> list[str]:
    """Arguments for the Qwen3-TTS talker geometry with the given sizes."""
    geometry = ["--geometry", "28,8,128"]
    return [*geometry, "--kv-cache-bytes", kv_cache_bytes, "--max-model-len", max_model_len]


QWEN3_TTS = qwen3_tts()
SIZES = QWEN3_TTS[2:]  # without the geometry


def kv_budget(*args: str, encoding: str = "utf-8") -> subprocess.CompletedProcess[str]:
    """Run `python -m edgemon kv-budget ARGS` and capture its output."""
    env = {**os.environ, "PYTHONIOENCODING": encoding}
    return subprocess.run(
        [sys.executable, "-m", "edgemon", "kv-budget", *args],
        capture_output=True,
        text=True,
        encoding=encoding,
        env=env,
        check=False,
        timeout=60,
    )


def write_json(path: Path, value: object) -> Path:
    """Write `value` as JSON to `path` and return the path."""
    path.write_text(json.dumps(value), encoding="utf-8")
    return path


# ------------------------------------------------------------------ verdicts


def test_table_for_a_fitting_configuration() -> None:
    """The default output is an aligned table with the numbers, geometry, dtype and verdict."""
    result = kv_budget(*QWEN3_TTS, "--max-num-seqs", "8")
    assert (result.returncode, result.stderr) == (0, "")
    lines = result.stdout.splitlines()
    assert lines[-1] == "verdict: fits — 9 ≥ 8"
    rows = dict(line.split("  ", 1) for line in lines[:-1])
    assert {label.rstrip() for label in rows} >= {
        "geometry",
        "KV cache dtype",
        "bytes per token",
        "bytes per sequence",
        "max sequences without preemption",
        "max_num_seqs",
    }
    values = {label.rstrip(): value.strip() for label, value in rows.items()}
    assert values["bytes per token"] == "114,688"
    assert values["bytes per sequence"].startswith("469,762,048 (448 MiB)")
    assert values["max sequences without preemption"] == "9"
    assert values["max_num_seqs"] == "8"
    assert values["geometry"] == "28 layers, 8 KV heads, head_dim 128"
    assert values["KV cache dtype"].startswith("bfloat16 (2 bytes")
    # every value starts in the same column
    assert (
        len({line.index(value) for line, value in zip(lines, values.values(), strict=False)}) == 1
    )


def test_table_for_a_configuration_that_would_preempt_exits_3() -> None:
    """Too many sequences for the cache exits 3 and says how many bytes they would need."""
    result = kv_budget(*QWEN3_TTS, "--max-num-seqs", "16")
    assert (result.returncode, result.stderr) == (3, "")
    assert result.stdout.splitlines()[-1] == (
        "verdict: would preempt — 9 < 16; 16 sequences need 7,516,192,768 (7 GiB)"
    )


def test_without_max_num_seqs_the_capacity_is_reported_and_exit_is_0() -> None:
    """With no --max-num-seqs there is nothing to fail: exit 0 with the capacity."""
    result = kv_budget(*QWEN3_TTS)
    assert result.returncode == 0
    assert "not given" in result.stdout
    assert result.stdout.splitlines()[-1].startswith("verdict: 9 sequences fit")


def test_terminal_without_unicode_gets_ascii_symbols() -> None:
    """A stdout that cannot encode '—' or '≥' gets ASCII instead of a crash."""
    result = kv_budget(*QWEN3_TTS, "--max-num-seqs", "8", encoding="ascii")
    assert result.returncode == 0
    assert result.stdout.splitlines()[-1] == "verdict: fits - 9 >= 8"


@pytest.mark.parametrize(
    ("max_num_seqs", "code", "ok"), [("9", 0, True), ("10", 3, False)], ids=["fits", "preempts"]
)
def test_json_output_is_exactly_the_spec_object(max_num_seqs: str, code: int, ok: bool) -> None:
    """--json prints only the README object, with the same exit code as the table."""
    result = kv_budget(*QWEN3_TTS, "--max-num-seqs", max_num_seqs, "--json")
    assert (result.returncode, result.stderr) == (code, "")
    assert json.loads(result.stdout) == {
        "bytes_per_token": 114_688,
        "bytes_per_seq": 469_762_048,
        "max_seqs_without_preemption": 9,
        "max_num_seqs": int(max_num_seqs),
        "admission_ok": ok,
    }


def test_json_without_max_num_seqs_has_nulls() -> None:
    """Without --max-num-seqs, max_num_seqs and admission_ok are JSON null."""
    result = kv_budget(*QWEN3_TTS, "--json")
    assert result.returncode == 0
    verdict = json.loads(result.stdout)
    assert verdict["max_num_seqs"] is None
    assert verdict["admission_ok"] is None


def test_options_change_the_verdict() -> None:
    """--block-size, --dtype and --kv-cache-dtype feed the formula."""
    result = kv_budget(
        *qwen3_tts(max_model_len="4097"),
        "--block-size",
        "32",
        "--dtype",
        "float32",
        "--kv-cache-dtype",
        "fp8",
        "--json",
    )
    verdict = json.loads(result.stdout)
    assert verdict["bytes_per_token"] == 57_344
    assert verdict["bytes_per_seq"] == 4128 * 57_344


def test_hf_config_file_gives_the_talker_geometry(tmp_path: Path) -> None:
    """--hf-config reads talker_config from a config.json, same verdict as --geometry."""
    config = write_json(tmp_path / "config.json", {"talker_config": TALKER})
    by_file = kv_budget("--hf-config", str(config), *SIZES, "--json")
    by_geometry = kv_budget(*QWEN3_TTS, "--json")
    assert by_file.returncode == 0
    assert json.loads(by_file.stdout) == json.loads(by_geometry.stdout)


def test_hf_config_directory_means_its_config_json(tmp_path: Path) -> None:
    """--hf-config may name a model directory; its config.json is read."""
    write_json(tmp_path / "config.json", {"talker_config": TALKER})
    result = kv_budget("--hf-config", str(tmp_path), *SIZES, "--json")
    assert result.returncode == 0
    assert json.loads(result.stdout)["bytes_per_token"] == 114_688


# ------------------------------------------------------------------ bad input


def bad_files(tmp_path: Path) -> dict[str, Path]:
    """One file per kind of broken HF config."""
    (tmp_path / "bad.json").write_text('{"talker_config": {', encoding="utf-8")
    (tmp_path / "latin1.json").write_bytes(b'{"name": "caf\xe9"}')
    missing_layers = {key: value for key, value in TALKER.items() if key != "num_hidden_layers"}
    return {
        "bad": tmp_path / "bad.json",
        "latin1": tmp_path / "latin1.json",
        "list": write_json(tmp_path / "list.json", [TALKER]),
        "no_layers": write_json(tmp_path / "no_layers.json", {"talker_config": missing_layers}),
        "float": write_json(tmp_path / "float.json", {**TALKER, "num_hidden_layers": 28.0}),
        "good": write_json(tmp_path / "good.json", TALKER),
        "nothing": tmp_path / "nothing.json",
        "empty_dir": tmp_path,
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hf-config", "{nothing}", *SIZES], "cannot read {nothing}: No such file"),
        (["--hf-config", "{empty_dir}", *SIZES], "cannot read {empty_dir}/config.json"),
        (["--hf-config", "{bad}", *SIZES], "{bad} is not valid JSON"),
        (["--hf-config", "{latin1}", *SIZES], "{latin1} is not UTF-8 text"),
        (["--hf-config", "{list}", *SIZES], "{list} must hold a JSON object, not list"),
        (
            ["--hf-config", "{no_layers}", *SIZES],
            "hf config: talker_config.num_hidden_layers is missing",
        ),
        (["--hf-config", "{float}", *SIZES], "hf config: num_hidden_layers must be an integer"),
        (["--hf-config", "{good}", *SIZES, "--dtype", "xyz"], "unknown dtype 'xyz'; known: "),
        (
            ["--hf-config", "{good}", *SIZES, "--kv-cache-dtype", "fp4"],
            "unknown kv_cache_dtype 'fp4'",
        ),
        (qwen3_tts("0"), "kv_cache_bytes must be positive, got 0"),
        (qwen3_tts("-1"), "invalid size '-1'"),
        (qwen3_tts("4G"), "unknown unit 'G'; expected a number"),
        (qwen3_tts("1.5B"), "not a whole number of bytes"),
        (qwen3_tts(max_model_len="0"), "max_model_len must be positive, got 0"),
        (qwen3_tts(max_model_len="-4096"), "max_model_len must be positive, got -4096"),
        (qwen3_tts(max_model_len="4k"), "argument --max-model-len: expected a whole number"),
        ([*QWEN3_TTS, "--max-num-seqs", "0"], "max_num_seqs must be positive, got 0"),
        ([*QWEN3_TTS, "--block-size", "0"], "block_size must be positive, got 0"),
        (["--geometry", "28,8", *SIZES], "argument --geometry: expected L,H,D"),
        (["--geometry", "28,0,128", *SIZES], "num_kv_heads must be positive"),
        (["--geometry", "28,8,128", "--hf-config", "{good}", *SIZES], "not allowed with"),
        (SIZES, "one of the arguments --hf-config --geometry is required"),
        (["--geometry", "28,8,128"], "the following arguments are required: --kv-cache-bytes"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else None,
)
def test_bad_input_is_one_line_on_stderr_and_exit_2(
    tmp_path: Path, args: list[str], message: str
) -> None:
    """Each kind of bad input exits 2 with one line naming the problem, no traceback."""
    files = bad_files(tmp_path)
    result = kv_budget(*(arg.format_map(files) for arg in args))
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr.startswith("edgemon kv-budget: ")
    assert result.stderr.count("\n") == 1
    assert result.stderr.endswith("\n")
    assert "Traceback" not in result.stderr
    assert message.format_map(files) in result.stderr
