"""JAX's fast hooks for hb.convert's shortcuts (the rules: hurray_bridge/_shortcuts.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

from hurray_bridge._capsule import make_capsule
from hurray_bridge._host import bool8_dirty
from hurray_bridge._shortcuts import NDARRAY, RAW, READONLY_CAPSULE, Entry, entry
from hurray_bridge.dtypes import DLPACK_CODE
from hurray_bridge.tensor import _COMPACT, _compact

from . import _CPU, import_obstacle, raw_import_types, raw_route

__all__ = ["fast_export", "fast_import"]


def _is_jax_array(tp: type) -> bool:
    """Whether ``tp`` is jax.Array's one concrete class (its module moved between jaxlib
    releases): the only type these shortcuts serve."""
    return tp.__name__ == "ArrayImpl" and tp.__module__.startswith("jaxlib")


_asarray = np.asarray


def _ndarray(x: Any) -> Any:
    # The full path's own pin: memoryview waits for the value and holds the buffer
    # against delete/donation. It refuses non-CPU arrays, deleted ones and the types
    # without a buffer format (bfloat16, float8, int4).
    return _asarray(memoryview(x))


def _capsule(x: Any) -> Any:
    # Accelerator memory takes the full path, which negotiates a stream with the
    # consumer. JAX's export holds the buffer against delete/donation as the full
    # path's pin does, for every type (bfloat16 too, which has no buffer format); it
    # refuses deleted, multi-device and int4/int2 arrays. (is_deleted first: jaxlib
    # 0.10.2 segfaults on platform() of a deleted array.)
    if x.is_deleted() or x.platform() != "cpu":
        return NotImplemented
    return x.__dlpack__()


def fast_import(tp: type) -> dict[str, Entry | None]:
    """A jax.Array as a host ndarray (through the full path's pin) and as a read-only
    capsule (JAX memory is immutable)."""
    if not _is_jax_array(tp):
        return {}
    return {NDARRAY: entry(_ndarray), READONLY_CAPSULE: entry(_capsule)}


def _from_raw() -> Entry | None:
    try:
        if raw_route(_CPU, 0) is None:
            return None  # this jaxlib has no raw import: the full path's public API
    except Exception:
        return None
    # By DLPack (code, bits), the types the full path hands to JAX's import as they are.
    types = frozenset(d.dlpack for d in raw_import_types() if d.dlpack is not None)
    bool_code = (int(DLPACK_CODE.kDLBool), 8)  # one byte per element

    def jax_from_raw(raw: Any) -> Any:
        # The decisions from_hurray makes for an hb.Tensor of this memory (import_obstacle,
        # raw_route), declining where it would copy or take the public API.
        data, shape, strides, code, bits, device_type, device_id, owner, exporter = raw
        if (code, bits) not in types:
            return NotImplemented
        if device_type == _CPU:
            n = 1
            for d in shape:
                n *= d
            if n and import_obstacle(shape, strides, _CPU, data) is not None:
                return NotImplemented
            if (code, bits) == bool_code and bool8_dirty(data, n, owner):
                return NotImplemented  # JAX misreads such bytes: the full path normalises
            route = raw_route(_CPU, 0)
            if route is None:
                return NotImplemented
            if strides is None:
                strides = _COMPACT.get(shape) or _compact(shape)
            # Our capsule, not the producer's: its deleter never asks for the GIL while
            # the interpreter exits (torch's does for memory Python owns, from_numpy's),
            # which an XLA thread releasing it then would turn into an abort.
            capsule = make_capsule(data=data, shape=shape, strides=strides, code=code,
                                   bits=bits, device_type=_CPU, device_id=0, flags=0,
                                   owner=owner, versioned=False)
            return route[0](capsule, route[1], None, None, _CPU)
        if strides is not None and import_obstacle(shape, strides, device_type) is not None:
            return NotImplemented  # the full path's refusal, in its words
        route = raw_route(device_type, device_id)
        if route is None:
            return NotImplemented
        imp, device, stream = route
        # The producer orders its pending work before JAX's stream (DLPack).
        return imp(exporter.__dlpack__(stream=stream), device, stream, None, device_type)

    return entry(jax_from_raw)


def fast_export() -> dict[str, Entry | None]:
    """A jax.Array from raw memory, through JAX's raw import (where this jaxlib has one)."""
    made = _from_raw()
    return {} if made is None else {RAW: made}
