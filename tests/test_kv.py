"""KV admission (README, "`edgemon kv-budget`"): geometry from HF configs, dtype sizes and the
verdict formulas."""

from __future__ import annotations

from fractions import Fraction
from math import ceil, floor
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgemon.engine.kv import (
    DTYPE_BYTES,
    KVConfigError,
    KVGeometry,
    KVVerdict,
    dtype_bytes,
    effective_kv_dtype,
    kv_verdict,
    verdict_from_engine_object,
)

GiB = 1024**3
QWEN3_TTS_TALKER = KVGeometry(num_layers=28, num_kv_heads=8, head_dim=128)
TALKER_CONFIG: dict[str, object] = {
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_size": 1024,
}
QWEN3_TTS_CONFIG: dict[str, object] = {
    "architectures": ["Qwen3TTSForConditionalGeneration"],
    "num_hidden_layers": 2,  # the root is not the talker: must not be used
    "talker_config": TALKER_CONFIG,
}
#: README's kv-budget dtype table, restated independently of the module's.
SPEC_DTYPES = [
    ("float32", 4),
    ("float16", 2),
    ("half", 2),
    ("bfloat16", 2),
    ("fp8", 1),
    ("fp8_e4m3", 1),
    ("fp8_e5m2", 1),
    ("float8_e4m3fn", 1),
    ("float8_e5m2", 1),
    ("int8", 1),
]


# ------------------------------------------------------------------ the formulas


def test_qwen3_tts_talker_bytes_per_token() -> None:
    """The README's example: 28 layers x 8 KV heads x 128 x bf16 is 114688 bytes per token."""
    verdict = kv_verdict(QWEN3_TTS_TALKER, kv_cache_bytes=4 * GiB, max_model_len=4096)
    assert verdict.bytes_per_token == 114_688


def test_four_gib_admits_nine_sequences_of_4096_tokens() -> None:
    """4 GiB holds floor(4 GiB / (4096 x 114688)) = 9 sequences: 9 fit, 10 would preempt."""
    fits = kv_verdict(QWEN3_TTS_TALKER, kv_cache_bytes=4 * GiB, max_model_len=4096, max_num_seqs=9)
    assert fits == KVVerdict(
        bytes_per_token=114_688,
        bytes_per_seq=4096 * 114_688,
        max_seqs_without_preemption=9,
        max_num_seqs=9,
        admission_ok=True,
    )
    preempts = kv_verdict(
        QWEN3_TTS_TALKER, kv_cache_bytes=4 * GiB, max_model_len=4096, max_num_seqs=10
    )
    assert preempts.admission_ok is False


@pytest.mark.parametrize(
    ("max_model_len", "block_size", "tokens"),
    [(1, 16, 16), (16, 16, 16), (17, 16, 32), (4097, 16, 4112), (4097, 1, 4097), (100, 32, 128)],
)
def test_sequence_is_rounded_up_to_whole_blocks(
    max_model_len: int, block_size: int, tokens: int
) -> None:
    """A sequence occupies ceil(max_model_len / block_size) whole blocks of KV cache."""
    verdict = kv_verdict(
        QWEN3_TTS_TALKER,
        kv_cache_bytes=GiB,
        max_model_len=max_model_len,
        block_size=block_size,
    )
    assert verdict.bytes_per_seq == tokens * 114_688


def test_a_cache_of_exactly_n_sequences_admits_n() -> None:
    """The boundary is inclusive: n x bytes_per_seq admits n, one byte less admits n - 1."""
    per_seq = 4096 * 114_688
    exact = kv_verdict(
        QWEN3_TTS_TALKER, kv_cache_bytes=5 * per_seq, max_model_len=4096, max_num_seqs=5
    )
    short = kv_verdict(
        QWEN3_TTS_TALKER, kv_cache_bytes=5 * per_seq - 1, max_model_len=4096, max_num_seqs=5
    )
    assert (exact.max_seqs_without_preemption, exact.admission_ok) == (5, True)
    assert (short.max_seqs_without_preemption, short.admission_ok) == (4, False)


def test_a_cache_smaller_than_one_sequence_admits_none() -> None:
    """A cache that cannot hold one full-length sequence admits 0 and fails any max_num_seqs."""
    verdict = kv_verdict(QWEN3_TTS_TALKER, kv_cache_bytes=1024, max_model_len=4096, max_num_seqs=1)
    assert (verdict.max_seqs_without_preemption, verdict.admission_ok) == (0, False)


def test_without_max_num_seqs_there_is_no_admission_verdict() -> None:
    """With no max_num_seqs the capacity is reported and admission_ok is None."""
    verdict = kv_verdict(QWEN3_TTS_TALKER, kv_cache_bytes=4 * GiB, max_model_len=4096)
    assert verdict.max_num_seqs is None
    assert verdict.admission_ok is None
    assert verdict.max_seqs_without_preemption == 9


def test_as_dict_has_exactly_the_json_keys() -> None:
    """as_dict() gives the five `kv-budget --json` keys of README and nothing else."""
    verdict = kv_verdict(QWEN3_TTS_TALKER, kv_cache_bytes=4 * GiB, max_model_len=4096)
    assert verdict.as_dict() == {
        "bytes_per_token": 114_688,
        "bytes_per_seq": 469_762_048,
        "max_seqs_without_preemption": 9,
        "max_num_seqs": None,
        "admission_ok": None,
    }


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("kv_cache_bytes", 0),
        ("kv_cache_bytes", -1),
        ("kv_cache_bytes", True),
        ("max_model_len", 0),
        ("max_model_len", -4096),
        ("block_size", 0),
        ("max_num_seqs", 0),
        ("max_num_seqs", -3),
    ],
)
def test_non_positive_arguments_are_errors_naming_them(argument: str, value: int) -> None:
    """Zero, negative (or boolean) sizes raise KVConfigError naming the argument."""
    arguments: dict[str, Any] = {"kv_cache_bytes": GiB, "max_model_len": 4096, argument: value}
    with pytest.raises(KVConfigError, match=rf"^{argument} must be"):
        kv_verdict(QWEN3_TTS_TALKER, **arguments)


# ------------------------------------------------------------------ dtypes


@pytest.mark.parametrize(("name", "size"), SPEC_DTYPES)
def test_dtype_table(name: str, size: int) -> None:
    """Every dtype of the documented table has its size, and the KV bytes scale with it."""
    assert dtype_bytes(name) == size
    verdict = kv_verdict(
        QWEN3_TTS_TALKER, kv_cache_bytes=GiB, max_model_len=16, kv_cache_dtype=name
    )
    assert verdict.bytes_per_token == 57_344 * size


def test_the_table_has_no_other_dtypes() -> None:
    """The table is exactly the documented one: nothing is silently accepted beyond it."""
    assert dict(DTYPE_BYTES) == dict(SPEC_DTYPES)


def test_auto_kv_cache_dtype_means_the_model_dtype() -> None:
    """kv_cache_dtype "auto" stores the cache in the model dtype; anything else overrides it."""
    assert effective_kv_dtype("float32", "auto") == "float32"
    assert effective_kv_dtype("float32", "fp8") == "fp8"
    as_model = kv_verdict(QWEN3_TTS_TALKER, kv_cache_bytes=GiB, max_model_len=16, dtype="float32")
    as_fp8 = kv_verdict(
        QWEN3_TTS_TALKER,
        kv_cache_bytes=GiB,
        max_model_len=16,
        dtype="float32",
        kv_cache_dtype="fp8",
    )
    assert as_model.bytes_per_token == 4 * 57_344
    assert as_fp8.bytes_per_token == 57_344


def test_unknown_dtype_is_an_error_that_names_it() -> None:
    """An unknown dtype raises (the reference assumed 2 bytes), naming it and the known ones."""
    with pytest.raises(KVConfigError, match=r"unknown dtype 'xyz'; known: float32, .*int8"):
        dtype_bytes("xyz")
    with pytest.raises(KVConfigError, match="unknown dtype 'bf16'"):
        kv_verdict(QWEN3_TTS_TALKER, kv_cache_bytes=GiB, max_model_len=16, dtype="bf16")


def test_unknown_kv_cache_dtype_is_named_as_such() -> None:
    """An unknown kv_cache_dtype is reported under that name, not as the model dtype."""
    with pytest.raises(KVConfigError, match="unknown kv_cache_dtype 'fp4'"):
        kv_verdict(QWEN3_TTS_TALKER, kv_cache_bytes=GiB, max_model_len=16, kv_cache_dtype="fp4")


def test_unknown_model_dtype_is_an_error_even_when_the_kv_dtype_is_set() -> None:
    """A typo in the model dtype is not hidden by an explicit kv_cache_dtype."""
    with pytest.raises(KVConfigError, match="unknown dtype 'bfloat61'"):
        kv_verdict(
            QWEN3_TTS_TALKER,
            kv_cache_bytes=GiB,
            max_model_len=16,
            dtype="bfloat61",
            kv_cache_dtype="fp8",
        )


# ------------------------------------------------------------------ geometry


def test_hf_config_uses_the_talker_config() -> None:
    """A Qwen3-TTS config's talker_config gives the geometry, not the root."""
    assert KVGeometry.from_hf_config(QWEN3_TTS_CONFIG) == QWEN3_TTS_TALKER


@pytest.mark.parametrize("talker", [None, "talker", ["not", "an", "object"]], ids=repr)
def test_hf_config_uses_the_root_without_a_talker_object(talker: object) -> None:
    """A plain decoder config (no talker_config object) gives the root's geometry."""
    cfg = {
        "talker_config": talker,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
    }
    assert KVGeometry.from_hf_config(cfg) == KVGeometry(36, 8, 128)


def test_hf_config_derives_head_dim_from_hidden_size() -> None:
    """Without head_dim (absent or null), head_dim = hidden_size // num_attention_heads."""
    cfg = {"num_hidden_layers": 24, "num_attention_heads": 16, "hidden_size": 2048}
    assert KVGeometry.from_hf_config(cfg).head_dim == 128
    assert KVGeometry.from_hf_config({**cfg, "head_dim": None}).head_dim == 128


def test_hf_config_head_dim_wins_over_hidden_size() -> None:
    """An explicit head_dim is used as is, even when hidden_size would give another value."""
    cfg = {"num_hidden_layers": 28, "num_attention_heads": 16, "hidden_size": 1024, "head_dim": 128}
    assert KVGeometry.from_hf_config(cfg).head_dim == 128


@pytest.mark.parametrize("kv_heads", ["absent", None])
def test_hf_config_kv_heads_fall_back_to_attention_heads(kv_heads: object) -> None:
    """Without num_key_value_heads (absent or null), every attention head has its own KV."""
    cfg: dict[str, object] = {"num_hidden_layers": 2, "num_attention_heads": 12, "head_dim": 64}
    if kv_heads != "absent":
        cfg["num_key_value_heads"] = kv_heads
    assert KVGeometry.from_hf_config(cfg) == KVGeometry(2, 12, 64)


@pytest.mark.parametrize(
    ("drop", "named"),
    [
        ("num_hidden_layers", "num_hidden_layers"),
        ("num_attention_heads", "num_attention_heads"),
    ],
)
def test_hf_config_missing_field_is_named_with_its_path(drop: str, named: str) -> None:
    """A missing field raises KVConfigError naming it, under talker_config when used."""
    talker = {
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "hidden_size": 1024,
    }
    del talker[drop]
    with pytest.raises(KVConfigError, match=rf"^hf config: talker_config\.{named} is missing$"):
        KVGeometry.from_hf_config({"talker_config": talker})


def test_hf_config_missing_hidden_size_is_named_when_head_dim_is_absent() -> None:
    """With neither head_dim nor hidden_size, the error names hidden_size at the root."""
    with pytest.raises(KVConfigError, match=r"^hf config: hidden_size is missing$"):
        KVGeometry.from_hf_config({"num_hidden_layers": 2, "num_attention_heads": 4})


@pytest.mark.parametrize("value", [28.0, "28", True, [28], {"n": 28}], ids=repr)
def test_hf_config_non_integer_field_is_an_error_naming_it(value: object) -> None:
    """Floats (even 28.0), strings, bools and containers are not layer counts."""
    cfg = {**TALKER_CONFIG, "num_hidden_layers": value}
    with pytest.raises(KVConfigError, match=r"talker_config\.num_hidden_layers must be an integer"):
        KVGeometry.from_hf_config({"talker_config": cfg})


@pytest.mark.parametrize("field", ["num_hidden_layers", "num_key_value_heads", "head_dim"])
@pytest.mark.parametrize("value", [0, -8])
def test_hf_config_non_positive_field_is_an_error_naming_it(field: str, value: int) -> None:
    """Zero or negative counts are errors, not silent fallbacks."""
    cfg = {**TALKER_CONFIG, field: value}
    with pytest.raises(KVConfigError, match=rf"talker_config\.{field} must be positive"):
        KVGeometry.from_hf_config({"talker_config": cfg})


def test_hf_config_hidden_size_smaller_than_heads_is_an_error() -> None:
    """A derived head_dim of 0 is reported instead of giving a zero-byte cache."""
    cfg = {"num_hidden_layers": 2, "num_attention_heads": 16, "hidden_size": 8}
    with pytest.raises(KVConfigError, match="hidden_size is smaller than num_attention_heads"):
        KVGeometry.from_hf_config(cfg)


@pytest.mark.parametrize(("layers", "heads", "dim"), [(0, 8, 128), (28, -1, 128), (28, 8, 0)])
def test_geometry_rejects_non_positive_values(layers: int, heads: int, dim: int) -> None:
    """A KVGeometry is only built from positive counts."""
    with pytest.raises(KVConfigError, match="must be positive"):
        KVGeometry(layers, heads, dim)


# ------------------------------------------------------------------ engine objects


def test_engine_object_with_geometry_and_defaults() -> None:
    """block_size 16, dtype bfloat16 and kv_cache_dtype auto apply when the object omits them."""
    verdict = verdict_from_engine_object(
        {
            "kv_cache_bytes": 4 * GiB,
            "max_num_seqs": 8,
            "max_model_len": 4096,
            "geometry": {"num_layers": 28, "num_kv_heads": 8, "head_dim": 128},
            "hardware_class": "jetson",
        }
    )
    assert verdict == kv_verdict(
        QWEN3_TTS_TALKER, kv_cache_bytes=4 * GiB, max_model_len=4096, max_num_seqs=8
    )


def test_engine_object_with_hf_config_and_explicit_settings() -> None:
    """An hf_config is read like a config file and the explicit settings are used."""
    verdict = verdict_from_engine_object(
        {
            "kv_cache_bytes": GiB,
            "max_model_len": 100,
            "block_size": 32,
            "dtype": "float16",
            "kv_cache_dtype": "fp8",
            "hf_config": QWEN3_TTS_CONFIG,
        }
    )
    assert verdict == kv_verdict(
        QWEN3_TTS_TALKER,
        kv_cache_bytes=GiB,
        max_model_len=100,
        block_size=32,
        dtype="float16",
        kv_cache_dtype="fp8",
    )


def test_engine_object_geometry_wins_over_hf_config() -> None:
    """When both are given, the explicit geometry is used."""
    verdict = verdict_from_engine_object(
        {
            "kv_cache_bytes": GiB,
            "max_model_len": 16,
            "geometry": {"num_layers": 1, "num_kv_heads": 1, "head_dim": 1},
            "hf_config": QWEN3_TTS_CONFIG,
        }
    )
    assert verdict.bytes_per_token == 2 * 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kv_cache_bytes": None}, r"^engine object: kv_cache_bytes is missing$"),
        ({"max_model_len": None}, r"^engine object: max_model_len is missing$"),
        ({"geometry": None}, r"^engine object: geometry or hf_config \(an object\) is missing$"),
        ({"geometry": {"num_layers": 28, "head_dim": 128}}, r"geometry\.num_kv_heads is missing"),
        ({"geometry": {"num_layers": 28, "num_kv_heads": 8.0, "head_dim": 128}}, "num_kv_heads"),
        ({"max_num_seqs": "8"}, r"engine object: max_num_seqs must be an integer"),
        ({"block_size": 0}, r"engine object: block_size must be positive"),
        ({"dtype": 2}, r"engine object: dtype must be a string"),
        ({"kv_cache_dtype": "fp4"}, r"unknown kv_cache_dtype 'fp4'"),
        ({"geometry": None, "hf_config": {"num_hidden_layers": 2}}, r"hf config: num_attention"),
    ],
)
def test_engine_object_errors_name_what_is_wrong(change: dict[str, object], message: str) -> None:
    """A missing or invalid engine-object field raises KVConfigError naming it."""
    obj: dict[str, object] = {
        "kv_cache_bytes": GiB,
        "max_num_seqs": 8,
        "max_model_len": 4096,
        "geometry": {"num_layers": 28, "num_kv_heads": 8, "head_dim": 128},
    }
    obj.update(change)
    obj = {key: value for key, value in obj.items() if value is not None}
    with pytest.raises(KVConfigError, match=message):
        verdict_from_engine_object(obj)


# ------------------------------------------------------------------ property


@given(
    layers=st.integers(1, 128),
    heads=st.integers(1, 64),
    head_dim=st.integers(1, 512),
    dtype=st.sampled_from(SPEC_DTYPES),
    kv_cache_bytes=st.integers(1, 2**45),
    max_model_len=st.integers(1, 2**20),
    block_size=st.sampled_from([1, 8, 16, 32, 64, 128, 256]),
    max_num_seqs=st.none() | st.integers(1, 4096),
)
def test_verdict_matches_a_naive_restatement_of_the_formula(
    layers: int,
    heads: int,
    head_dim: int,
    dtype: tuple[str, int],
    kv_cache_bytes: int,
    max_model_len: int,
    block_size: int,
    max_num_seqs: int | None,
) -> None:
    """For any geometry, dtype and sizes, the verdict equals the README's kv-budget formulas
    computed with fractions."""
    name, size = dtype
    per_token = 2 * layers * heads * head_dim * size
    per_seq = ceil(Fraction(max_model_len, block_size)) * block_size * per_token
    max_seqs = floor(Fraction(kv_cache_bytes, per_seq))

    verdict = kv_verdict(
        KVGeometry(layers, heads, head_dim),
        kv_cache_bytes=kv_cache_bytes,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        block_size=block_size,
        kv_cache_dtype=name,
    )

    assert verdict.bytes_per_token == per_token
    assert verdict.bytes_per_seq == per_seq
    assert verdict.max_seqs_without_preemption == max_seqs
    assert verdict.admission_ok == (None if max_num_seqs is None else max_seqs >= max_num_seqs)
