"""KV-cache admission (README's kv-budget): can the cache hold `max_num_seqs` full-length sequences?

Pure integer arithmetic on plain values. Input that cannot be trusted (an HF config, an engine
object from the wire) is checked field by field; anything missing, non-integer or unknown
raises `KVConfigError` naming the field, instead of being guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from edgemon.errors import EdgemonError

if TYPE_CHECKING:
    from collections.abc import Mapping

#: Bytes per element of each dtype name an engine may report (README's kv-budget).
DTYPE_BYTES: Mapping[str, int] = MappingProxyType(
    {
        "float32": 4,
        "float16": 2,
        "half": 2,
        "bfloat16": 2,
        "fp8": 1,
        "fp8_e4m3": 1,
        "fp8_e5m2": 1,
        "float8_e4m3fn": 1,
        "float8_e5m2": 1,
        "int8": 1,
    }
)

#: `kv_cache_dtype` value meaning "the same as the model dtype".
AUTO = "auto"


class KVConfigError(EdgemonError, ValueError):
    """A KV geometry, size or dtype is missing or invalid; the message names the field."""


#: Largest accepted input: exact as a float, and small enough that every product of the
#: formulas stays far inside the float range the metrics export (2**53 ** 4 < 1e308).
MAX_INPUT = 2**53


def _positive_int(value: object, name: str) -> int:
    """`value` if it is an int in 1..2**53 (not a bool, not a float), else an error naming it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise KVConfigError(f"{name} must be an integer, got {value!r}")
    if value <= 0:
        raise KVConfigError(f"{name} must be positive, got {value}")
    if value > MAX_INPUT:
        raise KVConfigError(f"{name} is absurdly large (> 2**53)")
    return value


def _required(obj: Mapping[str, object], key: str, where: str) -> object:
    """`obj[key]`, treating an absent key and a JSON null alike as missing."""
    value = obj.get(key)
    if value is None:
        raise KVConfigError(f"{where}{key} is missing")
    return value


@dataclass(frozen=True, slots=True)
class KVGeometry:
    """The attention shape that sizes the KV cache: layers, KV heads and head dimension."""

    num_layers: int
    num_kv_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim"):
            _positive_int(getattr(self, name), name)

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, object]) -> KVGeometry:
        """Talker geometry of a Qwen3-TTS HF config, or the root's for a plain decoder."""
        talker = cfg.get("talker_config")
        section: Mapping[str, object] = talker if isinstance(talker, dict) else cfg
        where = "hf config: talker_config." if isinstance(talker, dict) else "hf config: "

        def field(key: str) -> int:
            return _positive_int(_required(section, key, where), f"{where}{key}")

        def optional(key: str) -> int | None:
            if section.get(key) is None:
                return None
            return _positive_int(section[key], f"{where}{key}")

        num_layers = field("num_hidden_layers")
        num_kv_heads = optional("num_key_value_heads") or field("num_attention_heads")
        head_dim = optional("head_dim")
        if head_dim is None:
            head_dim = field("hidden_size") // field("num_attention_heads")
            if head_dim == 0:
                raise KVConfigError(
                    f"{where}hidden_size is smaller than num_attention_heads; set head_dim"
                )
        return cls(num_layers, num_kv_heads, head_dim)


def dtype_bytes(name: str, *, what: str = "dtype") -> int:
    """Bytes per element of dtype `name`; `what` names the setting in the error message."""
    try:
        return DTYPE_BYTES[name]
    except KeyError:
        known = ", ".join(DTYPE_BYTES)
        raise KVConfigError(f"unknown {what} {name!r}; known: {known}") from None


def effective_kv_dtype(dtype: str, kv_cache_dtype: str) -> str:
    """The dtype the KV cache is stored in: `kv_cache_dtype`, or the model's when "auto"."""
    return dtype if kv_cache_dtype == AUTO else kv_cache_dtype


@dataclass(frozen=True, slots=True)
class KVVerdict:
    """How many full-length sequences fit, and whether `max_num_seqs` of them do."""

    bytes_per_token: int
    bytes_per_seq: int
    max_seqs_without_preemption: int
    max_num_seqs: int | None
    admission_ok: bool | None  # None when max_num_seqs is None

    def as_dict(self) -> dict[str, int | bool | None]:
        """The `edgemon kv-budget --json` object (README)."""
        return {
            "bytes_per_token": self.bytes_per_token,
            "bytes_per_seq": self.bytes_per_seq,
            "max_seqs_without_preemption": self.max_seqs_without_preemption,
            "max_num_seqs": self.max_num_seqs,
            "admission_ok": self.admission_ok,
        }


def kv_verdict(
    geometry: KVGeometry,
    *,
    kv_cache_bytes: int,
    max_model_len: int,
    max_num_seqs: int | None = None,
    block_size: int = 16,
    dtype: str = "bfloat16",
    kv_cache_dtype: str = AUTO,
) -> KVVerdict:
    """The README's kv-budget verdict; every argument is checked and an error names the bad one."""
    _positive_int(kv_cache_bytes, "kv_cache_bytes")
    _positive_int(max_model_len, "max_model_len")
    _positive_int(block_size, "block_size")
    if max_num_seqs is not None:
        _positive_int(max_num_seqs, "max_num_seqs")
    dtype_bytes(dtype)  # the model dtype must be known even when the KV dtype overrides it
    element_bytes = dtype_bytes(effective_kv_dtype(dtype, kv_cache_dtype), what="kv_cache_dtype")

    bytes_per_token = (
        2 * geometry.num_layers * geometry.num_kv_heads * geometry.head_dim * element_bytes
    )
    blocks_per_seq = -(-max_model_len // block_size)
    bytes_per_seq = blocks_per_seq * block_size * bytes_per_token
    max_seqs = kv_cache_bytes // bytes_per_seq if bytes_per_seq > 0 else 0
    return KVVerdict(
        bytes_per_token=bytes_per_token,
        bytes_per_seq=bytes_per_seq,
        max_seqs_without_preemption=max_seqs,
        max_num_seqs=max_num_seqs,
        admission_ok=None if max_num_seqs is None else max_seqs >= max_num_seqs,
    )


def verdict_from_engine_object(obj: Mapping[str, object]) -> KVVerdict:
    """The verdict for an engine object (docs/protocol.md); `geometry` wins over `hf_config`."""
    where = "engine object: "

    def optional_int(key: str) -> int | None:
        value = obj.get(key)
        return None if value is None else _positive_int(value, f"{where}{key}")

    def required_int(key: str) -> int:
        return _positive_int(_required(obj, key, where), f"{where}{key}")

    def text(key: str, default: str) -> str:
        value = obj.get(key, default)
        if not isinstance(value, str):
            raise KVConfigError(f"{where}{key} must be a string, got {value!r}")
        return value

    shape = obj.get("geometry")
    hf_config = obj.get("hf_config")
    if isinstance(shape, dict):
        at = f"{where}geometry."
        geometry = KVGeometry(
            *(
                _positive_int(_required(shape, key, at), f"{at}{key}")
                for key in ("num_layers", "num_kv_heads", "head_dim")
            )
        )
    elif isinstance(hf_config, dict):
        geometry = KVGeometry.from_hf_config(hf_config)
    else:
        raise KVConfigError(f"{where}geometry or hf_config (an object) is missing")

    return kv_verdict(
        geometry,
        kv_cache_bytes=required_int("kv_cache_bytes"),
        max_model_len=required_int("max_model_len"),
        max_num_seqs=optional_int("max_num_seqs"),
        block_size=optional_int("block_size") or 16,
        dtype=text("dtype", "bfloat16"),
        kv_cache_dtype=text("kv_cache_dtype", AUTO),
    )
