"""hb.convert shortcuts from Arrow arrays (the rules: hurray_bridge/_shortcuts.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from hurray_bridge._shortcuts import Entry, entry

__all__ = ["makers"]

# Exact classes of the numeric types DLPack carries: bool (bit-packed), timestamps,
# dictionaries and extension types have their own classes.
_NUMERIC = frozenset({
    pa.Int8Array, pa.Int16Array, pa.Int32Array, pa.Int64Array, pa.UInt8Array,
    pa.UInt16Array, pa.UInt32Array, pa.UInt64Array, pa.HalfFloatArray, pa.FloatArray,
    pa.DoubleArray,
})


def _to_numpy(tp: type) -> Entry | None:
    if tp not in _NUMERIC:
        return None
    import numpy as np

    # Arrow exports a read-only capsule, and NumPy honours it - except for empty
    # arrays, which it makes writable (hence nonempty). Arrow refuses arrays with
    # nulls; copy=False (never a copy on CPU anyway) keeps NumPy from retrying the
    # legacy protocol after that refusal, which would draw Arrow's deprecation
    # warning before the full path's own error. (A null_count guard costs 20 %.)
    return entry(np.from_dlpack, kwargs={"copy": False}, nonempty=True)


def _to_torch(tp: type) -> Entry | None:
    if tp not in _NUMERIC:
        return None
    import torch

    from ..torch import warn_readonly

    from_dlpack = torch.from_dlpack

    def arrow_to_torch(x: Any) -> Any:
        if x.null_count or not x.is_cpu:
            return NotImplemented
        # A capsule skips torch.from_dlpack's device negotiation (half its time).
        out = from_dlpack(x.__dlpack__(max_version=(1, 0)))
        if out.numel():
            warn_readonly()  # Arrow memory is immutable; the full path's notice, once
        return out

    return entry(arrow_to_torch)


def makers() -> dict[str, Callable[[type], Entry | None]]:
    """Target adapter -> maker of the shortcut for an exact source type (None: none)."""
    return {"numpy": _to_numpy, "torch": _to_torch}
