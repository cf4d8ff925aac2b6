"""NumPy adapter: ``numpy.ndarray`` <-> ``hb.Tensor``.

NumPy's own DLPack refuses bfloat16, float8 and the sub-byte ml_dtypes types;
this adapter reads and builds arrays from their pointer, shape and strides
instead, so every type of the element-type table that ml_dtypes knows comes
through zero-copy. ml_dtypes stores one sub-byte element per byte: those
arrays are Hurray's padded form.

The conversions are the core's host path (``hurray_bridge._host``), which every
adapter shares for host memory: this adapter is that path under NumPy's name.
"""

from __future__ import annotations

import numpy as np

from hurray_bridge import _subbyte
from hurray_bridge._host import check_sizes, dtype_of, from_hurray, native_dtype, to_hurray

__all__ = ["HOLD_HOST_MEMORY",
           "LEGACY_EXPORTS_MUTABLE", "check_sizes", "dtype_of", "from_hurray", "native_dtype",
           "pack_subbyte", "to_hurray", "unpack_subbyte"]

NAME = "numpy"
# A legacy DLPack capsule cannot say "read-only"; the core reads one as read-only unless
# the producer's adapter says otherwise here. NumPy refuses a legacy export of a
# read-only array (BufferError, numpy 2.4), so every legacy capsule it makes is writable.
LEGACY_EXPORTS_MUTABLE = True
"""Whether NumPy's legacy DLPack capsules carry mutable memory (the comment above
says why); the core reads a legacy capsule as read-only unless its adapter says so."""
HOLD_HOST_MEMORY = None
"""Nothing to hold: memory this framework exports stays valid while the export lives."""


def pack_subbyte(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack ``bits``-wide codes (one per byte, low bits) LSB-first into uint8."""
    out: np.ndarray = _subbyte.pack(codes, bits)
    return out


def unpack_subbyte(packed: np.ndarray, count: int, bits: int) -> np.ndarray:
    """Unpack ``count`` LSB-first ``bits``-wide codes to one uint8 per element."""
    out: np.ndarray = _subbyte.unpack(packed, count, bits)
    return out
