"""Host memory: what the bridge allocates itself (64-byte aligned, never zero-byte), and
whether memory from elsewhere may be written at all (:func:`write_protected`)."""

from __future__ import annotations

import ctypes
import mmap as _mmap
import sys
from collections.abc import Callable, Sequence
from math import prod
from typing import Any

from ._numpy import numpy

__all__ = ["ALIGNMENT", "MAPPED_BYTES", "HostAllocation", "aligned_zeros", "alloc_aligned",
           "buffer_address", "host_array", "host_view", "write_protected"]

ALIGNMENT = 64


MAPPED_BYTES = 1 << 20
"""From this size, ``alloc_aligned(n, filled=True)`` takes fresh pages from the OS."""


class HostAllocation:
    """Owns ``nbytes`` of zeroed host memory starting on a 64-byte boundary."""

    __slots__ = ("__weakref__", "_raw", "nbytes", "ptr")

    def __init__(self, nbytes: int, mapped: bool = False) -> None:
        if mapped:
            try:
                # An anonymous map: page-aligned zero pages the kernel supplies on first
                # write. The allocator's calloc zeroes (so faults in) every page of memory
                # it reuses, and a buffer about to be filled was then written twice.
                raw = (ctypes.c_ubyte * nbytes).from_buffer(_mmap.mmap(-1, nbytes))
            except OSError:  # out of maps (vm.max_map_count) or address space: as below
                pass
            else:
                self._raw = raw  # keeps the map (its export) alive; unmapped with it
                self.ptr = ctypes.addressof(raw)
                self.nbytes = nbytes
                return
        # Over-allocate and round up: Python's allocator guarantees only 16 bytes.
        raw = (ctypes.c_ubyte * (nbytes + ALIGNMENT - 1))()
        base = ctypes.addressof(raw)
        self._raw = raw
        self.ptr = base + (-base % ALIGNMENT)
        self.nbytes = nbytes


def alloc_aligned(nbytes: int, *, filled: bool = False) -> HostAllocation | None:
    """A 64-byte aligned allocation, or ``None`` for 0 bytes (no zero-byte allocation).

    ``filled``: the caller writes every byte at once (a read from a file); from
    :data:`MAPPED_BYTES` the memory is then a fresh anonymous map, whose pages are
    written once instead of zeroed first.
    """
    if nbytes == 0:
        return None
    if nbytes > sys.maxsize - ALIGNMENT:
        from .errors import UnsupportedError

        raise UnsupportedError(
            f"cannot allocate {nbytes} bytes: more than this machine's address space holds "
            f"(at most {sys.maxsize} bytes in one object); a broadcast view that large cannot "
            "be copied")
    return HostAllocation(nbytes, filled and nbytes >= MAPPED_BYTES)


# ctypes array type per length: ``c_ubyte * n`` goes through ctypes' own type cache,
# which costs several times this dictionary lookup.
_byte_arrays: dict[int, Any] = {}


def _byte_array(nbytes: int) -> Any:
    if len(_byte_arrays) >= 4096:
        _byte_arrays.clear()
    tp = _byte_arrays[nbytes] = ctypes.c_ubyte * nbytes
    return tp


def host_array(ptr: int, nbytes: int, owner: object) -> Any:
    """A writable ``c_ubyte`` array over ``nbytes`` of host memory that keeps ``owner`` alive.

    The cheapest buffer-protocol exporter the standard library offers (no copy): NumPy
    and torch take it as a buffer directly. ``nbytes`` must be at least 1.
    """
    arr = (_byte_arrays.get(nbytes) or _byte_array(nbytes)).from_address(ptr)
    arr._hb_owner = owner  # ctypes arrays take attributes
    return arr


def host_view(ptr: int, nbytes: int, owner: object, readonly: bool = False) -> memoryview:
    """A flat byte view of host memory that keeps ``owner`` alive as long as it lives."""
    if nbytes == 0:
        return memoryview(b"")
    arr = (_byte_arrays.get(nbytes) or _byte_array(nbytes)).from_address(ptr)
    arr._hb_owner = owner  # ctypes arrays take attributes
    # A c_ubyte array exports format "<B"; cast gives the plain "B" callers expect.
    view = memoryview(arr).cast("B")
    return view.toreadonly() if readonly else view


def aligned_zeros(shape: Sequence[int], dtype: Any) -> Any:
    """A zeroed NumPy array in fresh 64-byte aligned memory (none at all when empty).

    Memory the bridge allocates is 64-byte aligned (DESIGN.md), which is also what
    JAX needs to alias host memory instead of copying it again.
    """
    np = numpy()
    dt = np.dtype(dtype)
    n = prod(int(s) for s in shape)
    alloc = alloc_aligned(n * dt.itemsize)
    if alloc is None:
        return np.zeros(tuple(shape), dt)  # zero bytes: nothing is allocated
    return np.ndarray(tuple(shape), dt, buffer=host_view(alloc.ptr, alloc.nbytes, alloc))


class _PyBuffer(ctypes.Structure):
    # CPython's Py_buffer (Include/pybuffer.h); only ``buf`` and ``len`` are read.
    _fields_ = [
        ("buf", ctypes.c_void_p), ("obj", ctypes.py_object), ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p),
    ]


_api = ctypes.PyDLL(None, handle=ctypes.pythonapi._handle)
_GetBuffer = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(_PyBuffer),
                               ctypes.c_int)(("PyObject_GetBuffer", _api))
_ReleaseBuffer = ctypes.PYFUNCTYPE(None, ctypes.POINTER(_PyBuffer))(("PyBuffer_Release", _api))
_PyBUF_SIMPLE = 0

# The same address without ctypes (_speedups_c/tensor.c), or None where the compiled
# module was not built (or built before it had one).
_compiled_address: Callable[[Any], int] | None
try:
    from ._speedups import buffer_address as _compiled_address
except ImportError:
    _compiled_address = None


def buffer_address(obj: object) -> tuple[int, int, bool, memoryview]:
    """Address, length and read-only flag of any contiguous buffer-protocol object.

    Returns a memoryview that must be kept alive as long as the address is used:
    it holds the exporter's buffer (an mmap, for one, cannot close under it).
    """
    view = memoryview(obj)  # type: ignore[arg-type]
    if not view.contiguous:
        raise ValueError("buffer is not contiguous")
    view = view.cast("B") if view.ndim != 1 or view.format != "B" else view
    if view.nbytes == 0:
        return 0, 0, view.readonly, view
    if _compiled_address is not None:
        return _compiled_address(view), view.nbytes, view.readonly, view
    pb = _PyBuffer()
    _GetBuffer(view, ctypes.byref(pb), _PyBUF_SIMPLE)
    try:
        return int(pb.buf), int(pb.len), view.readonly, view
    finally:
        _ReleaseBuffer(ctypes.byref(pb))


def write_protected(owner: object) -> bool:
    """Whether the memory ``owner`` keeps alive must never be written, by anyone.

    Read-only memory is usually only flagged so: a write through a consumer that ignores
    the flag changes it for every view, which the consumer's notice says. Two kinds are
    worse, and a consumer that cannot mark its objects read-only must get a copy of them:
    pages mapped read-only (an ``mmap`` with ``ACCESS_READ``, ``np.memmap(mode="r")``),
    where a write kills the process, and the buffer of an immutable Python object
    (``bytes``, which may be shared or interned). Followed down the chain of owners that
    views keep (an ndarray's ``base``, a memoryview's ``obj``, an hb.Tensor's owner); a
    buffer object that says it is not mutable (``is_mutable`` False) counts too. The
    bridge's own maps of files are private (copy-on-write) and so are not protected.
    """
    o = owner
    for _ in range(32):  # views of views; a cycle cannot occur, the bound is a guard
        if isinstance(o, bytes):
            return True
        if isinstance(o, _mmap.mmap):
            try:
                with memoryview(o) as view:
                    return view.readonly
            except ValueError:  # closed: nothing left to write
                return False
        if isinstance(o, memoryview):
            o = o.obj
            continue
        if getattr(o, "is_mutable", True) is False:
            return True
        for link in _OWNER_LINKS:  # the first link this object has
            nxt = getattr(o, link, None)
            if nxt is not None:
                break
        else:
            return False
        o = nxt
    return False


# What a view keeps its memory's owner in: an ndarray's base, an hb.Tensor's owner, and
# the attribute this module's own ctypes arrays keep theirs in (host_array, host_view).
_OWNER_LINKS = ("base", "_owner", "_hb_owner")
