"""MLX's fast hooks for hb.convert's shortcuts (the rules: hurray_bridge/_shortcuts.py).

An MLX array is read as the ndarray the full path gives of it: ``to_hurray``'s export
(which keeps the array's memory alive, see there) viewed by the core's host view
(``_host.tensor_view``). That view declines strided and empty arrays, and bfloat16 and an
array off the CPU decline here: the full path takes them. No fast export: every import
into MLX copies.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from hurray_bridge._dlpack import DLDeviceType
from hurray_bridge._host import tensor_view
from hurray_bridge._shortcuts import NDARRAY, Entry, entry

from . import to_hurray

__all__ = ["fast_export", "fast_import"]

_CPU = int(DLDeviceType.kDLCPU)
_BF16 = mx.bfloat16


def _ndarray(x: Any) -> Any:
    if x.dtype == _BF16 or x.__dlpack_device__()[0] != _CPU:
        return NotImplemented
    return tensor_view(to_hurray(x))


def fast_import(tp: type) -> dict[str, Entry | None]:
    """An ``mx.array`` (no subclass) is a host ndarray through its export."""
    if tp is not mx.array:
        return {}
    return {NDARRAY: entry(_ndarray)}


def fast_export() -> dict[str, Entry | None]:
    """None: MLX copies every import, which the full path reports."""
    return {}
