"""The CRC-32 of the data checksums: computed, and combined from the CRCs of two parts.

:data:`crc32` is zlib's, or the same function compiled by carry-less multiplication where
``_speedups`` was built; :data:`crc32_combine` joins the CRCs of two consecutive parts
without reading a byte again (the two halves of a split write, a deferred entry's chunks,
a ``.npz`` member's header and data).
"""

from __future__ import annotations

import operator
import zlib
from collections.abc import Callable
from typing import Any

__all__ = ["crc32", "crc32_combine"]



def _fast_crc32() -> Callable[[Any, int], int]:
    """The data checksums' CRC-32: zlib.crc32, or the same function compiled by carry-less
    multiplication where ``_speedups`` was built and the CPU has the instruction (5 to 13
    times as fast as zlib 1.2's; the same value for the same bytes)."""
    try:
        from .. import _speedups
    except ImportError:
        return zlib.crc32
    return _speedups.crc32 if getattr(_speedups, "CRC32_CLMUL", False) else zlib.crc32


crc32 = _fast_crc32()


def _poly_mul(a: int, b: int) -> int:
    """``a * b`` modulo the CRC-32 polynomial, both reflected as the CRC register holds
    them (bit 31 is the coefficient of x^0)."""
    product = 0
    for i in range(32):
        if a & (0x80000000 >> i):
            product ^= b  # a has x^i: add b * x^i
        b = (b >> 1) ^ 0xEDB88320 if b & 1 else b >> 1  # b *= x
    return product


def _py_crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC-32 of ``a + b`` from ``crc1`` of ``a`` and ``crc2`` of ``b`` (``len2`` bytes),
    without reading a byte again: ``crc1`` times x^(8 len2), plus ``crc2`` (the CRC's pre-
    and post-conditioning cancel out). A zip member's checksum from those of its parts;
    the two halves of an entry written at once."""
    # As the compiled one: a negative length would shift right to -1 for ever.
    for name, value, limit in (("crc1", crc1, 32), ("crc2", crc2, 32), ("len2", len2, 64)):
        if not 0 <= operator.index(value) < 1 << limit:
            raise OverflowError(f"crc32_combine: {name} must be in [0, 2**{limit}), "
                                f"got {value}")
    shift, square = 0x80000000, 0x00800000  # x^0, x^8
    while len2:
        if len2 & 1:
            shift = _poly_mul(shift, square)
        square = _poly_mul(square, square)
        len2 >>= 1
    return _poly_mul(shift, crc1) ^ crc2


def _fast_crc32_combine() -> Callable[[int, int, int], int]:
    try:
        from .. import _speedups
    except ImportError:
        return _py_crc32_combine
    return getattr(_speedups, "crc32_combine", _py_crc32_combine)  # (an older build lacks it)


crc32_combine = _fast_crc32_combine()
