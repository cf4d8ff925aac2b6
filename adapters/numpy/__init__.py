"""NumPy adapter: ``numpy.ndarray`` <-> ``hb.Tensor``.

NumPy's own DLPack refuses bfloat16, float8 and the sub-byte ml_dtypes types;
this adapter reads and builds arrays from their pointer, shape and strides
instead, so every type of the element-type table that ml_dtypes knows comes
through zero-copy. ml_dtypes stores one sub-byte element per byte: those
arrays are Hurray's padded form.

The conversions are the core's host path (``hurray_bridge._host``), which every
adapter shares for host memory: this adapter is that path under NumPy's name. It
exports the adapter contract's names and no other (docs/impl/adapters.md).
"""

from __future__ import annotations

import warnings
from typing import Any

from hurray_bridge import _host, _subbyte
from hurray_bridge._dlpack import DLDeviceType
from hurray_bridge._host import dtype_of, from_hurray, native_dtype, native_dtypes, to_hurray

__all__ = ["DEFERRED_SAVE", "DEVICES", "HOLDS", "HOLD_HOST_MEMORY", "LEGACY_EXPORTS_MUTABLE",
           "NAME", "dtype_of", "fast_export", "fast_import", "from_hurray", "native_dtype",
           "native_dtypes", "special_kind", "to_hurray"]

NAME = "numpy"
"""The target name: ``hb.convert(x, "numpy")``."""
HOLDS = frozenset({"dense", "sparse"})
"""Dense arrays, and SciPy's sparse arrays and matrices (``.sparse``)."""
DEVICES = frozenset({int(DLDeviceType.kDLCPU)})
"""The host only (kDLCPU): device memory is copied to the host."""
# A legacy DLPack capsule cannot say "read-only"; the core reads one as read-only unless
# the producer's adapter says otherwise here. NumPy refuses a legacy export of a
# read-only array (BufferError, numpy 2.4), so every legacy capsule it makes is writable.
LEGACY_EXPORTS_MUTABLE = True
"""Whether NumPy's legacy DLPack capsules carry mutable memory (the comment above
says why); the core reads a legacy capsule as read-only unless its adapter says so."""
HOLD_HOST_MEMORY = None
"""Nothing to hold: memory this framework exports stays valid while the export lives."""
DEFERRED_SAVE = None
"""Saves of its objects are written by the saving process (nothing deferred)."""


def special_kind(obj: Any) -> str | None:
    """None: every NumPy object ``to_hurray`` refuses stays refused (SciPy's sparse
    objects are told apart by their type before this adapter sees them)."""
    return None


def fast_import(tp: type) -> dict[str, Any]:
    """hb.convert's fast import for NumPy arrays (``.shortcuts``)."""
    from .shortcuts import fast_import as hook

    return hook(tp)


def fast_export() -> dict[str, Any]:
    """hb.convert's fast export to NumPy arrays (``.shortcuts``)."""
    from .shortcuts import fast_export as hook

    return hook()


# Names this adapter exported before the adapter contract; still importable, with a
# DeprecationWarning that names their home now.
_MOVED = {
    "pack_subbyte": (_subbyte.pack, "hb.pack_subbyte, which packs an hb.Tensor"),
    "unpack_subbyte": (_subbyte.unpack, "hb.unpack_subbyte, which unpacks an hb.Tensor"),
    "check_sizes": (_host.check_sizes, "hb.convert(t, 'numpy'), which refuses such shapes"),
}


def __getattr__(name: str) -> Any:
    try:
        value, instead = _MOVED[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    warnings.warn(f"hurray_bridge.adapters.numpy.{name} is deprecated (adapters export only "
                  f"the adapter contract's names); use {instead}", DeprecationWarning,
                  stacklevel=2)
    return value
