"""`edgemon kv-budget`: can the KV cache hold `max_num_seqs` full-length sequences? (README,
"`edgemon kv-budget`")."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgemon.cli.errors import EXIT_NEGATIVE, EXIT_OK, UsageError
from edgemon.cli.sizes import format_size, parse_size
from edgemon.engine.kv import (
    AUTO,
    DTYPE_BYTES,
    KVConfigError,
    KVGeometry,
    dtype_bytes,
    effective_kv_dtype,
    kv_verdict,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from edgemon.engine.kv import KVVerdict

# Where the terminal cannot show them, the verdict's symbols fall back to ASCII.
_ASCII = str.maketrans({"—": "-", "≥": ">="})


def register(subparsers: argparse._SubParsersAction[Any], help_text: str) -> None:
    """Add `kv-budget` to the command line; `help_text` is its line in `edgemon --help`."""
    parser = subparsers.add_parser(
        "kv-budget",
        help=help_text,
        description="Check that an engine's KV cache can hold --max-num-seqs sequences of "
        "--max-model-len tokens without preemption. Exit 0: fits (or no --max-num-seqs); "
        "3: would preempt; 2: bad input.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--hf-config",
        metavar="PATH",
        type=Path,
        help="the model's HF config.json, or its directory (talker_config is used if present)",
    )
    source.add_argument(
        "--geometry",
        metavar="L,H,D",
        type=_geometry,
        help="layers, KV heads and head dimension, e.g. 28,8,128",
    )
    parser.add_argument(
        "--kv-cache-bytes",
        metavar="N",
        type=_size,
        required=True,
        help="KV cache size: bytes, or with a unit B, KiB, MiB, GiB, TiB, KB, MB, GB, TB",
    )
    parser.add_argument(
        "--max-model-len",
        metavar="N",
        type=_count,
        required=True,
        help="tokens of the longest sequence (the engine's max_model_len)",
    )
    parser.add_argument(
        "--max-num-seqs",
        metavar="N",
        type=_count,
        help="sequences the engine runs at once; without it only the capacity is shown",
    )
    parser.add_argument(
        "--block-size",
        metavar="N",
        type=_count,
        default=16,
        help="tokens per KV cache block (default: %(default)s)",
    )
    known = ", ".join(DTYPE_BYTES)
    parser.add_argument(
        "--dtype", default="bfloat16", help=f"model dtype (default: %(default)s): {known}"
    )
    parser.add_argument(
        "--kv-cache-dtype",
        metavar="DTYPE",
        default=AUTO,
        help="KV cache dtype, or auto for the model dtype (default: %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Print the verdict; 0 when it fits (or nothing to check), 3 when it would preempt."""
    geometry: KVGeometry = args.geometry or _geometry_from_file(args.hf_config)
    try:
        verdict = kv_verdict(
            geometry,
            kv_cache_bytes=args.kv_cache_bytes,
            max_model_len=args.max_model_len,
            max_num_seqs=args.max_num_seqs,
            block_size=args.block_size,
            dtype=args.dtype,
            kv_cache_dtype=args.kv_cache_dtype,
        )
    except KVConfigError as exc:
        raise UsageError(str(exc)) from exc
    if args.json:
        print(json.dumps(verdict.as_dict()))
    else:
        _print_ascii_if_needed(_report(verdict, geometry, args))
    return EXIT_NEGATIVE if verdict.admission_ok is False else EXIT_OK


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _count(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def _geometry(text: str) -> KVGeometry:
    expected = f"expected L,H,D (layers, KV heads, head dim) like 28,8,128, got {text!r}"
    try:
        num_layers, num_kv_heads, head_dim = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(expected) from None
    try:
        return KVGeometry(num_layers, num_kv_heads, head_dim)
    except KVConfigError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; {expected}") from exc


def _geometry_from_file(path: Path) -> KVGeometry:
    if path.is_dir():
        path /= "config.json"
    try:
        cfg: object = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path} is not UTF-8 text: {exc.reason}") from exc
    except ValueError as exc:  # json.JSONDecodeError, or an absurdly long integer
        raise UsageError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(cfg, dict):
        raise UsageError(f"{path} must hold a JSON object, not {type(cfg).__name__}")
    try:
        return KVGeometry.from_hf_config(cfg)
    except KVConfigError as exc:
        raise UsageError(f"{path}: {exc}") from exc


def _report(verdict: KVVerdict, geometry: KVGeometry, args: argparse.Namespace) -> str:
    kv_dtype = effective_kv_dtype(args.dtype, args.kv_cache_dtype)
    tokens = verdict.bytes_per_seq // verdict.bytes_per_token
    fits = verdict.max_seqs_without_preemption
    rows: Mapping[str, str] = {
        "geometry": f"{geometry.num_layers} layers, {geometry.num_kv_heads} KV heads, "
        f"head_dim {geometry.head_dim}",
        "KV cache dtype": f"{kv_dtype} ({dtype_bytes(kv_dtype)} bytes; "
        f"dtype {args.dtype}, kv_cache_dtype {args.kv_cache_dtype})",
        "KV cache bytes": _bytes(args.kv_cache_bytes),
        "bytes per token": f"{verdict.bytes_per_token:,}",
        "bytes per sequence": f"{_bytes(verdict.bytes_per_seq)}, {tokens:,} tokens "
        f"in blocks of {args.block_size}",
        "max sequences without preemption": f"{fits:,}",
        "max_num_seqs": "not given"
        if verdict.max_num_seqs is None
        else f"{verdict.max_num_seqs:,}",
    }
    width = max(map(len, rows))
    lines = [f"{label:<{width}}  {value}" for label, value in rows.items()]
    wanted = verdict.max_num_seqs
    if wanted is None:
        lines.append(f"verdict: {fits:,} sequences fit without preemption (no --max-num-seqs)")
    elif verdict.admission_ok:
        lines.append(f"verdict: fits — {fits:,} ≥ {wanted:,}")
    else:
        needed = _bytes(wanted * verdict.bytes_per_seq)
        lines.append(
            f"verdict: would preempt — {fits:,} < {wanted:,}; {wanted:,} sequences need {needed}"
        )
    return "\n".join(lines)


def _bytes(size: int) -> str:
    return f"{size:,} ({format_size(size)})"


def _print_ascii_if_needed(text: str) -> None:
    try:
        text.encode(sys.stdout.encoding or "ascii")
    except UnicodeEncodeError:
        text = text.translate(_ASCII)
    print(text)
