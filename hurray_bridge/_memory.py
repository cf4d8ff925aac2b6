"""Host memory the bridge allocates itself: 64-byte aligned, never zero-byte."""

from __future__ import annotations

import ctypes

__all__ = ["ALIGNMENT", "HostAllocation", "alloc_aligned", "host_view"]

ALIGNMENT = 64


class HostAllocation:
    """Owns ``nbytes`` of zeroed host memory starting on a 64-byte boundary."""

    __slots__ = ("__weakref__", "_raw", "nbytes", "ptr")

    def __init__(self, nbytes: int) -> None:
        # Over-allocate and round up: Python's allocator guarantees only 16 bytes.
        raw = (ctypes.c_ubyte * (nbytes + ALIGNMENT - 1))()
        base = ctypes.addressof(raw)
        self._raw = raw
        self.ptr = base + (-base % ALIGNMENT)
        self.nbytes = nbytes


def alloc_aligned(nbytes: int) -> HostAllocation | None:
    """A 64-byte aligned allocation, or ``None`` for 0 bytes (no zero-byte allocation)."""
    if nbytes == 0:
        return None
    return HostAllocation(nbytes)


def host_view(ptr: int, nbytes: int, owner: object, readonly: bool = False) -> memoryview:
    """A flat byte view of host memory that keeps ``owner`` alive as long as it lives."""
    if nbytes == 0:
        return memoryview(b"")
    arr = (ctypes.c_ubyte * nbytes).from_address(ptr)
    arr._hb_owner = owner  # type: ignore[attr-defined]  # ctypes arrays take attributes
    view = memoryview(arr).cast("B")
    return view.toreadonly() if readonly else view
