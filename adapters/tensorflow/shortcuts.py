"""TensorFlow's fast hooks for hb.convert's shortcuts (the rules: hurray_bridge/_shortcuts.py).

Measured on tensorflow 2.21 (``python -m benchmarks tensorflow``, 1000 float32, a shared
and loaded 2-core machine): the full path cost 16-25 us from a TensorFlow tensor (its
capsule read through ctypes; ~5 us through the buffer protocol since) and ~9 us into one,
against 0.5-4.8 us for TensorFlow's own zero-copy paths. With these hooks, in two runs:
1.0-1.8x np.asarray to NumPy, 0.4-1.4x torch.from_dlpack to torch, 1.1-1.8x TensorFlow's
from_dlpack from NumPy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from hurray_bridge._shortcuts import NDARRAY, READONLY_CAPSULE, Entry, entry

from . import _EAGER, _alignment, _tables, by_value

__all__ = ["fast_export", "fast_import"]

_asarray = np.asarray
_from_dlpack = tf.experimental.dlpack.from_dlpack
_BOOL = np.dtype(np.bool_)


def _on_host(x: Any) -> bool:
    # GPU tensors take the full path (their memory is not the host's); this is the
    # device string TensorFlow keeps, read without a call into its runtime.
    return bool(x.device.endswith("CPU:0"))


if hasattr(_EAGER, "_datatype_enum"):
    # A tensor's type as its enum, read without building a tf.DType: 0.07 us against
    # 0.5 us for x.dtype and its hash, which was a third of the NumPy hand-off. Private to
    # TensorFlow: a release without it takes the public x.dtype.
    def _type_key(x: Any) -> Any:
        return x._datatype_enum()

    def _key(t: Any) -> Any:
        return t.as_datatype_enum
else:  # pragma: no cover - a TensorFlow without the private reader
    def _type_key(x: Any) -> Any:
        return x.dtype

    def _key(t: Any) -> Any:
        return t


def _ndarray_of(types: frozenset[Any]) -> Any:
    """The NumPy import of eager tensors of ``types`` (tf.DTypes)."""
    keys = frozenset(_key(t) for t in types)

    def tf_to_ndarray(x: Any) -> Any:
        # TensorFlow's buffer protocol: a read-only view of the tensor's own buffer that
        # keeps the tensor alive, as the full path's view does. bfloat16 has no buffer
        # format ("cannot include dtype 'E' in a buffer"): not among ``types``.
        if _type_key(x) not in keys or not _on_host(x):
            return NotImplemented
        return _asarray(memoryview(x))

    return tf_to_ndarray


def _capsule_of(types: frozenset[Any]) -> Any:
    """The read-only capsule import of eager tensors of ``types``."""
    keys = frozenset(_key(t) for t in types)

    def tf_to_capsule(x: Any) -> Any:
        # TensorFlow's legacy capsule of its own buffer: memory that must never be
        # written. Other types (strings: its export aborts) take the full path.
        if _type_key(x) not in keys or not _on_host(x):
            return NotImplemented
        return x.__dlpack__()

    return tf_to_capsule


def fast_import(tp: type) -> dict[str, Entry | None]:
    """An eager tensor as a read-only host ndarray and as a read-only capsule (not a
    subclass, nor a variable: the full path reads those differently)."""
    if tp is not _EAGER:
        return {}
    types = frozenset(t for d, t in _tables()[0].items() if d not in by_value())
    return {NDARRAY: entry(_ndarray_of(types - {tf.bfloat16})),
            READONLY_CAPSULE: entry(_capsule_of(types))}


def _from_ndarray() -> Entry:
    by_np = {np.dtype(t.as_numpy_dtype): t for d, t in _tables()[0].items()
             if d not in by_value()}
    align = _alignment()

    def ndarray_to_tf(a: Any) -> Any:
        # What from_hurray shares without a copy: writable, compact, aligned memory of a
        # type TensorFlow's DLPack carries, bool bytes 0 and 1 only. Anything else (and
        # empty arrays) takes the full path, which copies and reports it, or refuses.
        flags = a.flags
        if not (flags.writeable and flags.c_contiguous and a.size) or a.dtype not in by_np:
            return NotImplemented
        if a.__array_interface__["data"][0] % align:
            return NotImplemented
        if a.dtype == _BOOL and int(a.view(np.uint8).max()) > 1:
            return NotImplemented
        return _from_dlpack(a.__dlpack__())

    return entry(ndarray_to_tf)


def fast_export() -> dict[str, Entry | None]:
    """An eager tensor from a host ndarray, through TensorFlow's DLPack import."""
    return {NDARRAY: _from_ndarray()}
