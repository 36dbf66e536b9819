"""Byte sizes on the command line: strict units, whole bytes, clear errors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgemon.cli.sizes import UNITS, format_size, parse_size


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4096", 4096),
        ("0", 0),
        ("100B", 100),
        ("1KiB", 1024),
        ("512MiB", 512 * 1024**2),
        ("4GiB", 4 * 1024**3),
        ("1.5GiB", 1_610_612_736),
        ("2TiB", 2 * 1024**4),
        ("1KB", 1000),
        ("1kB", 1000),
        ("250MB", 250_000_000),
        ("8GB", 8_000_000_000),
        ("1TB", 10**12),
        ("0.5KiB", 512),
        ("4 GiB", 4 * 1024**3),
        (" 4GiB ", 4 * 1024**3),
    ],
)
def test_accepted_sizes(text: str, size: int) -> None:
    """Plain byte counts and IEC (1024) or SI (1000) units give exact whole bytes."""
    assert parse_size(text) == size


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("4G", "unknown unit 'G'"),
        ("4g", "unknown unit 'g'"),
        ("4gib", "unknown unit 'gib'"),
        ("4GIB", "unknown unit 'GIB'"),
        ("4 bytes", "unknown unit 'bytes'"),
        ("GiB", "invalid size 'GiB'"),
        ("", "invalid size ''"),
        ("-1", "invalid size '-1'"),
        ("-1GiB", "invalid size '-1GiB'"),
        ("1e9", "invalid size '1e9'"),
        (".5GiB", "invalid size '.5GiB'"),
        ("4GiB4", "invalid size '4GiB4'"),
        ("1,024", "invalid size '1,024'"),
        ("0.5B", "not a whole number of bytes"),
        ("1.0001KiB", "not a whole number of bytes"),
    ],
)
def test_rejected_sizes_say_why_and_what_is_accepted(text: str, message: str) -> None:
    """Unknown units (including `4G`), signs, exponents and fractional bytes are rejected."""
    with pytest.raises(ValueError, match=message) as caught:
        parse_size(text)
    if "whole number" not in message:
        assert "KiB, MiB, GiB, TiB" in str(caught.value)
        assert "KB, MB, GB, TB" in str(caught.value)


@given(count=st.integers(0, 10**6), unit=st.sampled_from(sorted(UNITS)))
def test_integer_count_of_any_unit_is_exact(count: int, unit: str) -> None:
    """`<n><unit>` is exactly n times the unit's size, for every accepted unit."""
    assert parse_size(f"{count}{unit}") == count * UNITS[unit]


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1 KiB"),
        (469_762_048, "448 MiB"),
        (1_610_612_736, "1.5 GiB"),
        (4 * 1024**3, "4 GiB"),
        (3 * 1024**4, "3 TiB"),
    ],
)
def test_format_size_uses_the_largest_iec_unit(size: int, text: str) -> None:
    """Sizes are shown in the largest binary unit they reach, without trailing zeros."""
    assert format_size(size) == text
