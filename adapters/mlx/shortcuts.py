"""MLX's fast hooks for hb.convert's shortcuts (the rules: hurray_bridge/_shortcuts.py).

An MLX array is read as the NumPy array over its own memory that its buffer protocol
gives, writable, as ``to_hurray`` reads it: MLX evaluates a lazy array before it hands
out its buffer. bfloat16 (a buffer format NumPy cannot read) and an array off the CPU
decline, to the full path. No fast export: every import into MLX copies.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from hurray_bridge._dlpack import DLDeviceType
from hurray_bridge._shortcuts import NDARRAY, Entry, entry

__all__ = ["fast_export", "fast_import"]

_CPU = int(DLDeviceType.kDLCPU)
_BF16 = mx.bfloat16
_asarray = np.asarray


def _ndarray(x: Any) -> Any:
    if x.dtype == _BF16 or x.__dlpack_device__()[0] != _CPU:
        return NotImplemented
    return _asarray(memoryview(x))


def fast_import(tp: type) -> dict[str, Entry | None]:
    """An ``mx.array`` (no subclass) is a host ndarray through its buffer protocol."""
    if tp is not mx.array:
        return {}
    return {NDARRAY: entry(_ndarray)}


def fast_export() -> dict[str, Entry | None]:
    """None: MLX copies every import, which the full path reports."""
    return {}
