"""Arrow's fast hooks for hb.convert's shortcuts (the rules: hurray_bridge/_shortcuts.py)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from hurray_bridge._shortcuts import EXPORTER, READONLY_CAPSULE, Entry, entry

__all__ = ["fast_export", "fast_import"]

# Exact classes of the numeric types DLPack carries: bool (bit-packed), timestamps,
# dictionaries and extension types have their own classes.
_NUMERIC = frozenset({
    pa.Int8Array, pa.Int16Array, pa.Int32Array, pa.Int64Array, pa.UInt8Array,
    pa.UInt16Array, pa.UInt32Array, pa.UInt64Array, pa.HalfFloatArray, pa.FloatArray,
    pa.DoubleArray,
})


def _capsule(x: Any) -> Any:
    # Arrow refuses arrays with nulls; device memory the full path copies to the host.
    if x.null_count or not x.is_cpu:
        return NotImplemented
    # A capsule skips the consumer's device negotiation (half of torch's import).
    return x.__dlpack__(max_version=(1, 0))


def fast_import(tp: type) -> dict[str, Entry | None]:
    """A numeric Arrow array is a DLPack exporter of immutable memory."""
    if tp not in _NUMERIC:
        return {}
    return {EXPORTER: None, READONLY_CAPSULE: entry(_capsule)}


def fast_export() -> dict[str, Entry | None]:
    """Rank 1 exporters through pa.Array.from_dlpack (other ranks become Arrow tensors);
    it refuses strided memory, bool (bit-packed in Arrow) and complex."""
    return {EXPORTER: entry(pa.Array.from_dlpack, guard=("ndim", 1))}
