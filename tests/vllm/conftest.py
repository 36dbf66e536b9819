"""Fixtures for the vLLM tier (`make test-vllm`), and the rule that a test module skipped
because a package `EDGEMON_REQUIRE_MODULES` names does not import fails instead (the tier's
venvs must import vLLM, and vLLM-Omni where it is installed). Nothing here imports vLLM
at load."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tools import required_import_failed

# The real-engine benchmark's model maker (`benchmarks/_real_model.py`) writes the tokenizer.
sys.path.append(str(Path(__file__).resolve().parents[2] / "benchmarks"))

if TYPE_CHECKING:
    from collections.abc import Callable, Generator
    from typing import Any

#: The tiny Llama's vocabulary: 4 special tokens and 252 words.
TINY_VOCAB = 256
#: A tiny Llama: enough for vLLM's ModelConfig (and, with dummy weights, for its CPU engine).
TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "num_hidden_layers": 1,
    "vocab_size": TINY_VOCAB,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}


@pytest.fixture(scope="session")
def served_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama's config and the real-engine benchmark's word-level tokenizer (`w0 …
    w251`, a chat template): what vLLM's OpenAI server needs to serve it with dummy weights;
    nothing downloaded."""
    from _real_model import write_tokenizer  # noqa: PLC0415 - imports transformers when called

    directory = tmp_path_factory.mktemp("served-model")
    write_tokenizer(directory, TINY_VOCAB)
    config = TINY_CONFIG | {"max_position_embeddings": 4096}
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding only a tiny Llama `config.json`; nothing is ever downloaded."""
    directory = tmp_path_factory.mktemp("tiny-model")
    (directory / "config.json").write_text(json.dumps(TINY_CONFIG))
    return directory


@pytest.fixture
def edgemon_llm(tiny_model: Path) -> Callable[..., Any]:
    """Build vLLM's CPU engine (`LLM`) on the tiny model's dummy weights with edgemon's
    scheduler plugged in by name: `build(max_num_seqs, **more)`, `more` vLLM's other
    arguments. Each test sets the environment the scheduler reads first."""

    def build(max_num_seqs: int, **more: Any) -> Any:
        from vllm import LLM  # noqa: PLC0415 - only where a test builds an engine

        return LLM(
            model=str(tiny_model),
            load_format="dummy",
            skip_tokenizer_init=True,
            enforce_eager=True,
            dtype="float32",
            max_model_len=256,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=256,
            block_size=32,
            seed=0,
            scheduler_cls="edgemon.integrations.vllm.EdgemonScheduler",
            **more,
        )

    return build


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    """A module's `pytest.importorskip` of a required package is a collection error."""
    report = yield
    if report.skipped and isinstance(report.longrepr, tuple):
        why = required_import_failed(report.longrepr[2])
        if why is not None:
            report.outcome = "failed"
            report.longrepr = f"{collector.nodeid}: {why}"
    return report
