"""A talker-shaped model made here: a Llama with random weights and a word-level tokenizer.

`write_model(directory, size)` writes what vLLM's OpenAI server loads with `--model DIR`:
`config.json` (architecture `LlamaForCausalLM`), the weights drawn from a fixed seed
(`model.safetensors`) and a tokenizer built with the `tokenizers` library (a WordLevel
vocabulary `w0 … wN` with the specials `<unk> <s> </s> <pad>`, whitespace pre-tokenizer),
wrapped in `PreTrainedTokenizerFast` and saved beside them, with a trivial chat template.
Nothing is downloaded. Needs torch, transformers and tokenizers (`.venv-vllm` has them).

Random weights make meaningless tokens, and the model has **no end-of-sequence token**:
`config.json` names none (`eos_token_id` null), the tokenizer declares none (`</s>` is an
ordinary word of its vocabulary) and no `generation_config.json` is written, so vLLM's
`eos_token_id` is None and no sampled token stops a stream (`check_stop` stops only at an
EOS id, a requested stop token, `max_tokens` or the model's length). A stream therefore
ends when its player has what it needs and closes it (vLLM aborts a request whose client
left), as a TTS stream ends at its end-of-speech token, or at the client's `max_tokens` cap;
clients send no `ignore_eos` and no length. The prompt is sent as token ids. What matters
is the step shape: `SIZES` gives presets named by their parameter count; the default (`117m`, fp32)
is the one whose decode step on one core of the project's VM is nearest the shape of a TTS
talker near capacity (see `real_engine.py --shape` for the measured steps). Served in fp32
(`--dtype float32`): a CPU without bf16 instructions (such as an AVX2 EPYC) emulates bf16
and then gains nothing from batching. `tiny` starts fast and steps in a few ms, for the smoke test.

    .venv-vllm/bin/python benchmarks/_real_model.py DIR [--model-size 117m] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")
"""The vocabulary's first words, ids 0 to 3 (prompts never use them): `<unk>`, `<s>` and
`<pad>` are the tokenizer's special tokens; `</s>` is an ordinary word (no EOS, see the
module doc). Words `w0 …` follow them."""
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
MAX_MODEL_LEN = 4096
"""Positions the model takes: the workload's longest prompt plus its longest audio, and
enough that a step measurement's streams outlast the measurement (`_real_steps`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSize:
    """A Llama's dimensions (and its dtype on disk and in the engine)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    dtype: str = "float32"
    max_model_len: int = MAX_MODEL_LEN
    """Its positions (`max_position_embeddings`): vLLM ends a stream there."""

    @property
    def head_dim(self) -> int:
        """Each attention head's width."""
        return self.hidden_size // self.num_attention_heads

    def parameters(self) -> int:
        """The parameter count (embeddings and the untied output layer included)."""
        h, kv = self.hidden_size, self.num_key_value_heads * self.head_dim
        attention = 2 * h * h + 2 * h * kv
        mlp = 3 * h * self.intermediate_size
        per_layer = attention + mlp + 2 * h
        return self.num_hidden_layers * per_layer + 2 * self.vocab_size * h + h


SIZES: dict[str, ModelSize] = {
    "tiny": ModelSize(
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=256,
        vocab_size=2048,
        # Steps of 1-2 ms: a step measurement's stream must last longer than 4,096 steps.
        max_model_len=65_536,
    ),
    "102m": ModelSize(
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        intermediate_size=2560,
        vocab_size=8192,
    ),
    "117m": ModelSize(
        hidden_size=768,
        num_hidden_layers=14,
        num_attention_heads=12,
        num_key_value_heads=4,
        intermediate_size=2560,
        vocab_size=8192,
    ),
    "132m": ModelSize(
        hidden_size=768,
        num_hidden_layers=16,
        num_attention_heads=12,
        num_key_value_heads=4,
        intermediate_size=2560,
        vocab_size=8192,
    ),
}
DEFAULT_SIZE = "117m"


def config(size: ModelSize) -> dict[str, object]:
    """The model's `config.json`."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": size.hidden_size,
        "intermediate_size": size.intermediate_size,
        "num_attention_heads": size.num_attention_heads,
        "num_key_value_heads": size.num_key_value_heads,
        "head_dim": size.head_dim,
        "num_hidden_layers": size.num_hidden_layers,
        "vocab_size": size.vocab_size,
        "max_position_embeddings": size.max_model_len,
        "rms_norm_eps": 1e-6,
        "torch_dtype": size.dtype,
        "dtype": size.dtype,
        "bos_token_id": 1,
        "eos_token_id": None,  # no EOS: see the module doc
        "pad_token_id": 3,
        "tie_word_embeddings": False,
    }


def write_tokenizer(directory: Path, vocab_size: int) -> None:
    """A word-level tokenizer of `vocab_size` ids (specials first), saved in `directory`; it
    names no end-of-sequence token (`</s>` is an ordinary word)."""
    import tokenizers  # noqa: PLC0415 - only where the model is made
    import transformers  # noqa: PLC0415

    vocab = {word: i for i, word in enumerate(SPECIALS)}
    vocab |= {f"w{i}": i + len(SPECIALS) for i in range(vocab_size - len(SPECIALS))}
    words = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="<unk>"))
    words.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=words,
        unk_token="<unk>",
        bos_token="<s>",
        pad_token="<pad>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)


def write_model(directory: Path, size: str = DEFAULT_SIZE, *, seed: int = 0) -> ModelSize:
    """Write the model `size` into `directory` (weights from `seed`); its dimensions."""
    import torch  # noqa: PLC0415 - only where the model is made
    import transformers  # noqa: PLC0415

    dims = SIZES[size]
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config(dims)))
    llama.to(getattr(torch, dims.dtype)).save_pretrained(directory, safe_serialization=True)
    # save_pretrained writes transformers' own view of the config; ours is what vLLM reads,
    # and no generation config (transformers' default would name an EOS id).
    (directory / "config.json").write_text(json.dumps(config(dims), indent=1), encoding="utf-8")
    (directory / "generation_config.json").unlink(missing_ok=True)
    write_tokenizer(directory, dims.vocab_size)
    return dims


def main(argv: list[str] | None = None) -> int:
    """Write a model directory and say what it holds."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--model-size", choices=sorted(SIZES), default=DEFAULT_SIZE)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    dims = write_model(args.directory, args.model_size, seed=args.seed)
    print(json.dumps({"size": args.model_size, "parameters": dims.parameters(), **asdict(dims)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
