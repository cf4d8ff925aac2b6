"""The one sub-byte packing kernel: LSB-first codes across the whole tensor (ADR-011).

Element ``i`` of a ``bits``-wide type (1, 2 or 4 bits) lives in byte ``i * bits // 8``
at bit ``i * bits % 8``, counted from the least significant bit; the bits after the
last element are zero. Every packer and unpacker of the bridge calls this module:

* :func:`pack` / :func:`unpack` - NumPy arrays (through the core's NumPy shim), the
  host path of every adapter, the quantization code and the shard assembler;
* :func:`unpack_lanes` - the same arithmetic for any array namespace with
  broadcasting (torch on a GPU, CuPy), given that namespace's shift vector;
* :func:`shift_bits` - a run of bits moved to a byte boundary (Arrow's bit-packed
  booleans start at any bit offset).
"""

from __future__ import annotations

from typing import Any

from ._numpy import numpy

__all__ = ["lane_shifts", "pack", "shift_bits", "unpack", "unpack_lanes"]


def lane_shifts(bits: int) -> list[int]:
    """The shift of each element within its byte: ``[0, bits, 2 * bits, ...]``."""
    return list(range(0, 8, bits))


def pack(codes: Any, bits: int, out: Any = None) -> Any:
    """Pack ``codes`` (one per byte, low ``bits`` significant, any shape) LSB-first.

    Into ``out`` (a zeroed uint8 array of ``ceil(n * bits / 8)`` bytes; bits are OR-ed
    in) when given, else into a new array. Bits above ``bits`` in a code are ignored.
    """
    np = numpy()
    per = 8 // bits
    flat = np.ascontiguousarray(codes).reshape(-1).view(np.uint8)
    n = flat.size
    if out is None:
        out = np.zeros(-(-n // per), np.uint8)
    mask = np.uint8((1 << bits) - 1)
    full = n // per
    if full:
        lanes = flat[: full * per].reshape(full, per)
        head = out[:full]
        for j in range(per):  # at most 8 vectorised passes
            head |= (lanes[:, j] & mask) << np.uint8(j * bits)
    for j in range(n - full * per):  # the last byte's fewer than ``per`` elements
        out[full] |= (flat[full * per + j] & mask) << np.uint8(j * bits)
    return out


def unpack(packed: Any, count: int, bits: int, out: Any = None) -> Any:
    """The first ``count`` codes of LSB-first ``packed`` bytes (an array or a bytes-like
    object), one uint8 per element.

    Into ``out`` (``count`` uint8, contiguous) when given, else a new 1-D array.
    """
    np = numpy()
    src = (np.frombuffer(packed, np.uint8) if isinstance(packed, (bytes, bytearray, memoryview))
           else np.asarray(packed, np.uint8).reshape(-1))
    if out is None:
        return unpack_lanes(src, count, bits, np.array(lane_shifts(bits), np.uint8))
    per = 8 // bits
    mask = np.uint8((1 << bits) - 1)
    full = count // per
    if full:
        lanes = out[: full * per].reshape(full, per)
        for j in range(per):
            np.bitwise_and(src[:full] >> np.uint8(j * bits), mask, out=lanes[:, j])
    for j in range(count - full * per):
        out[full * per + j] = (src[full] >> np.uint8(j * bits)) & mask
    return out


def unpack_lanes(packed: Any, count: int, bits: int, shifts: Any) -> Any:
    """:func:`unpack` for any array namespace: ``packed`` a 1-D uint8 array, ``shifts``
    the same namespace's uint8 array of :func:`lane_shifts` (on the same device)."""
    return ((packed[:, None] >> shifts) & ((1 << bits) - 1)).reshape(-1)[:count]


def shift_bits(raw: bytes, bit_offset: int, n: int) -> bytes:
    """``n`` bits of ``raw`` starting ``bit_offset`` bits in, moved to bit 0 (LSB-first on
    both sides), the bits after them zero: ``ceil(n / 8)`` bytes."""
    # A Python int does the whole shift in one C loop: no per-bit Python work.
    bits = (int.from_bytes(raw, "little") >> bit_offset) & ((1 << n) - 1)
    return bits.to_bytes(-(-n // 8), "little")
