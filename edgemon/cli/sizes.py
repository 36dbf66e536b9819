"""Byte sizes on the command line: `4GiB`, `512MiB`, `1.5GiB`, `8GB`, `4096`."""

from __future__ import annotations

import re
from fractions import Fraction
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

#: Accepted unit suffixes, case-sensitive: IEC units are powers of 1024, SI units of 1000.
UNITS: Mapping[str, int] = MappingProxyType(
    {
        "": 1,
        "B": 1,
        "KiB": 1024,
        "MiB": 1024**2,
        "GiB": 1024**3,
        "TiB": 1024**4,
        "KB": 1000,
        "kB": 1000,
        "MB": 1000**2,
        "GB": 1000**3,
        "TB": 1000**4,
    }
)

_SIZE = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[A-Za-z]*)")
_ACCEPTED = "a number with an optional unit B, KiB, MiB, GiB, TiB (1024) or KB, MB, GB, TB (1000)"


def parse_size(text: str) -> int:
    """Whole bytes in `text`; ValueError saying what is accepted when it is not a size."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"invalid size {text!r}: expected {_ACCEPTED}")
    unit = match["unit"]
    if unit not in UNITS:
        raise ValueError(f"invalid size {text!r}: unknown unit {unit!r}; expected {_ACCEPTED}")
    size = Fraction(match["number"]) * UNITS[unit]
    if size.denominator != 1:
        raise ValueError(f"invalid size {text!r}: not a whole number of bytes")
    return int(size)


def format_size(size: int) -> str:
    """`size` in the largest IEC unit it reaches, e.g. `448 MiB`, `1.5 GiB`, `900 B`."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        if size >= UNITS[unit]:
            return f"{size / UNITS[unit]:.4g} {unit}"
    return f"{size} B"
